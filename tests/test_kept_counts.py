"""Token counts kept across restarts: looked up by a stable digest of what a count reads, written at
shutdown from the sessions in memory, never trusted for a message they were not counted for."""

from __future__ import annotations

import itertools
import os
import stat
import subprocess
import sys
from pathlib import Path

import httpx
from hypothesis import given
from hypothesis import strategies as st

from proxy import kept_counts, tokens
from proxy.kept_counts import KeptCounts, counted_in, keep_at_shutdown, message_digest
from proxy.state import StateStore
from proxy.tokens import PARALLEL_CHARS, TokenCounter


def history(n: int = 40, size: int = PARALLEL_CHARS // 30) -> list[dict]:
    """A long history (over the first-sight threshold), every message distinct."""
    messages: list[dict] = [{"role": "system", "content": "You are a coding agent."}]
    for k in range(n):
        call = {"id": f"call_{k}", "type": "function",
                "function": {"name": "bash", "arguments": f'{{"cmd": "cat file_{k}.py"}}'}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{k}",
                         "content": f"# file_{k}.py\n" + f"v_{k} = compute({k}, 'x') + 1\n" * (size // 30)})
    return messages


def exact(messages: list[dict], model: str = "gpt-4o") -> list[int]:
    return [tokens._count_message(m, tokens.encoding_name_for(model)) for m in messages]


def counted_once(counter: TokenCounter, messages: list[dict], model: str = "gpt-4o") -> int:
    """A first sight: the request's total, in a request scope as the pipeline counts it."""
    with counter.request_scope():
        return counter.messages(messages, model)


def test_a_restarted_counter_takes_the_kept_counts_and_counts_nothing(tmp_path, monkeypatch):
    messages = history()
    first = TokenCounter()
    total = counted_once(first, messages)
    kept = KeptCounts(tmp_path / "cache" / "token_counts.db")
    counts = exact(messages)
    assert kept.save(("gpt-4o", m, c) for m, c in zip(messages, counts, strict=True)) == len(messages)
    kept.close()

    restored: list[int] = []
    restarted = TokenCounter()
    restarted.kept = KeptCounts(kept.path, on_restored=restored.append)

    def no_counting(*args, **kwargs):
        raise AssertionError("a kept count was counted again")

    monkeypatch.setattr(tokens, "_count_message", no_counting)
    monkeypatch.setattr(tokens, "count_messages", no_counting)
    assert counted_once(restarted, messages) == total
    assert restored == [len(messages)]


def test_counts_kept_for_one_tokenizer_are_not_used_for_another(tmp_path):
    messages = history()
    kept = KeptCounts(tmp_path / "token_counts.db")
    kept.save(("gpt-4o", m, 1) for m in messages)  # (made up, to tell them apart: o200k's, used as kept)
    counter = TokenCounter()
    counter.kept = kept
    assert counted_once(counter, messages, "gpt-4o") == 3 + len(messages)
    assert counted_once(counter, messages, "gpt-4") == 3 + sum(exact(messages, "gpt-4"))  # cl100k: counted


def test_a_history_partly_kept_counts_only_the_rest(tmp_path, monkeypatch):
    """A continued session: its older messages kept, the newest (since the restart) not."""
    messages = history()
    kept = KeptCounts(tmp_path / "token_counts.db")
    kept.save(("gpt-4o", m, c) for m, c in zip(messages[:-3], exact(messages[:-3]), strict=True))
    counter = TokenCounter()
    counter.kept = kept
    seen: list[int] = []
    real, total = tokens._count_message, 3 + sum(exact(messages))
    monkeypatch.setattr(tokens, "_count_message", lambda m, f: seen.append(id(m)) or real(m, f))
    assert counted_once(counter, messages) == total
    assert set(seen) == {id(m) for m in messages[-3:]}


def test_a_history_whose_newest_were_not_kept_is_looked_up_no_further(tmp_path, monkeypatch):
    """A new history (only its opening shared with a kept one): the probe of its newest messages finds
    nothing, and the rest is not looked up."""
    messages = history()
    kept = KeptCounts(tmp_path / "token_counts.db")
    kept.save(("gpt-4o", m, c) for m, c in zip(messages[:30], exact(messages[:30]), strict=True))
    asked: list[int] = []
    real = KeptCounts._lookup
    monkeypatch.setattr(KeptCounts, "_lookup", lambda self, family, ms: asked.append(len(ms)) or real(
        self, family, ms))
    assert kept.restore("o200k_base", messages) == [None] * len(messages)
    assert asked == [kept_counts.PROBE]


def test_the_file_is_the_users_alone(tmp_path):
    kept = KeptCounts(tmp_path / "cache" / "token_counts.db")
    kept.save([("gpt-4o", {"role": "user", "content": "hi"}, 5)])
    assert stat.S_IMODE(os.stat(kept.path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(kept.path.parent).st_mode) == 0o700
    assert b"hi" not in kept.path.read_bytes()  # digests and numbers only, no text


def test_a_damaged_file_is_set_aside_and_a_new_one_written(tmp_path, caplog):
    path = tmp_path / "token_counts.db"
    path.write_bytes(b"this is not a database" * 100)
    kept = KeptCounts(path)
    message = {"role": "user", "content": "hello"}
    assert kept.restore("o200k_base", [message]) == [None]
    assert "set aside" in caplog.text
    assert (tmp_path / "token_counts.db.broken").exists()
    assert kept.save([("gpt-4o", message, 9)]) == 1  # the shutdown starts a new file
    kept.close()
    assert KeptCounts(path).restore("o200k_base", [message]) == [9]


def test_no_file_no_lookup_and_nothing_made(tmp_path):
    kept = KeptCounts(tmp_path / "token_counts.db")
    assert kept.restore("o200k_base", [{"role": "user", "content": "x"}]) == [None]
    assert not kept.path.exists()


def test_the_newest_generations_stay_within_the_row_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(kept_counts, "MAX_ROWS", 10)
    kept = KeptCounts(tmp_path / "token_counts.db")
    old = [{"role": "user", "content": f"old {k}"} for k in range(8)]
    new = [{"role": "user", "content": f"new {k}"} for k in range(8)]
    kept.save(("gpt-4o", m, 1) for m in old)
    kept.save(("gpt-4o", m, 2) for m in new)
    assert kept.restore("o200k_base", new) == [2] * 8
    assert kept.restore("o200k_base", old) == [None] * 8  # the older generation went whole


def test_saving_stops_at_its_deadline_keeping_the_first_given(tmp_path, monkeypatch):
    kept = KeptCounts(tmp_path / "token_counts.db")
    assert kept.save([("gpt-4o", {"role": "user", "content": "x"}, 1)], deadline=0.0) == 0
    clock = itertools.count()  # one tick a look at the clock: six digests, then the second chunk's look
    monkeypatch.setattr(kept_counts, "monotonic", lambda: next(clock))
    monkeypatch.setattr(kept_counts, "_SAVE_CHUNK", 2)
    messages = [{"role": "user", "content": f"m{k}"} for k in range(6)]
    assert kept.save((("gpt-4o", m, k) for k, m in enumerate(messages)), deadline=5.5) == 2
    assert kept.restore("o200k_base", messages) == [0, 1, None, None, None, None]


def test_a_message_json_cannot_carry_is_counted_never_kept(tmp_path):
    lone = {"role": "user", "content": "half a pair \ud800"}
    assert message_digest(lone) is None
    kept = KeptCounts(tmp_path / "token_counts.db")
    assert kept.save([("gpt-4o", lone, 4)]) == 0
    assert kept.restore("o200k_base", [lone]) == [None]


def test_the_digest_is_the_same_in_another_process():
    """Python's own string hashes differ per process; the kept key must not."""
    message = {"role": "tool", "tool_call_id": "call_1", "content": "résultat: 42 ✓"}
    code = ("from proxy.kept_counts import message_digest\n"
            f"print(message_digest({message!r}).hex())")
    others = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": seed}).stdout.strip()
              for seed in ("1", "2")}
    assert others == {message_digest(message).hex()}


FIELDS = st.fixed_dictionaries({
    "role": st.sampled_from(["user", "assistant", "tool", "system"]),
    "content": st.one_of(st.none(), st.text(max_size=30), st.lists(
        st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=10)}), max_size=2)),
    "name": st.one_of(st.none(), st.text(max_size=8)),
    "tool_call_id": st.one_of(st.none(), st.text(max_size=8)),
    "tool_calls": st.one_of(st.none(), st.lists(st.fixed_dictionaries({
        "id": st.text(max_size=5), "type": st.just("function"),
        "function": st.fixed_dictionaries({"name": st.text(max_size=6), "arguments": st.text(max_size=12)})}),
        max_size=2)),
})


@given(FIELDS, FIELDS)
def test_two_messages_share_a_key_only_when_they_count_the_same(a, b):
    """Every field a count reads is in the key: equal keys, equal counts; different fields, different keys.
    (Equal fields may still have different keys, their dicts' keys in another order: a miss, not a
    wrong count.)"""
    da, db = message_digest(a), message_digest(b)
    if da is None or db is None:
        return
    family = "o200k_base"
    if da == db:
        assert tokens._count_message(a, family) == tokens._count_message(b, family)
    if {k: a.get(k) for k in FIELDS_READ} != {k: b.get(k) for k in FIELDS_READ}:
        assert da != db


FIELDS_READ = ("role", "content", "name", "tool_calls", "tool_call_id")


@given(FIELDS, st.sampled_from(FIELDS_READ), st.text(min_size=1, max_size=5))
def test_changing_any_counted_field_changes_the_key(message, field, extra):
    changed = dict(message)
    changed[field] = [message.get(field), extra]  # (never equal to what it was)
    assert message_digest(changed) != message_digest(message) or message_digest(message) is None


def test_shutdown_keeps_what_the_sessions_in_memory_counted(tmp_path):
    store = StateStore()
    messages = history(5, 400)
    counter = TokenCounter()
    state = store.get("tenant", "s1")
    with counter.request_scope(state.counted):
        counter.messages(messages, "gpt-4o")
    assert sorted(c for _, _, c in counted_in(store)) == sorted(exact(messages))
    kept = KeptCounts(tmp_path / "token_counts.db")
    keep_at_shutdown(kept, store)
    assert KeptCounts(kept.path).restore("o200k_base", messages) == exact(messages)


def test_a_folder_it_cannot_write_costs_nothing_but_the_counts(tmp_path, caplog):
    blocker = tmp_path / "cache"
    blocker.write_text("a file where the folder should be")
    kept = KeptCounts(blocker / "token_counts.db")
    assert kept.save([("gpt-4o", {"role": "user", "content": "x"}, 1)]) == 0
    assert "not usable" in caplog.text
    assert Path(blocker).read_text() == "a file where the folder should be"


def restored_total(proxy) -> float:
    text = httpx.get(f"{proxy.url}/metrics", timeout=10).text
    return float(next(line.split()[-1] for line in text.splitlines()
                      if line.startswith("ctxproxy_token_counts_restored_total")))


def test_a_session_continued_after_a_restart_is_not_counted_again(make_proxy, fake_upstream):
    """Through the real server and the OpenAI SDK: the counts of the session the proxy held are written at
    its shutdown, and the restarted proxy's first sight of that session takes them (exact, as counted)."""
    messages = history()
    first = make_proxy()

    def ask(proxy, history):
        client = proxy.client(base_url=f"{proxy.url}/p/passthrough/v1")
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-4o", messages=history, extra_headers={"x-ctxproxy-session": "resumed-1"})
        return int(raw.headers["x-ctxproxy-tokens-before"]), raw.parse().choices[0].message.content

    before, answer = ask(first, messages)
    assert before == TokenCounter().request(messages, None, "gpt-4o")
    assert restored_total(first) == 0
    first.server.__exit__()  # a clean shutdown writes the counts
    path = first.data_dir / "cache" / kept_counts.FILE_NAME
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600

    again = make_proxy()
    messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "Now run the tests."}]
    before, _ = ask(again, messages)
    assert before == TokenCounter().request(messages, None, "gpt-4o")
    assert restored_total(again) >= len(messages) - 2  # every message it held, none counted again


def test_counts_kept_under_another_tokenizer_version_are_not_used(tmp_path, monkeypatch):
    message = {"role": "user", "content": "the same text, another tiktoken"}
    kept = KeptCounts(tmp_path / "token_counts.db")
    with monkeypatch.context() as patched:
        patched.setattr(kept_counts, "tokenizer_version", lambda family: "tiktoken-0.0.1")
        kept.save([("gpt-4o", message, 99)])
        assert kept.restore("o200k_base", [message]) == [99]
    assert kept.restore("o200k_base", [message]) == [None]
