"""The overhead benchmark's real-session replay (bench/session_replay.py): which turns a size's row resends,
and which turns count as continued."""

from __future__ import annotations

from dataclasses import dataclass

import orjson
import pytest

from bench.session_replay import replay, window


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


def conversation(sizes: list[int]) -> list[dict[str, str]]:
    """A system prompt, then assistant/user turns whose user messages hold `sizes` bytes of text."""
    messages = [{"role": "system", "content": "s"}]
    for n in sizes:
        messages += [{"role": "assistant", "content": "a"}, {"role": "user", "content": "u" * n}]
    return messages


def test_a_sizes_turns_come_from_the_session_where_they_stay_nearest_the_size() -> None:
    jumping = conversation([3_000, 4_000, 250_000, 3_000, 3_000])  # past 5 KB only after a 250 KB turn
    steady = conversation([3_000] * 8)
    later = conversation([3_000] * 8)  # as near, but found after `steady`
    nearer = conversation([1_000] * 6 + [1_500] * 6)
    turns = window([jumping, steady, later], 5_000, 3)
    sizes = [len(orjson.dumps(prefix)) for prefix in turns]
    assert all(5_000 <= size < 20_000 for size in sizes) and sizes == sorted(sizes)
    assert turns[0][-1] is steady[len(turns[0]) - 1]  # the steady session's own turns, in order
    assert [len(prefix) for prefix in turns] == [len(turns[0]) + 2 * i for i in range(3)]
    assert window([jumping, steady, nearer], 5_000, 3)[-1][-1] is nearer[2 * 7]  # its 7th user turn, 8 KB
    with pytest.raises(ValueError):
        window([jumping, steady], 5_000, 30)
