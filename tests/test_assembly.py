"""Assembly of injected blocks: token budget, failing and slow sources, placement."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from proxy.assembly import HEAD, TAIL, Fragment, assemble, bm25, place

fragment = st.builds(Fragment, source=st.sampled_from(["summary", "folded", "working_memory"]),
                     text=st.text(min_size=1, max_size=50), tokens=st.integers(1, 500),
                     precedence=st.integers(2, 5), placement=st.sampled_from([HEAD, TAIL]),
                     recency=st.floats(0, 1))


@given(fragments=st.lists(fragment, max_size=12), tokens_max=st.integers(0, 2000), query=st.text(max_size=30))
def test_assembly_never_exceeds_its_token_budget(fragments, tokens_max, query):
    result = assemble([("s", lambda: fragments)], query, tokens_max, 1000, "system")
    assert sum(result.tokens.values()) <= tokens_max


def test_required_blocks_always_come_and_relevance_breaks_ties():
    pinned = Fragment("pinned", "house rules", 900, 1, required=True)
    on_topic = Fragment("folded", "the deploy pipeline uses make ship", 300, 3)
    off_topic = Fragment("working_memory", "pages About Us and Team", 300, 3)
    result = assemble([("all", lambda: [pinned, on_topic, off_topic])], "how do we deploy with make", 400,
                      1000, "system")
    texts = [m["content"] for m in result.head]
    assert texts == ["house rules", "the deploy pipeline uses make ship"]
    assert "working_memory:budget" in result.skipped


def test_failing_and_slow_sources_are_skipped_not_fatal():
    now = [0.0]

    def clock() -> float:
        return now[0]

    def slow() -> list[Fragment]:
        now[0] += 1.0  # this source takes a whole second
        return [Fragment("slow", "slow block", 10, 2)]

    def broken() -> list[Fragment]:
        raise RuntimeError("backend down")

    result = assemble([("broken", broken), ("slow", slow), ("late", lambda: [Fragment("late", "x", 1, 3)])],
                      "q", 1000, 50, "system", clock=clock)
    assert result.skipped == ["broken:error", "late:deadline"]
    assert [m["content"] for m in result.head] == ["slow block"]


def test_placement_head_after_system_tail_before_last_user_message():
    result = assemble([("s", lambda: [Fragment("pinned", "P", 1, 1, HEAD, required=True),
                                      Fragment("working_memory", "W", 1, 5, TAIL)])], "", 100, 100, "system")
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "task"},
                {"role": "assistant", "content": "a"}, {"role": "user", "content": "last"}]
    placed = [m["content"] for m in place(messages, result, 1)]
    assert placed == ["S", "P", "task", "a", "W", "last"]
    ends_with_tool = [*messages[:3], {"role": "tool", "tool_call_id": "c", "content": "r"}]
    assert [m["content"] for m in place(ends_with_tool, result, 1)][-1] == "W"


def test_bm25_prefers_matching_documents():
    scores = bm25("deploy key", ["the deploy key rotated", "lunch menu", "deploy"])
    assert scores[0] > scores[2] > scores[1] == 0.0
