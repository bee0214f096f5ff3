"""The overhead benchmark's real-session replay (bench/session_replay.py): which turns count as continued."""

from __future__ import annotations

from dataclasses import dataclass

from bench.session_replay import replay


@dataclass
class _Target:
    name: str
    url: str
    headers: dict[str, str] | None = None


def test_continued_turns_leave_out_each_sessions_first_sight_and_failures() -> None:
    sent: list[tuple[str, bytes, str]] = []

    def send(url: str, body: bytes, headers: dict[str, str] | None) -> float:
        sent.append((url, body, (headers or {})["x-ctxproxy-session"]))
        if url == "b" and body == b"t2" and len(sent) > 6:  # target b's third turn of the second session
            raise OSError("refused")
        if url == "a" and body == b"t0" and len(sent) > 6:  # target a's first turn of the second session
            raise OSError("refused")
        return float(int(body[1:]) * 10 + len(sent) / 1000)

    samples, errors = replay(send, [_Target("a", "a"), _Target("b", "b")], {"10KB": [b"t0", b"t1", b"t2"]},
                             sessions=2)
    assert [round(ms, -1) for ms in samples["session_10KB"]["a"]] == [0, 10, 20, 10, 20]
    assert [round(ms, -1) for ms in samples["session_10KB_continued"]["a"]] == [10, 20, 10, 20]
    assert [round(ms, -1) for ms in samples["session_10KB_continued"]["b"]] == [10, 20, 10]
    assert errors["session_10KB"] == {"a": 1, "b": 1}
    assert errors["session_10KB_continued"] == {"a": 0, "b": 1}  # (a's failure was a first sight)
    # each target keeps one session id per session, and the two sessions differ
    ids = {(url, session) for url, _, session in sent}
    assert len(ids) == 4 and len({s for _, s in ids}) == 4
