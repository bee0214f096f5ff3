"""Folded memory: fallback compactor, flush-half, distill, model-answer parsing, rendering, persistence."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.layers.folded import (
    CAPS,
    EPISODE_CAP,
    Decision,
    Eliminated,
    Episode,
    FoldedMemory,
    SemanticMemory,
    add_episode,
    apply_distilled,
    distill,
    episode_from_messages,
    render,
)
from proxy.layers.folded_model import episode_prompt, parse_episode, parse_semantic, semantic_prompt
from tests.strategies import conversation


def call(call_id: str, name: str, **args: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


SESSION: list[dict[str, Any]] = [
    {"role": "user", "content": "Why does POST /upload return 500 for files over 10 MB?"},
    {"role": "assistant", "content": "Reading the handler.",
     "tool_calls": [call("call_a1", "read_file", path="src/api/upload.py")]},
    {"role": "tool", "tool_call_id": "call_a1",
     "content": "MAX_BODY = 10485760  # src/api/upload.py:42\n..."},
    {"role": "assistant",
     "content": "Raising nginx client_max_body_size doesn't work because the app enforces its own limit. "
                "I decided to stream uploads in multipart chunks because buffering 10 MB bodies exhausts "
                "worker memory. Is the S3 lifecycle rule also deleting partial uploads?",
     "tool_calls": [call("call_b2", "run", cmd="pytest tests/test_upload.py -q")]},
    {"role": "tool", "tool_call_id": "call_b2",
     "content": "4 passed in 0.52s (build 7f3e9c21a)\n" + "noise line\n" * 50},
    {"role": "assistant", "content": "Uploads now stream in 8 MB parts and the tests pass."},
]


def test_compactor_extracts_decision_with_reason() -> None:
    ep = episode_from_messages(SESSION, 0, (0, 5))
    assert [d.model_dump() for d in ep.decisions] == [{
        "decision": "I decided to stream uploads in multipart chunks",
        "reason": "buffering 10 MB bodies exhausts worker memory"}]


def test_compactor_extracts_eliminated_approach_with_why() -> None:
    ep = episode_from_messages(SESSION, 0, (0, 5))
    assert ep.eliminated == [Eliminated(approach="Raising nginx client_max_body_size",
                                        why="the app enforces its own limit")]
    verdicts = episode_from_messages([{"role": "assistant", "content": (
        "Ruled out the DNS cache since dig returns the new IP. The connection pool is not the issue. "
        "Three tests failed. Tried a 1 s retry loop, it failed under throttling.")}], 1, (6, 6))
    assert [(e.approach, e.why) for e in verdicts.eliminated] == [
        ("the DNS cache", "dig returns the new IP"), ("The connection pool", "not the issue"),
        ("Tried a 1 s retry loop", "failed under throttling")]


def test_compactor_keeps_only_unanswered_questions() -> None:
    ep = episode_from_messages(SESSION, 0, (0, 5))
    # The user's question got an assistant reply; the assistant's own question was never answered.
    assert ep.open_questions == ["Is the S3 lifecycle rule also deleting partial uploads?"]
    answered = [*SESSION, {"role": "user", "content": "No, lifecycle rules only run nightly."}]
    assert episode_from_messages(answered, 0, (0, 6)).open_questions == []


def test_compactor_tool_results_keep_ids_paths_and_numbers() -> None:
    ep = episode_from_messages(SESSION, 0, (0, 5))
    assert ep.tool_results == {
        "read_file(path=src/api/upload.py)": "MAX_BODY = 10485760 # src/api/upload.py:42",
        "run(cmd=pytest tests/test_upload.py -q)": "4 passed in 0.52s (build 7f3e9c21a)",
    }
    long = [{"role": "assistant", "content": None, "tool_calls": [call("c1", "run", cmd="make")]},
            {"role": "tool", "tool_call_id": "c1", "content": "word " * 60 + "id_9f8e7d6c5b"}]
    value = episode_from_messages(long, 0, (0, 1)).tool_results["run(cmd=make)"]
    assert len(value) <= 160 and value.endswith("…")
    error = [{"role": "assistant", "content": None, "tool_calls": [call("c2", "run", cmd="make")]},
             {"role": "tool", "tool_call_id": "c2",
              "content": "gcc -O2 main.c\nmain.c:7: error: x undeclared"}]
    value = episode_from_messages(error, 0, (0, 1)).tool_results["run(cmd=make)"]
    assert value == "gcc -O2 main.c | main.c:7: error: x undeclared"  # a later error line is kept


def test_compactor_caps_lists_keeping_the_newest() -> None:
    text = " ".join(f"We decided to use backend{i} because reason{i}." for i in range(20))
    ep = episode_from_messages([{"role": "assistant", "content": text}], 0, (0, 0))
    assert len(ep.decisions) == EPISODE_CAP
    assert ep.decisions[-1].decision == "We decided to use backend19"


def test_summary_names_request_and_outcome() -> None:
    summary = episode_from_messages(SESSION, 0, (0, 5)).summary
    assert summary == ("Asked: Why does POST /upload return 500 for files over 10 MB? Tools: read_file, run. "
                       "Outcome: Uploads now stream in 8 MB parts and the tests pass.")
    loop = [{"role": "assistant", "content": None, "tool_calls": [call(f"c{i}", "get", id=i)]}
            for i in range(3)]
    assert episode_from_messages(loop, 1, (6, 8)).summary == "Continued earlier work. Tools: get x3."


def episode(i: int, **kw: Any) -> Episode:
    return Episode(episode_id=i, turn_range=(10 * i, 10 * i + 9), summary=f"episode {i}", **kw)


def test_flush_half_when_over_max_episodes() -> None:
    memory = FoldedMemory()
    for i in range(4):
        memory, flushed = add_episode(memory, episode(i), max_episodes=4)
        assert flushed == []
    memory, flushed = add_episode(memory, episode(4), max_episodes=4)
    assert [e.episode_id for e in flushed] == [0, 1]
    assert [e.episode_id for e in memory.episodes] == [2, 3, 4]
    assert (memory.current_episode_id, memory.total_turns_seen) == (5, 50)


def test_flush_brings_an_oversized_memory_back_under_max() -> None:
    memory = FoldedMemory(episodes=[episode(i) for i in range(9)])
    memory, flushed = add_episode(memory, episode(9), max_episodes=4)
    assert len(flushed) == 6 and len(memory.episodes) == 4


def test_distill_dedupes_case_insensitively_newer_wins() -> None:
    existing = SemanticMemory(decisions=[Decision(decision="Use SQLite WAL", reason="old reason")],
                              facts=["config at /etc/app.yaml"])
    eps = [episode(0, decisions=[Decision(decision="use sqlite wal.", reason="new reason")],
                   eliminated=[Eliminated(approach="polling every 5s", why="rate limited")],
                   tool_results={"run(cmd=ls)": "3 files in /srv/data", "run(cmd=x)": "Error: boom 500"}),
           episode(1, eliminated=[Eliminated(approach="Polling every 5s", why="HTTP 429")])]
    sem = distill(eps, existing)
    assert [(d.decision, d.reason) for d in sem.decisions] == [("use sqlite wal.", "new reason")]
    assert [(e.approach, e.why) for e in sem.eliminated_approaches] == [("Polling every 5s", "HTTP 429")]
    # The error line is not a stable fact.
    assert sem.facts == ["config at /etc/app.yaml", "run(cmd=ls) → 3 files in /srv/data"]
    assert sem.patterns == ["Repeatedly ruled out: Polling every 5s"]
    newer = distill([episode(2, tool_results={"run(cmd=ls)": "4 files in /srv/data"})], sem)
    assert newer.facts == ["config at /etc/app.yaml", "run(cmd=ls) → 4 files in /srv/data"]


def test_distill_caps_every_list_dropping_the_oldest() -> None:
    eps = [episode(i, decisions=[Decision(decision=f"d{i}-{k}") for k in range(8)],
                   eliminated=[Eliminated(approach=f"a{i}-{k}") for k in range(8)],
                   tool_results={f"read(f{i}_{k})": f"size 10{k} at src/f{i}_{k}.py" for k in range(8)})
           for i in range(6)]
    sem = distill(eps, SemanticMemory(patterns=[f"p{i}" for i in range(15)]))
    assert len(sem.decisions) == CAPS["decisions"] and sem.decisions[-1].decision == "d5-7"
    assert len(sem.eliminated_approaches) == CAPS["eliminated_approaches"]
    assert len(sem.facts) == CAPS["facts"] and "src/f5_7.py" in sem.facts[-1]
    assert sem.patterns == [f"p{i}" for i in range(5, 15)]
    capped = apply_distilled(FoldedMemory(), SemanticMemory(facts=[f"f{i}" for i in range(50)] + ["F0"]))
    assert len(capped.semantic.facts) == 30 and capped.semantic.facts[-1] == "F0"


GOOD_EPISODE = {"summary": "Fixed the upload limit.",
                "decisions": [{"decision": "stream", "reason": "memory"}],
                "eliminated": [{"approach": "nginx limit", "why": "app enforces it"}],
                "open_questions": ["S3 lifecycle?"], "tool_results": {"run(make)": "ok build 42"}}


@pytest.mark.parametrize("wrap", [
    "{}", "```json\n{}\n```", "Here is the episode:\n```\n{}\n```\nDone.", "Sure! {} Hope that helps.",
    'A draft was {"summary": "draft"}; the final one:\n```json\n{}\n```'])
def test_parse_episode_accepts_fenced_or_embedded_json(wrap: str) -> None:
    ep = parse_episode(wrap.replace("{}", json.dumps(GOOD_EPISODE)), 3, (40, 59))
    assert ep is not None
    assert (ep.episode_id, ep.turn_range, ep.decisions[0].reason) == (3, (40, 59), "memory")


@pytest.mark.parametrize("bad", [
    {k: v for k, v in GOOD_EPISODE.items() if k != "decisions"},  # missing key
    {k: v for k, v in GOOD_EPISODE.items() if k != "summary"},
    GOOD_EPISODE | {"decisions": "stream"},  # wrong types
    GOOD_EPISODE | {"decisions": [{"reason": "no decision"}]},
    GOOD_EPISODE | {"open_questions": [1, 2]},
    GOOD_EPISODE | {"tool_results": {"run": {"nested": True}}},
    GOOD_EPISODE | {"summary": "  "},
])
def test_parse_episode_rejects_invalid_shapes(bad: dict[str, Any]) -> None:
    assert parse_episode(json.dumps(bad), 0, (0, 1)) is None


@pytest.mark.parametrize("text", ["", "no json here", "{not json}", "[1, 2]", '```json\n{"summary": \n```'])
def test_parse_rejects_non_objects(text: str) -> None:
    assert parse_episode(text, 0, (0, 1)) is None and parse_semantic(text) is None


def test_parse_semantic_validates_and_caps() -> None:
    good = {"facts": [f"f{i}" for i in range(40)], "decisions": [], "eliminated_approaches": [],
            "patterns": ["p"]}
    sem = parse_semantic("```json\n" + json.dumps(good) + "\n```")
    assert sem is not None and len(sem.facts) == 30
    assert parse_semantic(json.dumps({k: v for k, v in good.items() if k != "patterns"})) is None
    assert parse_semantic(json.dumps(good | {"decisions": [{"decision": 5}]})) is None


def test_prompts_carry_the_material_and_ask_for_json() -> None:
    ep_msgs = episode_prompt(SESSION)
    assert [m["role"] for m in ep_msgs] == ["system", "user"] and "JSON" in ep_msgs[0]["content"]
    assert "call_b2" in ep_msgs[1]["content"] and "pytest tests/test_upload.py -q" in ep_msgs[1]["content"]
    existing = SemanticMemory(facts=["port 8787"])
    sem_msgs = semantic_prompt([episode(0)], existing)
    payload = json.loads(sem_msgs[1]["content"])
    assert payload["existing_memory"]["facts"] == ["port 8787"]
    assert payload["episodes"][0]["summary"] == "episode 0"


def full_memory() -> FoldedMemory:
    sem = SemanticMemory(facts=["db at /var/lib/app.db"],
                         decisions=[Decision(decision="WAL", reason="readers")],
                         eliminated_approaches=[Eliminated(approach="polling", why="rate limits")],
                         patterns=["tests flake on CI"])
    return FoldedMemory(semantic=sem, episodes=[
        episode(i, decisions=[Decision(decision=f"choice {i}")], open_questions=[f"question {i}?"])
        for i in range(5)])


def test_render_puts_semantic_before_recent_episodes() -> None:
    text = render(full_memory(), recent_episodes=2)
    order = ["Facts:", "/var/lib/app.db", "Decisions:", "WAL (because readers)", "Ruled out:",
             "polling — rate limits", "Patterns:", "Episode 3, turns 30-39: episode 3", "decided: choice 3",
             "open: question 3?", "Episode 4"]
    positions = [text.index(s) for s in order]
    assert positions == sorted(positions)
    assert "Episode 2" not in text
    assert render(FoldedMemory()) == ""


def test_render_drops_oldest_episodes_then_trims_lists() -> None:
    memory = full_memory()
    full = render(memory, recent_episodes=5)
    smaller = render(memory, recent_episodes=5, max_chars=len(full) - 1)
    assert "Episode 0" not in smaller and "Episode 4" in smaller
    facts = SemanticMemory(facts=[f"fact number {i}" for i in range(30)])
    big = memory.model_copy(update={"semantic": facts})
    trimmed = render(big, max_chars=300)
    assert "Episode" not in trimmed and "(+" in trimmed and "fact number 29" in trimmed
    assert len(trimmed) <= 300


texts = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=60)
decisions = st.builds(Decision, decision=texts, reason=texts)
eliminateds = st.builds(Eliminated, approach=texts, why=texts)
episodes = st.builds(Episode, episode_id=st.integers(0, 10**6),
                     turn_range=st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), summary=texts,
                     decisions=st.lists(decisions, max_size=4), eliminated=st.lists(eliminateds, max_size=4),
                     open_questions=st.lists(texts, max_size=3),
                     tool_results=st.dictionaries(texts, texts, max_size=3))
semantics = st.builds(SemanticMemory, facts=st.lists(texts, max_size=35),
                      decisions=st.lists(decisions, max_size=25),
                      eliminated_approaches=st.lists(eliminateds, max_size=25),
                      patterns=st.lists(texts, max_size=12))
memories = st.builds(FoldedMemory, semantic=semantics, episodes=st.lists(episodes, max_size=6),
                     current_episode_id=st.integers(0, 1000), total_turns_seen=st.integers(0, 10**6))


@settings(max_examples=60, deadline=None)
@given(memories, st.integers(0, 8000), st.integers(0, 6))
def test_render_fits_max_chars_and_is_deterministic(
        memory: FoldedMemory, max_chars: int, recent: int) -> None:
    text = render(memory, recent_episodes=recent, max_chars=max_chars)
    assert len(text) <= max_chars
    reloaded = FoldedMemory.from_json(memory.to_json())
    assert text == render(reloaded, recent_episodes=recent, max_chars=max_chars)


@settings(max_examples=60, deadline=None)
@given(memories)
def test_json_round_trip(memory: FoldedMemory) -> None:
    assert FoldedMemory.from_json(memory.to_json()) == memory
    assert FoldedMemory.from_json(memory.to_json().encode()) == memory


@pytest.mark.parametrize("raw", [None, "", "not json", "[]", '{"version": 2, "episodes": []}',
                                 '{"episodes": "x"}', '{"version": 1, "episodes": [{"episode_id": "x"}]}'])
def test_from_json_tolerates_garbage_and_other_versions(raw: str | None) -> None:
    assert FoldedMemory.from_json(raw) == FoldedMemory()


@settings(max_examples=40, deadline=None)
@given(conversation(), st.integers(0, 50))
def test_compactor_is_deterministic_and_bounded(messages: list[dict[str, Any]], start: int) -> None:
    first = episode_from_messages(messages, 7, (start, start + len(messages)))
    again = episode_from_messages(json.loads(json.dumps(messages)), 7, (start, start + len(messages)))
    assert first.model_dump_json() == again.model_dump_json()
    for items in (first.decisions, first.eliminated, first.open_questions, first.tool_results):
        assert len(items) <= EPISODE_CAP
    assert all(len(v) <= 160 for v in first.tool_results.values())
    assert episode_prompt(messages) == episode_prompt(messages)


prose = st.lists(st.sampled_from([
    "We decided to use Redis because it is already deployed.", "Polling doesn't work since it hits 429.",
    "Is the cache warm?", "Tried a retry loop, it failed.",
    "Going with plan B instead of plan A, as A is slow.",
    "The parser is not the issue.", "Done.", "What about /etc/hosts?",
]), min_size=1, max_size=30).map(" ".join)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["user", "assistant"]), prose), min_size=1, max_size=8))
def test_distill_is_deterministic_and_capped(turns: list[tuple[str, str]]) -> None:
    msgs = [{"role": r, "content": t} for r, t in turns]
    eps = [episode_from_messages(msgs[: i + 1], i, (i, i)) for i in range(len(msgs))]
    sem = distill(eps, SemanticMemory())
    assert sem == distill(eps, SemanticMemory())
    for name, cap in CAPS.items():
        assert len(getattr(sem, name)) <= cap
    keys = [d.decision.casefold() for d in sem.decisions]
    assert len(keys) == len(set(keys))
