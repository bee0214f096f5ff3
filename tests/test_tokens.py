"""Token counts: exact per OpenAI's recipe, memoised, summed per request scope."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st


def test_a_request_scopes_counter_counts_what_message_counts():
    """`counter(model)` is the per-request shortcut the layers use: in a request scope and out of it, for
    messages counted before and new ones, it gives `message`'s count (and counts a new one once)."""
    from proxy.tokens import TokenCounter

    tokens, model = TokenCounter(), "gpt-4o"
    messages = [{"role": "user", "content": f"message {n} " + "word " * n} for n in range(30)]
    expected = [tokens.message(m, model) for m in messages]
    assert [tokens.counter(model)(m) for m in messages] == expected  # outside any scope
    with tokens.request_scope():
        count = tokens.counter(model)
        assert [count(m) for m in messages[:10]] == expected[:10]
        assert tokens.messages(messages, model) == 3 + sum(expected)  # the rest counted here
        assert [count(m) for m in messages] == expected  # now all looked up
        edited = {**messages[5], "content": "another text entirely, longer than the first one was"}
        assert count(edited) == tokens.message(edited, model) != expected[5]


@given(st.lists(st.text(max_size=40), min_size=0, max_size=25), st.data())
def test_a_scope_sums_what_message_counts_whichever_were_counted_before(texts, data):
    """`messages` in a scope: the all-known fast path and the one that counts the rest give the same sum
    as counting each message (a message may appear twice: the same object)."""
    from proxy.tokens import REPLY_PRIMING, TokenCounter

    tokens, model = TokenCounter(), "gpt-4o"
    messages = [{"role": "user", "content": text} for text in texts]
    if messages:
        messages += data.draw(st.lists(st.sampled_from(messages), max_size=3))
    expected = REPLY_PRIMING + sum(TokenCounter().message(m, model) for m in messages)
    before = data.draw(st.lists(st.sampled_from(messages), max_size=len(messages))) if messages else []
    with tokens.request_scope():
        count = tokens.counter(model)
        for message in before:
            count(message)
        assert tokens.messages(messages, model) == expected
        assert tokens.messages(messages, model) == expected  # (now every one is known)


@given(st.lists(st.text(max_size=300), min_size=1, max_size=12))
def test_text_counts_are_the_encoders_however_short_and_remembered_by_family(texts: list[str]) -> None:
    from proxy.encoders import _encoder, encoding_name_for
    from proxy.tokens import TokenCounter

    counter = TokenCounter()
    for _ in range(2):  # the second time from the memo
        for text in texts:
            for model in ("gpt-4o", "gpt-4"):  # o200k and cl100k count the same text differently
                assert counter.text(text, model) == _encoder(encoding_name_for(model))(text)


@given(st.one_of(st.sampled_from(["system", "user", "assistant", "tool", "developer"]), st.text(max_size=90)),
       st.text(max_size=200), st.one_of(st.none(), st.text(min_size=1, max_size=20)))
def test_a_message_counts_as_openais_recipe_says(role: str, content: str, name: str | None) -> None:
    """3 per message, its role, its content, and 1 plus the name when there is one (whatever the role:
    a client may send any string, long ones too)."""
    from proxy.encoders import _encoder
    from proxy.tokens import TokenCounter

    encode = _encoder("o200k_base")
    message = {"role": role, "content": content, **({"name": name} if name is not None else {})}
    expected = 3 + encode(role) + encode(content) + (1 + encode(name) if name else 0)
    assert TokenCounter().message(message, "gpt-4o") == expected


tool_spec = st.builds(lambda name, text: {"type": "function",
                                         "function": {"name": name, "description": text}},
                      st.sampled_from(["a", "b", "c"]), st.text(max_size=30))


@given(st.lists(tool_spec, min_size=1, max_size=4),
       st.lists(st.tuples(st.sampled_from(["gpt-4o", "gpt-4"]), st.lists(st.integers(0, 3), min_size=1,
                                                                          max_size=4)), max_size=12))
def test_tools_are_counted_as_serialized_whichever_objects_were_counted_before(specs, picks) -> None:
    """Tools lists built from the very same objects in other orders and lengths (as a request recounts
    them with ours appended, or a resent body repeats them) each count as their serialization does, for
    each model's encoding."""
    import orjson

    from proxy.encoders import count_text, encoding_name_for
    from proxy.tokens import TokenCounter

    tokens = TokenCounter()
    for model, indices in picks:
        tools = [specs[i % len(specs)] for i in indices]
        expected = count_text(orjson.dumps(tools).decode(), encoding_name_for(model))
        assert tokens.tools(tools, model) == expected
        assert tokens.tools(list(tools), model) == expected


def test_tools_counted_before_are_not_mistaken_for_new_ones_at_the_same_address() -> None:
    """Tools lists of fresh objects, each dropped after its count (CPython reuses their memory, so a new
    object may get an old one's id): each counts as its own serialization."""
    import orjson

    from proxy.encoders import count_text
    from proxy.tokens import TokenCounter

    tokens = TokenCounter()
    for n in range(200):
        tools = [{"type": "function", "function": {"name": "t", "description": "word " * (n % 17)}}]
        assert tokens.tools(tools, "gpt-4o") == count_text(orjson.dumps(tools).decode(), "o200k_base")
        del tools
