"""PostgresReader answers what ArchiveReader answers (issue 13): the same items, written by the real
writer to a SQLite archive and to a real PostgreSQL database, read back through both readers and
compared: recall hits (handles, numbered lines, snippets, scoping, order where the ranking is clear),
read-back, state lookups, conversations and the report's figures. Searches past their deadline return
what they have, marked truncated, never an exception."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import orjson
import psycopg
import pytest

from proxy import report
from proxy.archive import ArchiveWriter, ExchangeRecord, TableRow, utc_now
from proxy.archive_recall import CUT, LINE_CHARS
from proxy.internal_tools import format_hits
from proxy.reader import ArchiveReader
from proxy.state import StateStore
from proxy.store.postgres import PostgresTarget
from proxy.store.postgres_reader import PostgresReader
from proxy.ui import exchange as exchange_page
from proxy.ui import search as search_page
from proxy.ui.sessions import session_info
from tests import test_recall
from tests.test_read_back import TENANT, call, read, record
from tests.test_recall import NEEDLE, OUTPUT, RECALL, TASK

Item = ExchangeRecord | TableRow


@dataclass
class Pair:
    sqlite: ArchiveReader
    postgres: PostgresReader

    def both(self) -> tuple[ArchiveReader, PostgresReader]:
        return self.sqlite, self.postgres

    def same(self, ask: Callable[[Any], Any]) -> Any:
        """What both readers answer, asserted equal."""
        expected, got = ask(self.sqlite), ask(self.postgres)
        assert got == expected
        return got


@pytest.fixture
def archives(tmp_path: Path, postgres_url: str) -> Iterator[Callable[..., Pair]]:
    """write(*items) -> Pair: the items through ArchiveWriter into SQLite and into PostgreSQL (each call
    adds to the same two archives), and a reader on each."""
    opened: list[Pair] = []

    def write(*items: Item, **options: Any) -> Pair:
        sqlite_path = tmp_path / "sqlite" / "archive.db"
        writers = [ArchiveWriter(sqlite_path),
                   ArchiveWriter(tmp_path / "pg" / "archive.db", target=lambda: PostgresTarget(postgres_url))]
        for writer in writers:
            for item in items:
                writer.submit(item)
            writer.close()
        pair = Pair(ArchiveReader(sqlite_path, **options), PostgresReader(postgres_url, **options))
        opened.append(pair)
        return pair

    yield write
    for pair in opened:
        for reader in pair.both():
            reader.close()


def without_rank(hits: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in hit.items() if k != "rank"} for hit in hits]


def ids(hits: list[dict[str, Any]]) -> list[str]:
    return [hit["id"] for hit in hits]


def user(n: int, text: str, *, tenant: str = TENANT, session: str = "s1", policy: str = "default",
         model: str = "gpt-4o") -> ExchangeRecord:
    item = record(n, [{"role": "user", "content": text}], tenant=tenant, session=session)
    item.policy, item.model = policy, model
    return item


def test_recall_returns_the_conversation_with_the_same_hits_lines_and_handles(archives, monkeypatch):
    items: list[Item] = []
    monkeypatch.setattr(test_recall, "write", lambda path, *records: items.extend(records))
    test_recall.conversation_with_its_own_traffic(Path("unused"))
    pair = archives(*items)
    hits = pair.same(lambda r: without_rank(r.recall(TENANT, "s1", "default", NEEDLE, 8)))
    # The answer and the log, once each: no summary, block, recall answer or internal call.
    assert sorted(hit["role"] for hit in hits) == ["assistant", "tool"]
    log = next(hit for hit in hits if hit["role"] == "tool")
    assert log["handle"] == "call_logs" and log["line_count"] == 299
    assert log["lines"] == [[137, f"worker 137: failed with {NEEDLE} (quota)"]]
    assert log["snippet"] == f"worker 137: failed with [{NEEDLE}] (quota)"
    pair.same(lambda r: format_hits(NEEDLE, r.recall(TENANT, "s1", "default", NEEDLE, 8), "s1", 24_000))
    for hit in hits:  # every handle reads its whole message back, the same on both
        whole = pair.same(lambda r, hit=hit: read(StateStore(lookup=r), hit["handle"]))
        for number, text in hit["lines"]:
            assert whole.split("\n")[number - 1] == text
    assert read(StateStore(lookup=pair.postgres), "call_logs") == OUTPUT


def test_internal_calls_and_the_proxys_results_are_never_hits(archives):
    mixed = {"role": "assistant", "content": "Checking the quota dashboard.",
             "tool_calls": [call("call_dash", "browser", '{"url": "dash", "panel": "quota"}'), RECALL]}
    internal = {"role": "assistant", "content": None,
                "tool_calls": [call("int_1", "recall", '{"query": "k"}')]}
    rounds = [*TASK[:2], internal, {"role": "tool", "tool_call_id": "int_1", "content": f"found {NEEDLE}"}]
    pair = archives(record(1, TASK[:2], response=mixed), record(2, TASK[:2], forwarded=rounds))
    [hit] = pair.same(lambda r: without_rank(r.recall(TENANT, "s1", "default", "quota dashboard", 8)))
    assert hit["role"] == "assistant" and hit["lines"] == [
        [1, "Checking the quota dashboard."], [2, 'browser({"url": "dash", "panel": "quota"})']]
    assert pair.same(lambda r: r.recall(TENANT, "s1", "default", NEEDLE, 8)) == []
    assert "no stored tool result" in pair.same(lambda r: read(StateStore(lookup=r), "int_1"))


def test_scoping_by_tenant_session_and_project_is_sqlites(archives):
    pair = archives(
        user(1, "deploy of the api failed"), user(2, "deploy rollback done"),
        user(3, "deploy in another session", session="s2"),
        user(4, "deploy under another policy", session="s3", policy="strict"),
        user(5, "globex deploy secret", tenant="globex"),  # the same session name, another key
        user(6, "globex deploy in g2", tenant="globex", session="g2"))

    def found(**scope: Any) -> list[tuple[str, str]]:
        return pair.same(lambda r: sorted((h["session_id"], h["id"]) for h in r.search("deploy", **scope)))

    assert len(found()) == 6
    assert {s for s, _ in found(tenant="globex")} == {"s1", "g2"}
    assert len(found(session_id="s1")) == 3  # no tenant given: both keys' s1
    assert {s for s, _ in found(tenant=TENANT, session_id="s1")} == {"s1"} and len(found(tenant=TENANT,
                                                                                       session_id="s1")) == 2
    assert {s for s, _ in found(tenant=TENANT, policy="default")} == {"s1", "s2"}
    assert {s for s, _ in found(tenant=TENANT, policy="default", exclude_session="s1")} == {"s2"}
    sessions = pair.same(lambda r: [h["session_id"] for h in r.recall(TENANT, "s1", "default", "deploy")])
    assert sessions == ["s1", "s1", "s2"]  # this session first, then the project; never globex nor strict
    assert pair.same(lambda r: [h["session_id"] for h in r.recall("globex", "s1", "default", "deploy")]) \
        == ["s1", "g2"]
    assert pair.same(lambda r: r.recall("initech", "s1", "default", "deploy")) == []
    handles = pair.same(lambda r: [h["handle"] for h in r.recall(TENANT, "s2", "default", "rollback")])
    assert len(handles) == 1 and handles[0].startswith("msg-")  # from another session: by message


def test_clearly_ranked_hits_come_in_the_same_order(archives):
    """Where bm25 ranks clearly (more of the query's words, more often, in less text), ts_rank agrees."""
    filler = " ".join(f"word{n}" for n in range(300))
    texts = {"once_in_long": f"{filler} kubernetes {filler}",
             "thrice_short": "kubernetes pod crash: kubernetes restarted the kubernetes node",
             "no_match": "nothing to see here", "loop_long": f"the pod is in a crash loop {filler}",
             "pod_long": f"{filler} one pod {filler}", "all_three": "pod crash loop again",
             "loop_short": "a loop in the code", "rare_and_common": "the zygote failed",
             "common_only": "failed failed failed build failed test failed"}
    pair = archives(*(user(n, text) for n, text in enumerate(texts.values())))
    name = {text: key for key, text in texts.items()}

    def order(query: str) -> list[str]:
        return pair.same(lambda r: [name[orjson.loads(hit["body"])["content"]] for hit in r.search(query)])

    assert order("kubernetes") == ["thrice_short", "once_in_long"]
    assert order("crash") == ["all_three", "thrice_short", "loop_long"]
    assert order("pod crash loop") == ["all_three", "thrice_short", "loop_short", "loop_long", "pod_long"]
    assert order("zygote failed") == ["rare_and_common", "common_only"]


def test_a_long_result_in_several_chunks_names_the_line_of_its_hit(archives):
    build = "\n".join(f"step {i}: compiled module_{i} in {i * 7} ms, cache warm" for i in range(1, 500))
    build = build.replace("step 377: compiled", "step 377: linker error LNK2019 unresolved in")
    wide = "x" * 3000 + f" {NEEDLE} " + "y" * 3000  # one line longer than a chunk
    deep = "\n".join([*(f"line {i} of the build log, nothing to see" for i in range(1, 300)), wide, "end"])
    # A line of 4,200 characters cut at a space into two chunks; the match in the second one's short part.
    tail = "\n".join(["words " * 690 + "then ZX_81_FAULT here", "next line"])
    results = {"call_build": build, "call_deep": deep, "call_tail": tail}
    pair = archives(record(1, [{"role": "user", "content": "build"}, *(
        message for call_id, content in results.items() for message in (
            {"role": "assistant", "content": None, "tool_calls": [call(call_id)]},
            {"role": "tool", "tool_call_id": call_id, "content": content}))]))
    [chunks] = pair.postgres.rows("select count(*) as n from message_chunks c join messages m "
                                  "on m.id = c.message_id where m.call_id = ?", ["call_build"])
    assert len(build) > 20_000 and chunks["n"] >= 5
    [hit] = pair.same(lambda r: without_rank(r.recall(TENANT, "s1", "default", "LNK2019", 8)))
    assert hit["handle"] == "call_build" and hit["line_count"] == 499
    assert hit["lines"] == [[377, "step 377: linker error LNK2019 unresolved in module_377 in 2639 ms, "
                                  "cache warm"]]
    store = StateStore(lookup=pair.postgres)
    assert hit["lines"][0][1] + "\n" in read(store, "call_build", start_line=377, end_line=377)
    [hit] = pair.same(lambda r: without_rank(r.recall(TENANT, "s1", "default", NEEDLE, 8)))
    [[number, text]] = hit["lines"]
    assert number == 300 and NEEDLE in text  # clipped around the match, marked as cut where cut
    assert text.startswith(CUT) and text.endswith(CUT) and len(text) <= LINE_CHARS + 2 * len(CUT)
    [hit] = pair.same(lambda r: without_rank(r.recall(TENANT, "s1", "default", "ZX_81_FAULT", 8)))
    [[number, text]] = hit["lines"]  # the chunk starts inside line 1: shown as cut, not clipped
    assert number == 1 and text.startswith(CUT) and text.endswith("then ZX_81_FAULT here") and len(text) < 120


def test_read_back_by_call_id_numbered_reuse_and_message_handle_is_sqlites(archives):
    first = [{"role": "user", "content": "go"},
             {"role": "assistant", "content": None, "tool_calls": [call("call_0")]},
             {"role": "tool", "tool_call_id": "call_0", "content": "first output"}]
    second = [*first, {"role": "assistant", "content": None, "tool_calls": [call("call_0")]},
              {"role": "tool", "tool_call_id": "call_0", "content": "second output"}]
    summary = {"role": "tool", "tool_call_id": "call_0",
               "content": "[ctxproxy summary of tool result call_id=call_0: ...]\nfirst"}
    forwarded = [first[0], first[1], summary, *second[3:]]
    pair = archives(record(1, first), record(2, second, forwarded=forwarded),
                    record(3, [*second, *second[3:]]), record(4, first, tenant="globex"))
    [message] = pair.same(lambda r: r.rows("select id from messages where tenant = ? and body like ? "
                                           "order by rowid limit 1", [TENANT, '%second output%']))
    handle = f"msg-{message['id'][:16]}"
    asked = [(TENANT, "s1", "call_0"), (TENANT, "s1", "call_0#2"), (TENANT, "s1", "call_0#3"),
             (TENANT, None, "call_0#2"), (TENANT, "s9", "call_0"), ("globex", "s1", "call_0#2"),
             (TENANT, "s1", handle), ("globex", "s1", handle), (TENANT, "s1", handle.upper()),
             (TENANT, "s1", handle[:-1]), (TENANT, "s1", "msg-zz" + handle[6:])]
    for tenant, session, name in asked:
        pair.same(lambda r, t=tenant, s=session, n=name: r.archived_result(t, s, n))
    assert pair.postgres.archived_result(TENANT, "s1", "call_0#2")["content"] == "second output"
    assert pair.postgres.archived_result(TENANT, "s1", handle)["content"] == "second output"
    assert pair.postgres.archived_result("globex", "s1", handle) is None
    assert pair.postgres.archived_result(TENANT, "s1", "call_0#3") is None


def test_state_lookups_return_the_same_rows(archives):
    def result(handle: str, content: str, created_at: str) -> TableRow:
        return TableRow("tool_results", {
            "tenant": TENANT, "session_id": "s1", "handle": handle, "call_id": handle,
            "content_hash": hashlib.sha256(content.encode()).hexdigest(), "tool_name": "bash",
            "content": content, "replacement": f"summary of {handle}", "kind": "summary",
            "created_at": created_at})

    pair = archives(
        result("call_b", "bbb", "2026-01-02T00:00:00+00:00"),
        result("call_a", "aaa", "2026-01-01T00:00:00+00:00"),
        TableRow("session_windows", {"tenant": TENANT, "session_id": "s1", "cut": 7, "last_evicted": "[]",
                                     "headlines": "[]", "block": "earlier", "updated_at": utc_now()}),
        TableRow("session_memory", {"tenant": TENANT, "session_id": "s1", "kind": "working",
                                    "data": '{"entities": []}', "updated_at": utc_now()}))
    rows = pair.same(lambda r: r.tool_result_rows(TENANT, "s1"))
    assert [row["handle"] for row in rows] == ["call_a", "call_b"] and "rowid" not in rows[0]
    assert pair.same(lambda r: r.tool_result_by_handle(TENANT, "call_b"))["content"] == "bbb"
    assert pair.same(lambda r: r.tool_result_by_handle("globex", "call_b")) is None
    assert pair.same(lambda r: r.session_window(TENANT, "s1"))["cut"] == 7
    assert pair.same(lambda r: r.session_memory(TENANT, "s1", "working"))["data"] == '{"entities": []}'
    assert pair.same(lambda r: r.session_memory(TENANT, "s1", "folded")) is None
    # An explicit rowid is a column on both.
    assert pair.same(lambda r: [row["handle"] for row in r.rows(
        "select rowid, handle from tool_results order by rowid")]) == ["call_b", "call_a"]
    state = StateStore(lookup=pair.postgres).get(TENANT, "s1")
    assert state.by_handle["call_a"].content == "aaa" and state.window.cut == 7


def test_conversations_sessions_and_report_figures_are_equal(archives):
    usage = {"prompt_tokens": 1200, "completion_tokens": 80, "prompt_tokens_details": {"cached_tokens": 200}}

    def answered(n: int, session: str, model: str, policy: str = "default",
                 status: int = 200) -> ExchangeRecord:
        item = user(n, f"question {n}", session=session, model=model, policy=policy)
        item.created_at = f"2026-11-0{n}T1{n}:00:00.000+00:00"  # days and hours of their own
        item.status, item.tokens_before, item.tokens_after = status, 1500 + n, 1200
        item.upstream_ms, item.overhead_ms, item.summaries = 10.5 * n, 1.25 * n, n % 2
        item.route = "messages" if n == 4 else item.route
        answer = {"choices": [{"message": {"role": "assistant", "content": f"a{n}"}}], "usage": usage}
        item.response_body = orjson.dumps(answer) if status == 200 else b'{"error": "boom"}'
        return item

    pair = archives(answered(1, "s1", "gpt-4o"), answered(2, "s1", "gpt-4o-mini"),
                    answered(3, "s2", "gpt-4o"), answered(4, "s3", "claude-sonnet-4-5", policy="strict"),
                    answered(5, "s3", "gpt-4o", status=500))
    totals = pair.same(lambda r: report.totals(r))
    assert totals["requests"] == 5 and totals["tokens_client"] == 1500 * 5 + 15 and totals["spent_usd"] > 0
    assert pair.same(lambda r: report.render([report.totals(r)], "json"))
    for by in report.GROUPS:
        for order in ("last", "spent_usd", "saved_usd", "requests", "key"):
            sqlite, postgres = (report.grouped(r, by, order=order) for r in pair.both())
            assert len(postgres) > 1 and all(isinstance(row["requests"], int) for row in postgres)
            assert [row[order] for row in postgres] == [row[order] for row in sqlite]  # the same order
            assert sorted(postgres, key=str) == sorted(sqlite, key=str)  # (rows that tie in any order)
            assert report.render(sorted(postgres, key=str), "json", by) == report.render(
                sorted(sqlite, key=str), "json", by)
    filters = report.Filters(policy="default", since="2026-11-02")
    assert len(pair.same(lambda r: report.grouped(r, "session", filters, limit=2, order="key"))) == 2
    # group_concat(distinct ...): the same values; SQLite lists them as met, PostgreSQL sorted.
    info = pair.same(lambda r: {session: {key: set(value.split(",")) for key, value in fields.items()}
                                for session, fields in session_info(r, ["s1", "s2", "s3"]).items()})
    assert info["s3"] == {"policy": {"default", "strict"}, "model": {"claude-sonnet-4-5", "gpt-4o"},
                          "source": {"header"}}
    pair.same(lambda r: [row | {"policies": set(row["policies"].split(","))} for row in r.sessions()])
    for session in ("s1", "s3", "nope"):
        pair.same(lambda r, s=session: r.exchanges(s))
        pair.same(lambda r, s=session: r.conversation(s))
    assert pair.postgres.conversation("s1")[-1] == {"role": "assistant", "content": "a2"}
    # Dashboard pages that read the archive directly render the same.
    exchange_ids = pair.same(lambda r: [row["id"] for row in r.rows("select id from exchanges order by id")])
    for exchange_id in exchange_ids:
        path = {"exchange_id": exchange_id}
        pair.same(lambda r, p=path: exchange_page.build(SimpleNamespace(reader=r), p, {}))
    for session in ("s1", "s3"):
        query = {"q": "question", "session": session}
        pair.same(lambda r, q=query: search_page.build(SimpleNamespace(reader=r), {}, q))
    leaf = pair.postgres.exchanges("s1")[0]["request_leaf"]
    assert pair.same(lambda r: r.chain(leaf)) == [{"role": "user", "content": "question 1"}]


def test_user_text_is_never_query_syntax(archives):
    pair = archives(user(1, "the deploy of api-v2 failed"), user(2, "rollback done"))
    for query in ("deploy & !(x:*", "'deploy' \"deploy\" \\ <-> <2> deploy:*", "DEPLOY!!!"):
        lines = pair.same(lambda r, q=query: [h["lines"] for h in r.search(q)])
        assert lines == [[[1, "the deploy of api-v2 failed"]]]
    for query in ("&|!():*<->", "", "   "):
        assert pair.same(lambda r, q=query: r.search(q)) == []


def test_a_search_past_its_deadline_returns_what_it_has_marked_truncated(archives, postgres_url):
    pair = archives(user(1, "timeout in step one"), user(2, "timeout in step two", session="s2"))
    pair.postgres.search_timeout = 0.0  # the deadline has passed before the first statement
    hits = pair.postgres.recall(TENANT, "s1", "default", "timeout", 8)
    assert hits.truncated and list(hits) == []
    assert "stopped at its time limit" in format_hits("timeout", hits, "s1", 10_000)
    pair.postgres.search_timeout = 30.0
    assert pair.postgres.recall(TENANT, "s1", "default", "timeout").complete
    # A statement the server is still running when the time is up is cancelled (statement_timeout):
    # here the ranking waits on a lock another session holds for as long as it likes.
    done: list[Any] = []
    with psycopg.connect(postgres_url) as locker:
        locker.execute("lock table message_chunks in access exclusive mode")
        started = time.monotonic()
        searching = threading.Thread(target=lambda: done.append(
            pair.postgres.recall(TENANT, "s1", "default", "timeout", 8, timeout=0.5)), daemon=True)
        searching.start()
        searching.join(15)
        elapsed = time.monotonic() - started
        locker.rollback()
    assert done, "the search did not return while the lock was held"
    assert done[0].truncated and list(done[0]) == [] and elapsed < 5
    assert len(pair.postgres.recall(TENANT, "s1", "default", "timeout", 8)) == 2  # usable afterwards


def test_lookups_never_wait_behind_a_running_search(archives):
    searching, looked_up = threading.Event(), threading.Event()
    waited: list[bool] = []

    def inside_the_search() -> None:  # runs on the searching thread, between its statements
        if not searching.is_set():
            searching.set()
            waited.append(looked_up.wait(20))  # holds the search (and its connection) until lookups ran

    stored = TableRow("tool_results", {
        "tenant": TENANT, "session_id": "s1", "handle": "call_x", "call_id": "call_x", "content_hash": "x",
        "tool_name": "sh", "content": "original", "replacement": "s", "kind": "summary",
        "created_at": utc_now()})
    pair = archives(user(1, "timeout here"), stored, search_timeout=60.0, on_progress=inside_the_search)
    found: list[Any] = []

    def lookups() -> None:
        assert searching.wait(20)
        found.append(pair.postgres.tool_result_rows(TENANT, "s1"))
        found.append(pair.postgres.sessions())
        looked_up.set()

    thread = threading.Thread(target=lookups, daemon=True)
    thread.start()
    hits = pair.postgres.recall(TENANT, "s1", "default", "timeout", 8)
    thread.join(20)
    assert waited == [True], "a lookup waited behind the search"
    assert found[0][0]["handle"] == "call_x" and len(found[1]) == 1 and hits.complete and len(hits) == 1


def test_lookups_and_searches_survive_the_servers_dropping_their_connections(archives, postgres_url):
    pair = archives(user(1, "before the restart"))
    assert len(pair.postgres.search("restart")) == 1
    with psycopg.connect(postgres_url, autocommit=True) as admin:  # as a database restart or failover does
        [dropped] = admin.execute(
            "select count(*) filter (where pg_terminate_backend(pid, 10000)) from pg_stat_activity "
            "where application_name = 'ctxproxy-reader' and datname = current_database()").fetchone()
    assert dropped >= 1
    assert pair.same(lambda r: r.sessions())[0]["turns"] == 1
    assert len(pair.postgres.search("restart")) == 1


def test_a_reader_is_built_before_its_database_exists(postgres_server, postgres_url, tmp_path):
    name = urlsplit(postgres_url).path.strip("/") + "_later"
    url = postgres_server.url(name)
    reader = PostgresReader(url)  # connects on first use, not here
    try:
        postgres_server.create_database(name)
        writer = ArchiveWriter(tmp_path / "archive.db", target=lambda: PostgresTarget(url))
        writer.submit(user(1, "written after the reader was built"))
        writer.close()
        assert [h["session_id"] for h in reader.recall(TENANT, "s1", "default", "written")] == ["s1"]
    finally:
        reader.close()
        postgres_server.drop_database(name)


def test_a_word_inside_a_path_is_found_as_on_sqlite(archives):
    pair = archives(user(1, "edit proxy/store/reader.py and config.yaml on worker-3"))
    for word in ("reader", "yaml", "3"):
        assert len(pair.same(lambda r, w=word: ids(r.search(w)))) == 1
