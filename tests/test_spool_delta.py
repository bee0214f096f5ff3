"""Exchanges spooled relative to their session's previous record (proxy/spool_delta.py): a resent history
is written to the spool once, every record comes back whole from a replay after kill -9, and records a
marker says were committed are not written again over newer rows."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from hypothesis import event, given, settings
from hypothesis import strategies as st

from proxy.archive import ArchiveWriter, ExchangeRecord, encode_item, open_database, utc_now
from proxy.reader import ArchiveReader
from proxy.spool import Spool, replay_file
from proxy.spool_delta import IDLE_SECONDS, Bases, Expander
from tests.test_archive_durability import Blocker, count

ROOT = Path(__file__).resolve().parent.parent


def record(n: int, session: str, request: list[Any], forwarded: list[Any] | None = None,
           params: dict[str, Any] | None = None) -> ExchangeRecord:
    return ExchangeRecord(
        id=f"ex-{n}", created_at=utc_now(), session_id=session, session_source="header", tenant="t",
        policy="default", route="chat/completions", model="m", stream=False, request_messages=request,
        forwarded_messages=forwarded, params={} if params is None else params, status=200,
        response_body=b'{"choices":[]}')


TOOLS = [{"name": "Bash", "input_schema": {"type": "object"}}]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 12), st.booleans(), st.booleans(),
                          st.sampled_from([1, 1.0, True, "1"]), st.sampled_from([None, 40, 400]),
                          st.sampled_from(["same objects", "equal copy", "other", "fewer keys"])),
                min_size=1, max_size=25))
def test_every_record_comes_back_whole_from_the_spool(tmp_path_factory, steps):
    """Any mix of sessions growing, restarting (an edited history) or rewritten (forwarded lists whose
    block is made anew every time: equal to the last one, or equal but written differently, 1 / 1.0 /
    True; tried first as the event loop would, for a small relative record only), their params the very
    objects of the last record's, equal ones or others: what the spool holds, made whole in file order,
    is each record as submitted, byte for byte."""
    spool = Spool(tmp_path_factory.mktemp("spool"))
    bases = Bases(min_base_bytes=0)
    histories: dict[int, list[dict[str, Any]]] = {}
    submitted, payloads = [], []
    for n, (session, grow, edit, rewrite, flavour, small_only, params_kind) in enumerate(steps):
        params = {"same objects": {"tools": TOOLS, "max_tokens": 100},
                  "equal copy": {"tools": [dict(TOOLS[0])], "max_tokens": 100},
                  "other": {"tools": TOOLS, "max_tokens": n},
                  "fewer keys": {"tools": TOOLS}}[params_kind]
        history = histories.get(session, [])
        if edit and history:
            history = [{"role": "system", "content": f"edited {n}"}, *history[1:]]
        history = history + [{"role": "user", "content": f"s{session} m{n}.{k}"} for k in range(grow + 1)]
        histories[session] = history
        forwarded = [{"role": "system", "content": "block", "n": flavour}, *history[-3:]] if rewrite else None
        item = record(n, f"s{session}", history, forwarded, params)
        small = bases.encode(item, spool, small_only=small_only) if small_only else None
        if small is not None:
            assert len(small) < len(encode_item(item))  # relative
            event("small and relative")
        payloads.append(small or bases.encode(item, spool))
        spool.append(payloads[-1])
        submitted.append(item)
    spool.close()
    event("relative" if any(len(p) < len(encode_item(i)) for p, i in zip(payloads, submitted, strict=True))
          else "whole")
    replayed: list[bytes] = []
    path = next(spool.folder.glob("*.log"))
    replay_file(path, replayed.extend, batch_items=1000, batch_bytes=1 << 30, prepare=Expander())
    assert replayed == [encode_item(item) for item in submitted]


def test_params_the_base_holds_are_not_spooled_again(tmp_path):
    """Claude Code's tools, the same objects every turn (wire/resent.py), are written once a spool epoch;
    params equal but made anew, or other ones, are written whole."""
    spool = Spool(tmp_path / "spool")
    bases = Bases(min_base_bytes=0)
    tools = [{"name": f"Tool{n}", "description": "d" * 500, "input_schema": {"type": "object"}}
             for n in range(30)]
    history = [{"role": "user", "content": f"m{k}"} for k in range(10)]
    items = [record(0, "s", history, params={"tools": tools, "max_tokens": 100}),
             record(1, "s", [*history, {"role": "user", "content": "more"}],
                    params={"tools": tools, "max_tokens": 100}),
             record(2, "s", [*history, {"role": "user", "content": "more"}, {"role": "user", "content": "x"}],
                    params={"tools": [dict(t) for t in tools], "max_tokens": 100})]
    payloads = []
    for item in items:
        payloads.append(bases.encode(item, spool))
        spool.append(payloads[-1])
    spool.close()

    assert b"Tool7" in payloads[0] and b"Tool7" not in payloads[1] and b"Tool7" in payloads[2]
    replayed: list[bytes] = []
    replay_file(next(spool.folder.glob("*.log")), replayed.extend, batch_items=1000, batch_bytes=1 << 30,
                prepare=Expander())
    assert replayed == [encode_item(item) for item in items]


CHILD = textwrap.dedent("""
    import sys
    from pathlib import Path
    from proxy.archive import ArchiveWriter, ExchangeRecord, TableRow, encode_item, utc_now

    writer = ArchiveWriter(Path(sys.argv[1]), busy_timeout=0.05)
    histories = {0: [{"role": "system", "content": "agent"}], 1: [{"role": "system", "content": "agent"}]}
    whole = 0
    for n in range(40):
        session = n % 2
        histories[session] = histories[session] + [
            {"role": "user", "content": f"observation {n}: " + "x" * 20_000},
            {"role": "assistant", "content": f"step {n}"}]
        request = histories[session][:-1]
        forwarded = [request[0], {"role": "system", "content": "summary block"}, *request[-4:]]
        item = ExchangeRecord(
            id=f"delta-{n}", created_at=utc_now(), session_id=f"s{session}", session_source="header",
            tenant="t", policy="default", route="chat/completions", model="m", stream=False,
            request_messages=request, forwarded_messages=forwarded, params={}, status=200,
            response_body=b'{"choices":[{"message":{"role":"assistant","content":"ok"}}]}')
        writer.submit(item)
        whole += len(encode_item(item))
    if sys.argv[2] == "commit":
        assert writer.flush(60)
        writer.submit(TableRow("session_windows", {"tenant": "t", "session_id": "s0", "cut": 3,
                                                   "last_evicted": "{}", "headlines": "[]", "block": "old",
                                                   "updated_at": utc_now()}))
        assert writer.flush(60)
    print(whole, flush=True)
    sys.stdin.read()  # wait to be killed
""")


def run_child(archive_path: Path, mode: str) -> int:
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(archive_path), mode], cwd=ROOT, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = child.stdout.readline().strip()
        assert line.isdigit(), child.stderr.read()
        return int(line)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)


def spool_bytes(archive_path: Path) -> int:
    return sum(p.stat().st_size for p in (archive_path.parent / "spool").glob("*.log"))


def test_a_resent_session_is_spooled_once_and_comes_back_whole_after_kill_9(tmp_path):
    archive_path = tmp_path / "archive.db"
    open_database(archive_path).close()
    blocker = Blocker(archive_path)  # nothing is committed: all there is, is the spool
    whole = run_child(archive_path, "spool")
    # 40 records of a growing history (~20 KB new each; the rewritten forwarded list, ~4 messages, whole)
    assert spool_bytes(archive_path) < whole / 3
    blocker.release()
    ArchiveWriter(archive_path).close()  # the start replays the spool
    reader = ArchiveReader(archive_path)
    try:
        rows = reader.db.conn.execute(
            "select id, request_leaf, forwarded_leaf from exchanges order by id").fetchall()
        assert len(rows) == 40
        for exchange_id, request_leaf, forwarded_leaf in rows:
            n = int(exchange_id.split("-")[1])
            request = reader.chain(request_leaf)
            assert len(request) == 2 * (n // 2) + 2  # its session's system prompt and turns up to n
            assert request[-1]["content"].startswith(f"observation {n}: ")
            assert [m["content"] for m in request[1::2]] == [
                f"observation {k}: " + "x" * 20_000 for k in range(n % 2, n + 1, 2)]
            forwarded = reader.chain(forwarded_leaf)
            assert forwarded[1] == {"role": "system", "content": "summary block"}
            assert forwarded[2:] == request[-4:]
    finally:
        reader.close()
    assert not list((archive_path.parent / "spool").glob("*.log"))


def test_records_marked_committed_are_not_written_again_over_newer_rows(tmp_path):
    archive_path = tmp_path / "archive.db"
    run_child(archive_path, "commit")  # committed, then killed: its spool keeps them as bases, marked
    assert spool_bytes(archive_path) > 0
    conn = sqlite3.connect(archive_path)
    conn.execute("update session_windows set block = 'newer' where session_id = 's0'")
    conn.commit()
    conn.close()
    ArchiveWriter(archive_path).close()
    assert count(archive_path, "select count(*) from exchanges") == 40
    assert count(archive_path, "select count(*) from session_windows where block = 'newer'") == 1


def test_a_record_whose_base_is_missing_is_set_aside_not_archived_in_part(tmp_path, caplog):
    archive_path = tmp_path / "archive.db"
    open_database(archive_path).close()
    history = [{"role": "user", "content": f"m{k}"} for k in range(20)]
    spool = Spool(archive_path.parent / "spool")
    bases = Bases(min_base_bytes=0)
    payloads = [bases.encode(record(n, "s", history[:10 + n]), spool) for n in range(2)]
    spool.close()
    with open(archive_path.parent / "spool" / "000000000007.log", "wb") as f:
        from proxy.spool import frame
        f.write(frame(payloads[1]) + payloads[1])  # the second alone: relative to a record not there
    ArchiveWriter(archive_path).close()
    assert count(archive_path, "select count(*) from exchanges") == 0
    assert list((archive_path.parent / "spool").glob("rejected-*.log"))
    assert "its base record is not in the spool" in caplog.text


def test_small_records_are_no_base(tmp_path):
    """A session of small bodies is parsed anew every request (no shared objects): its records are not
    kept as bases (which would only hold its messages in memory)."""
    spool = Spool(tmp_path)
    bases = Bases()
    history = [{"role": "user", "content": f"m{k}"} for k in range(20)]
    records = [record(n, "s", history[:10 + n]) for n in range(2)]  # (created once: their times)
    _, second = (bases.encode(item, spool) for item in records)
    assert second == encode_item(records[1])  # whole
    big = [{"role": "user", "content": "x" * 70_000}, *history]
    whole = bases.encode(record(2, "s", big[:10]), spool)
    spool.append(whole)
    assert len(bases.encode(record(3, "s", big[:12]), spool)) < len(whole) // 10
    spool.close()


def test_a_rewritten_list_whose_blocks_are_made_anew_is_spooled_relative(tmp_path):
    """The pipeline makes its injected blocks anew every request: a forwarded list that differs from the
    last one only by such equal copies (and one new message) is spooled as that one message, and comes
    back whole; a block equal in value but written differently (1.0 for 1) is spooled as it is."""
    spool = Spool(tmp_path)
    bases = Bases(min_base_bytes=0)
    history = [{"role": "user", "content": f"observation {k}: " + "x" * 2_000} for k in range(40)]

    def forwarded(upto: int, n: Any = 1) -> list[Any]:
        return [history[0], {"role": "system", "content": "summary block", "n": n}, *history[10:upto]]

    items = [record(0, "s", history[:30], forwarded(30)), record(1, "s", history[:31], forwarded(31)),
             record(2, "s", history[:32], forwarded(32, 1.0))]
    payloads = []
    for item in items:
        payloads.append(bases.encode(item, spool))
        spool.append(payloads[-1])
    spool.close()
    assert len(payloads[1]) < 3 * 2_000 < len(payloads[2])  # the second: one message of each list
    replayed: list[bytes] = []
    replay_file(next(tmp_path.glob("*.log")), replayed.extend, batch_items=100, batch_bytes=1 << 30,
                prepare=Expander())
    assert replayed == [encode_item(item) for item in items]
    assert b'"n":1.0' in replayed[2]


def test_the_event_loop_spools_a_record_only_when_it_is_small_and_relative(tmp_path):
    """ArchiveWriter.submit_small: None, having spooled nothing, for a session's first record and for a
    resent history with a large new message; the spooled size for a small new part (then committed)."""
    archive_path = tmp_path / "archive.db"
    writer = ArchiveWriter(archive_path)
    try:
        history = [{"role": "user", "content": f"observation {k}: " + "x" * 2_000} for k in range(40)]
        first = record(0, "s", history[:35])  # over MIN_BASE_BYTES: a base
        assert writer.submit_small(first, 4_096) is None  # no base yet
        assert writer.queued_bytes == 0 and not spool_bytes(archive_path)
        writer.submit_many([first])
        assert writer.submit_small(record(1, "s", [*history[:35], {"role": "user", "content": "y" * 9_000}]),
                                   4_096) is None  # its new part is over the limit
        spooled = writer.submit_small(record(2, "s", history[:37]), 8_192)
        assert spooled is not None and 4_000 < spooled < 8_192
        assert writer.flush(60)
    finally:
        writer.close()
    reader = ArchiveReader(archive_path)
    try:
        leaves = reader.db.conn.execute("select id, request_leaf from exchanges order by id").fetchall()
        assert [(exchange_id, len(reader.chain(leaf))) for exchange_id, leaf in leaves] == [
            ("ex-0", 35), ("ex-2", 37)]
    finally:
        reader.close()


def _turns(spool: Spool, bases: Bases, sessions: int, base_chars: int, turn_chars: int,
           rounds: int) -> tuple[int, list[tuple[int, int]]]:
    """`sessions` long histories (a whole first record of ~`base_chars` each) growing by `turn_chars` a
    turn, each record committed at once (an idle writer). Returns how many records went whole after
    the first round, and after each commit: by how much the segment is over what may stay in it (twice
    its bases, and at least TRUNCATE_BYTES), and that record's size."""
    opening = [{"role": "user", "content": str(k)} for k in range(8)]  # (spool_delta.MIN_SHARED)
    histories = [[{"role": "system", "content": f"s{s} " + "x" * base_chars}, *opening]
                 for s in range(sessions)]
    whole, over = 0, []
    for n in range(rounds):
        for s, history in enumerate(histories):
            history.append({"role": "user", "content": f"turn {n}: " + "y" * turn_chars})
            item = record(n, f"s{s}", list(history))
            payload = bases.encode(item, spool)
            whole += int(n > 0 and payload == encode_item(item))
            spool.committed([spool.append(payload)])
            over.append((spool.size - max(100_000, 2 * spool.base_bytes), len(payload)))
    return whole, over


def test_long_sessions_whose_bases_pass_the_truncation_size_are_not_spooled_whole_every_turn(
        tmp_path, monkeypatch):
    """Four sessions whose histories together hold twice TRUNCATE_BYTES: emptying the segment as soon as
    all of it is committed would make every session spool its whole history again, each turn (the bases
    alone refill it past the size). It waits until as many bytes were written after the bases: here
    not in 30 turns of small new parts."""
    monkeypatch.setattr("proxy.spool.TRUNCATE_BYTES", 100_000)
    spool = Spool(tmp_path)
    whole, _ = _turns(spool, Bases(min_base_bytes=10_000), 4, 50_000, 100, 30)
    assert whole == 0 and spool.epoch == 0


def test_the_segment_is_still_emptied_once_as_much_was_written_after_its_bases(tmp_path, monkeypatch):
    """The spool stays bounded: with large new parts the segment is emptied (each session's next record
    whole) once the bytes written after the bases match them: it never holds more than twice its bases
    (or TRUNCATE_BYTES) plus the record just committed."""
    monkeypatch.setattr("proxy.spool.TRUNCATE_BYTES", 100_000)
    spool = Spool(tmp_path)
    whole, over = _turns(spool, Bases(min_base_bytes=10_000), 4, 50_000, 10_000, 30)
    assert spool.epoch >= 2 and 0 < whole <= 4 * spool.epoch  # emptied now and then, not every round
    assert all(excess <= size for excess, size in over)


def test_bases_that_hold_more_than_a_segment_are_not_rotated_out_every_turn(tmp_path, monkeypatch):
    """Eight sessions whose whole records hold more than a segment: rotating at the segment's size would
    start every session over each turn. The segment rotates once twice its bases are written."""
    monkeypatch.setattr("proxy.spool.TRUNCATE_BYTES", 100_000)
    monkeypatch.setattr("proxy.spool.SEGMENT_BYTES", 150_000)
    spool = Spool(tmp_path)
    whole, _ = _turns(spool, Bases(min_base_bytes=10_000), 8, 50_000, 100, 20)
    assert whole == 0 and spool.epoch == 0
    assert spool.base_bytes > 8 * 50_000


def test_however_many_bases_a_segment_is_rotated_at_the_cap(tmp_path, monkeypatch):
    monkeypatch.setattr("proxy.spool.TRUNCATE_BYTES", 100_000)
    monkeypatch.setattr("proxy.spool.SEGMENT_BYTES", 150_000)
    monkeypatch.setattr("proxy.spool.SEGMENT_CAP_BYTES", 300_000)
    spool = Spool(tmp_path)
    whole, _ = _turns(spool, Bases(min_base_bytes=10_000), 8, 50_000, 100, 3)
    assert spool.epoch >= 1 and whole > 0
    assert spool.size < 300_000 + 60_000  # (the cap, and the record that passed it)


def test_a_session_counts_once_in_the_bases_and_not_once_quiet(tmp_path):
    """A session spooled whole again (an edited history) counts with its newer record only; a session
    quiet for IDLE_SECONDS counts no more, and its next record is spooled whole."""
    now = [0.0]
    spool, bases = Spool(tmp_path), Bases(min_base_bytes=1_000, clock=lambda: now[0])
    history = [{"role": "user", "content": f"m{k} " + "x" * 1_000} for k in range(10)]

    def spooled(n: int, session: str, messages: list[Any]) -> bytes:
        payload = bases.encode(record(n, session, messages), spool)
        spool.append(payload)
        return payload

    first = spooled(0, "a", history)
    assert spool.base_bytes == len(first)
    edited = [{"role": "system", "content": "edited"}, *history[1:]]
    again = spooled(1, "a", edited)
    assert spool.base_bytes == len(again)  # not both
    other = spooled(2, "b", history)
    assert spool.base_bytes == len(again) + len(other)
    now[0] += IDLE_SECONDS + 1
    latest = spooled(3, "b", [*history, {"role": "user", "content": "next"}])
    assert len(latest) < len(other) // 5  # b: relative
    assert spool.base_bytes == len(other)  # a: quiet too long
    grown = record(4, "a", [*edited, {"role": "user", "content": "next"}])
    assert bases.encode(grown, spool) == encode_item(grown)  # whole
    spool.close()
