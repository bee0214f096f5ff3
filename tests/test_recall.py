"""recall returns the conversation, never itself (issue 9): not earlier recall or read_tool_result calls
and results, not summaries, placeholders or injected blocks, in new archives (not indexed) and old ones
(recognized when searched). Each hit names a handle read_tool_result accepts and shows its matching lines
with their line numbers. Real archive files, written by the real writer."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import orjson
from sqlite_utils import Database

from proxy import migrations
from proxy.archive import TableRow, insert_message, scope_of, utc_now
from proxy.archive_recall import CUT, LINE_CHARS
from proxy.internal_tools import format_hits
from proxy.reader import ArchiveReader
from proxy.state import StateStore
from tests.test_read_back import TENANT, call, read, record, write

NEEDLE = "ERR_QUOTA_7731"
OUTPUT = "\n".join([*(f"worker {i}: ok" for i in range(1, 137)), f"worker 137: failed with {NEEDLE} (quota)",
                    *(f"worker {i}: ok" for i in range(138, 300))])
TASK = [{"role": "system", "content": "You are an ops agent."},
        {"role": "user", "content": "Why did the batch fail?"},
        {"role": "assistant", "content": None, "tool_calls": [call("call_logs", "bash", '{"cmd": "logs"}')]},
        {"role": "tool", "tool_call_id": "call_logs", "content": OUTPUT}]
RECALL = call("int_r", "recall", orjson.dumps({"query": NEEDLE}).decode())
READ = call("int_b", "read_tool_result", '{"call_id": "call_logs"}')
SUMMARY = f"[ctxproxy summary of tool result call_id=call_logs from bash: 300 lines]\nfailed: {NEEDLE}"
BLOCK = f"[ctxproxy auto-summary: 3 earlier exchanges]\n- ran logs: {NEEDLE}"


def conversation_with_its_own_traffic(path: Path) -> None:
    """What the server archives for a session that recalled and read back twice (see rounds.py): the
    client's messages, each round's forwarded messages (summary, blocks, internal calls and results),
    and each round's answer."""
    forwarded = [TASK[0], {"role": "system", "content": BLOCK}, *TASK[1:3],
                 {"role": "tool", "tool_call_id": "call_logs", "content": SUMMARY},
                 {"role": "user", "content": "[WORKING MEMORY]\n- quota " + NEEDLE}]
    recalled = {"role": "tool", "tool_call_id": "int_r",
                "content": f"recall '{NEEDLE}': 1 match, best first.\n"
                           f"1. [this session, tool] worker 137: failed with {NEEDLE}"}
    read_back = {"role": "tool", "tool_call_id": "int_b", "content": OUTPUT}
    internal_turn = {"role": "assistant", "content": f"Looking up {NEEDLE}.", "tool_calls": [RECALL, READ]}
    rounds = [*forwarded, internal_turn, recalled, read_back]
    final = {"role": "assistant", "content": f"The batch hit {NEEDLE} on worker 137."}
    write(path,
          record(1, TASK, forwarded=forwarded, response=internal_turn),
          record(2, TASK, forwarded=rounds, response=final),
          record(3, [*TASK, final, {"role": "user", "content": f"/recall {NEEDLE}"}],
                 response={"role": "assistant", "content": f"recall '{NEEDLE}': 2 matches, best first."}))


def texts(hits: list[dict]) -> list[str]:
    return [orjson.loads(hit["body"]).get("content") or "" for hit in hits]


def test_recall_returns_the_conversation_not_itself(tmp_path):
    path = tmp_path / "archive.db"
    conversation_with_its_own_traffic(path)
    reader = ArchiveReader(path)
    hits = reader.recall(TENANT, "s1", "default", NEEDLE, 8)
    assert sorted(hit["role"] for hit in hits) == ["assistant", "tool"]  # the answer and the log, once each
    assert texts(hits).count(OUTPUT) == 1
    for text in texts(hits):
        assert not text.startswith(("[ctxproxy", "recall '", "[WORKING MEMORY]", "/recall"))
    answer = format_hits(NEEDLE, hits, "s1", 24_000)
    assert "Looking up" not in answer and "int_r" not in answer and "int_b" not in answer
    reader.close()


def test_hits_name_a_handle_read_tool_result_accepts_and_show_numbered_lines(tmp_path):
    path = tmp_path / "archive.db"
    conversation_with_its_own_traffic(path)
    reader = ArchiveReader(path)
    store = StateStore(lookup=reader)
    hits = reader.recall(TENANT, "s1", "default", NEEDLE, 8)
    log = next(hit for hit in hits if hit["role"] == "tool")
    assert log["handle"] == "call_logs" and log["line_count"] == 299
    assert log["lines"] == [[137, f"worker 137: failed with {NEEDLE} (quota)"]]
    answer = format_hits(NEEDLE, hits, "s1", 24_000)
    assert 'call_id="call_logs"' in answer and f"line 137: worker 137: failed with {NEEDLE}" in answer
    for hit in hits:  # every handle reads its whole message back, and the shown lines are its lines
        whole = read(store, hit["handle"])
        assert not whole.startswith("error"), hit["handle"]
        for number, text in hit["lines"]:
            assert whole.split("\n")[number - 1] == text
    around = read(store, "call_logs", start_line=136, end_line=138)
    assert f"worker 137: failed with {NEEDLE}" in around and "worker 138" in around
    reader.close()


def test_a_turn_that_called_a_client_tool_and_an_internal_one_is_still_found(tmp_path):
    path = tmp_path / "archive.db"
    mixed = {"role": "assistant", "content": "Checking the quota dashboard.",
             "tool_calls": [call("call_dash", "browser", '{"url": "dash/quota"}'), RECALL]}
    write(path, record(1, TASK[:2], response=mixed))
    reader = ArchiveReader(path)
    [hit] = reader.recall(TENANT, "s1", "default", "quota dashboard", 8)
    assert hit["role"] == "assistant" and hit["lines"][0][1] == "Checking the quota dashboard."
    assert reader.recall(TENANT, "s1", "default", NEEDLE, 8) == []  # the internal call's text is not indexed
    reader.close()


def test_rows_archived_before_the_proxy_told_its_traffic_apart_are_left_out(tmp_path):
    """An archive from before migration m010 indexed every message: the guard recognizes ours."""
    path = tmp_path / "archive.db"
    db = Database(sqlite3.connect(path))
    migrations.migrations.apply(db, stop_before="m010_own_traffic_and_read_back")
    internal_turn = {"role": "assistant", "content": "Let me look.", "tool_calls": [RECALL]}
    mixed = {"role": "assistant", "content": "Opening the dashboard.",
             "tool_calls": [call("call_dash", "browser", '{"url": "dash"}'), RECALL]}
    chain = [*TASK, {"role": "user", "content": f"about {NEEDLE}?"}, internal_turn,
             {"role": "tool", "tool_call_id": "int_r", "content": f"worker 137: failed with {NEEDLE}"}, mixed,
             {"role": "tool", "tool_call_id": "call_logs", "content": SUMMARY},
             {"role": "user", "content": f"recall '{NEEDLE}': 3 matches, best first."}]
    parent, scope = "tenant:acme", scope_of(TENANT, "s1", "default")
    for index, message in enumerate(chain):  # as the writer stored them then: everything indexed
        node, body = f"m{index:02d}", orjson.dumps(message).decode()
        db.conn.execute("insert into messages (id, parent_id, tenant, session_id, policy, role, body, "
                        "created_at, call_id, size) values (?, ?, ?, 's1', 'default', ?, ?, ?, ?, ?)",
                        [node, parent, TENANT, message["role"], body, utc_now(),
                         message.get("tool_call_id") or (message.get("tool_calls") or [{}])[0].get("id"),
                         len(body)])
        text = "\n".join([message.get("content") or "", *(
            f"{c['function']['name']}({c['function']['arguments']})" for c in message.get("tool_calls", []))])
        db.conn.execute("insert into message_chunks_fts (message_id, scope, text) values (?, ?, ?)",
                        [node, scope, text])
        parent = node
    db.conn.commit()
    migrations.apply(db)
    db.close()
    reader = ArchiveReader(path)
    hits = reader.recall(TENANT, "s1", "default", NEEDLE, 8)
    assert sorted(hit["id"] for hit in hits) == ["m03", "m04"]  # the original log and the user's question
    assert reader.recall(TENANT, "s1", "default", "dashboard", 8)[0]["id"] == "m07"
    store = StateStore(lookup=reader)
    assert read(store, "call_logs") == OUTPUT  # not the summary forwarded in its place
    assert "no stored tool result" in read(store, "int_r")
    reader.close()


def test_long_lines_are_clipped_around_the_match_and_deep_lines_keep_their_numbers(tmp_path):
    path = tmp_path / "archive.db"
    wide = "x" * 3000 + f" {NEEDLE} " + "y" * 3000
    deep = "\n".join([*(f"line {i} of the build log, nothing to see" for i in range(1, 2000)), wide])
    write(path, record(1, [{"role": "user", "content": "build"},
                           {"role": "assistant", "content": None, "tool_calls": [call("call_deep")]},
                           {"role": "tool", "tool_call_id": "call_deep", "content": deep}]))
    reader = ArchiveReader(path)
    [hit] = reader.recall(TENANT, "s1", "default", NEEDLE, 8)
    [[number, text]] = hit["lines"]
    assert number == 2000 and NEEDLE in text
    assert text.startswith(CUT) and text.endswith(CUT) and len(text) <= LINE_CHARS + 2 * len(CUT)
    store = StateStore(lookup=reader)
    assert read(store, hit["handle"], start_line=2000) .endswith(wide)
    reader.close()


def test_an_observation_hit_names_the_handle_it_was_stored_under(tmp_path):
    path = tmp_path / "archive.db"
    observation = f"<returncode>1</returncode>\n<output>\nfailed with {NEEDLE}\n</output>"
    write(path, record(1, [{"role": "user", "content": "fix it"}, {"role": "assistant", "content": "run"},
                           {"role": "user", "content": observation}]),
          TableRow("tool_results", {
              "tenant": TENANT, "session_id": "s1", "handle": "obs-00aa11bb22cc",
              "call_id": "obs-00aa11bb22cc",
              "content_hash": hashlib.sha256(observation.encode()).hexdigest(), "tool_name": None,
              "content": observation, "replacement": "", "kind": "evicted", "created_at": utc_now()}))
    reader = ArchiveReader(path)
    [hit] = reader.recall(TENANT, "s1", "default", NEEDLE, 8)
    assert hit["handle"] == "obs-00aa11bb22cc" and hit["lines"] == [[3, f"failed with {NEEDLE}"]]
    [other] = reader.recall(TENANT, "s2", "default", NEEDLE, 8)  # from another session: by message
    assert other["handle"].startswith("msg-")
    store = StateStore(lookup=reader)
    assert read(store, other["handle"], session="s2") == observation
    assert "no stored tool result" in read(store, other["handle"], tenant="globex")
    reader.close()


def test_the_answer_fits_page_chars(tmp_path):
    path = tmp_path / "archive.db"
    messages = [{"role": "user", "content": f"{NEEDLE} case {n}: " + "detail " * 60} for n in range(20)]
    write(path, record(1, messages))
    reader = ArchiveReader(path)
    hits = reader.recall(TENANT, "s1", "default", NEEDLE, 20)
    assert len(hits) == 20
    for limit in (400, 1000, 3000):
        answer = format_hits(NEEDLE, hits, "s1", limit)
        assert len(answer) <= limit and "left out to fit" in answer
    reader.close()


def test_insert_message_keeps_chunk_lines_for_long_messages(tmp_path):
    db = Database(sqlite3.connect(tmp_path / "a.db"))
    migrations.apply(db)
    text = "\n".join(f"row {i}" for i in range(5000))
    message = {"role": "tool", "tool_call_id": "c", "content": text}
    insert_message(db.conn, "m1", None, message, orjson.dumps(message), tenant="t", session_id="s",
                   policy="default", created_at=utc_now())
    [(first, starts)] = db.execute("select first_chunk, starts from message_chunk_lines").fetchall()
    chunks = db.execute("select rowid, text from message_chunks_fts order by rowid").fetchall()
    assert first == chunks[0][0] and len(orjson.loads(starts)) == len(chunks) > 1
    for (_, chunk), start in zip(chunks, orjson.loads(starts), strict=True):
        assert text.split("\n")[start - 1].startswith(chunk.split("\n")[0])
