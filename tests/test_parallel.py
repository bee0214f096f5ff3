"""A long history's first sight is counted across threads: the same counts, each message once."""

from __future__ import annotations

import threading

from hypothesis import given
from hypothesis import strategies as st

from proxy import parallel, tokens
from proxy.tokens import TokenCounter


@given(st.lists(st.integers(min_value=0, max_value=10_000), max_size=60),
       st.integers(min_value=1, max_value=9))
def test_runs_cover_every_index_once_in_order_and_none_is_empty(sizes, parts):
    runs = parallel.split(sizes, parts)
    assert [i for start, stop in runs for i in range(start, stop)] == list(range(len(sizes)))
    assert all(start < stop for start, stop in runs)
    assert len(runs) <= parts


@given(st.integers(min_value=1, max_value=60), st.integers(min_value=1, max_value=9))
def test_equal_sizes_make_equal_runs(count, parts):
    runs = parallel.split([5] * count, parts)
    lengths = [stop - start for start, stop in runs]
    assert len(runs) == min(parts, count)
    assert max(lengths) - min(lengths) <= 1


def history(count: int, chars: int, tag: str) -> list[dict]:
    """Tool-using turns whose results are distinct texts of about `chars` characters."""
    messages: list[dict] = [{"role": "system", "content": "You are a coding agent."}]
    for n in range(count):
        call = {"id": f"call_{tag}_{n}", "type": "function",
                "function": {"name": "bash", "arguments": f'{{"cmd": "cat src/mod_{n}.py"}}'}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        body = "\n".join(f"{tag} line {n}.{i}: value = compute({i}, '{tag}{n}')" for i in range(chars // 40))
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": body})
    return messages


def test_a_first_sight_is_counted_across_threads_with_the_counts_one_by_one(monkeypatch):
    monkeypatch.setattr(parallel, "threads", lambda: 3)
    callers: list[tuple[int, int]] = []
    real = tokens.count_messages

    def recorded(messages, family):
        callers.append((threading.get_ident(), len(messages)))
        return real(messages, family)
    monkeypatch.setattr(tokens, "count_messages", recorded)
    messages = history(24, 12_000, "first")
    one_by_one = tokens.REPLY_PRIMING + sum(tokens._count_message(m, "o200k_base") for m in messages)
    counter = TokenCounter()
    with counter.request_scope():
        assert counter.messages(messages, "gpt-4o") == one_by_one
    assert sum(n for _, n in callers) == len(messages)  # each counted once, in three runs
    assert len(callers) == 3
    assert len({ident for ident, _ in callers}) >= 2  # (the calling thread counts one run itself)
    callers.clear()
    assert counter.messages(messages, "gpt-4o") == one_by_one  # all in the memo now: nothing counted
    assert callers == []


def test_what_the_memo_knows_is_not_counted_again(monkeypatch):
    monkeypatch.setattr(parallel, "threads", lambda: 2)
    counted: list[int] = []
    real = tokens.count_messages

    def recorded(messages, family):
        counted.extend(id(m) for m in messages)
        return real(messages, family)
    monkeypatch.setattr(tokens, "count_messages", recorded)
    known, new = history(12, 12_000, "known"), history(30, 12_000, "new")[1:]
    counter = TokenCounter()
    for message in known:
        counter.message(message, "gpt-4o")
    with counter.request_scope():
        total = counter.messages(known + new, "gpt-4o")
    assert sorted(counted) == sorted(id(m) for m in new)
    assert total == tokens.REPLY_PRIMING + sum(tokens._count_message(m, "o200k_base") for m in known + new)


def test_a_short_history_is_counted_in_the_calling_thread(monkeypatch):
    monkeypatch.setattr(parallel, "threads", lambda: 4)
    monkeypatch.setattr(parallel, "map_split", lambda *a: (_ for _ in ()).throw(AssertionError("split")))
    messages = history(20, 2_000, "short")  # 40 messages, ~40 KB: not worth a hand-over
    counter = TokenCounter()
    with counter.request_scope():
        assert counter.messages(messages, "gpt-4o") == tokens.REPLY_PRIMING + sum(
            tokens._count_message(m, "o200k_base") for m in messages)
