"""Auto-summary headlines as an index: actions with arguments, ids, errors, handles, the user's words."""

from __future__ import annotations

import dataclasses
from itertools import pairwise
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.layers.auto_summary import Headline, headline, render, shown_in_full
from proxy.layers.identifiers import clip
from proxy.tokens import TokenCounter
from tests.strategies import conversation, long_conversation

NOW = 1_700_000_000.0


def count(message: dict[str, Any]) -> int:
    return len(str(message.get("content") or "")) // 4 + 4


def count_text(text: str) -> int:
    return len(text) // 4 + 1


def call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": orjson.dumps(arguments).decode()}}


TAU = [
    {"role": "user", "content": "Sure, my user ID is ivan_rossi_8555. I don't have my reservation ID handy."},
    {"role": "assistant", "content": None, "tool_calls": [call("c1", "get_user_details",
                                                               {"user_id": "ivan_rossi_8555"})]},
    {"role": "tool", "tool_call_id": "c1", "content": orjson.dumps({
        "user_id": "ivan_rossi_8555", "name": {"first_name": "Ivan", "last_name": "Rossi"},
        "address": {"address1": "513 Main Street"}, "reservations": ["OWZ4XL", "F3IQK1"]}).decode()},
    {"role": "assistant", "content": "I found two reservations, OWZ4XL and F3IQK1. Which one is it?"},
]
MINI = [
    {"role": "assistant", "content": "THOUGHT: find where W042 is raised.\n\n```bash\n"
                                     "grep -rn \"W042\" django/db/models\n```"},
    {"role": "user", "content": "<returncode>1</returncode>\n<output>\ndjango/db/models/base.py:1301: "
                                "id='models.W042',\nTraceback (most recent call last):\n"
                                "ValueError: bad primary key\n</output>"},
]
SWE = [
    {"role": "assistant", "content": "Let me open the file.\n```\nopen src/marshmallow/fields.py 1474\n```"},
    {"role": "user", "content": "[File: /marshmallow-code__marshmallow/src/marshmallow/fields.py]\n"
                                "1474:        return int(value.total_seconds() / base_unit.total_seconds())\n"
                                "(Open file: /marshmallow-code__marshmallow/src/marshmallow/fields.py)\n"
                                "(Current directory: /marshmallow-code__marshmallow)\nbash-$"},
]


def is_output(message: dict[str, Any]) -> bool:
    content = str(message.get("content") or "")
    return content.startswith("<returncode>") or content.endswith("bash-$")


def test_tool_call_exchange_names_call_arguments_ids_and_handle():
    entry = headline(TAU, NOW, count, handles={2: "h-user"})
    assert entry.said == TAU[0]["content"]
    (step,) = entry.steps
    assert step["do"] == "get_user_details(user_id=ivan_rossi_8555)"
    assert step["handle"] == "h-user"
    assert "OWZ4XL" in step["found"] and "F3IQK1" in step["found"]
    assert "address1" not in step["found"] and "ivan_rossi_8555" not in step["found"]  # keys; already shown
    line = render([entry], NOW, 2_000, count_text).splitlines()[2]
    assert "get_user_details(user_id=ivan_rossi_8555) → OWZ4XL, F3IQK1 [call_id=h-user]" in line
    assert line.endswith("→ I found two reservations, OWZ4XL and F3IQK1. Which one is it?")


def test_text_protocol_exchange_names_the_command_not_the_return_code():
    entry = headline(MINI, NOW, count, handles={1: "obs-7"}, observation=is_output)
    assert entry.said == "" and entry.asked == '$ grep -rn "W042" django/db/models'
    (step,) = entry.steps
    assert step["handle"] == "obs-7" and "django/db/models/base.py" in step["found"]
    assert step["errors"] == ["returncode 1", "ValueError: bad primary key"]
    block = render([entry], NOW, 2_000, count_text)
    assert "<returncode>" not in block and '$ grep -rn "W042" django/db/models' in block
    assert "[call_id=obs-7]" in block


def test_swe_agent_observation_trailer_is_not_a_finding():
    entry = headline(SWE, NOW, count, handles={1: "obs-2"}, observation=is_output)
    (step,) = entry.steps
    assert step["do"] == "$ open src/marshmallow/fields.py 1474" and step["handle"] == "obs-2"
    assert "/marshmallow-code__marshmallow" not in step["found"]  # the `(Current directory: …)` trailer


def test_human_instruction_kept_verbatim_even_when_long_and_multiline():
    words = "Please do not touch reservation OWZ4XL;\nonly change F3IQK1, and refund to my credit card. " * 8
    exchange = [{"role": "user", "content": words}, {"role": "assistant", "content": "OK."}]
    entry = headline(exchange, NOW, count)
    assert entry.said == words.strip()
    assert orjson.dumps(entry.said).decode() in render([entry], NOW, 5_000, count_text)


def test_observation_is_not_said():
    entry = headline(list(reversed(MINI)), NOW, count, observation=is_output)
    assert entry.said == "" and entry.steps[0]["do"] == "(output)"


def test_clip_never_cuts_mid_word():
    text = "alpha beta gamma delta epsilon"
    assert clip(text, 13) == "alpha beta…" and clip(text, 100) == text
    entry = headline([{"role": "user", "content": "x" * 20 + " " + "word " * 40}], NOW, count)
    assert entry.asked.endswith("…") and entry.asked[:-1].split()[-1] in ("word", "x" * 20)


def entries(n: int, said_every: int = 2) -> list[Headline]:
    out = []
    for i in range(n):
        user = {"role": "user", "content": f"Instruction {i}: keep order O{i}X as it is."}
        messages = ([user] if i % said_every == 0 else []) + [
            {"role": "assistant", "content": None,
             "tool_calls": [call(f"c{i}", "get_order", {"order_id": f"O{i}X"})]},
            {"role": "tool", "tool_call_id": f"c{i}",
             "content": f"order O{i}X status pending items " + " ".join(f"ITEM{i}{c}" for c in "ABCDEFGH")},
        ]
        out.append(headline(messages, NOW - 60 * (n - i), count, handles={len(messages) - 1: f"h{i}"}))
    return out


def test_budget_sheds_details_of_older_entries_before_the_users_words():
    items = entries(10)
    full = render(items, NOW, 100_000, count_text)
    tight = render(items, NOW, count_text(full) * 7 // 10, count_text)
    assert count_text(tight) <= count_text(full) * 7 // 10
    assert all(f'"Instruction {i}: keep order O{i}X as it is."' in tight for i in range(0, 10, 2))
    assert "ITEM9A" in tight and "ITEM0A" not in tight  # the newest keeps its details longest
    assert "not listed" not in tight
    # an entry shed to its bare line still names the handle that reads its result back (one call away)
    assert all(f"[call_id=h{i}]" in tight for i in range(10))
    tighter = render(items, NOW, 260, count_text)  # too small for every line: entries without words go first
    assert count_text(tighter) <= 260 and "older exchanges not listed" in tighter
    assert all(f"Instruction {i}:" in tighter for i in (4, 6, 8)) and "O1X" not in tighter


def test_old_rows_without_new_fields_load_and_render():
    row = {"at": NOW, "asked": "hello", "tools": "run x2", "outcome": "done", "tokens": 1200,
           "model_line": None}
    entry = Headline(**row)
    assert entry.said == "" and entry.steps == []
    assert "hello · tools: run x2 · → done" in render([entry], NOW, 1_000, count_text)
    saved = orjson.loads(orjson.dumps(dataclasses.asdict(headline(TAU, NOW, count, handles={2: "h"}))))
    assert Headline(**saved) == headline(TAU, NOW, count, handles={2: "h"})


def test_model_line_keeps_the_users_words_and_handles():
    entry = headline(TAU, NOW, count, handles={2: "h-user"})
    entry.model_line = "Looked up the user's reservations."
    line = render([entry], NOW, 2_000, count_text).splitlines()[2]
    assert '"Sure, my user ID is ivan_rossi_8555.' in line and "Looked up" in line
    assert "call_id=h-user" in line


@settings(max_examples=40, deadline=None)
@given(conversation(max_turns=4), st.integers(50, 3_000))
def test_headlines_and_render_are_deterministic_and_within_budget(messages, budget):
    def build() -> list[Headline]:
        cuts = [i for i, m in enumerate(messages) if m.get("role") == "user"] + [len(messages)]
        return [headline(messages[a:b], NOW - b, count, handles={0: f"h{a}"}) for a, b in pairwise(cuts)]

    first, second = build(), build()
    assert first == second
    text = render(first, NOW, budget, count_text)
    assert text == render(second, NOW, budget, count_text)
    assert count_text(text) <= budget or "not listed" in text or len(first) == 0


TOKENS = TokenCounter()


def exact_text(text: str) -> int:
    return TOKENS.text(text, "gpt-4o")


@settings(max_examples=60, deadline=None)
@given(st.lists(long_conversation(), min_size=1, max_size=2), st.integers(40, 2_500), st.integers(0, 8))
def test_only_the_entries_shown_in_full_need_their_details(histories, budget, earlier):
    """Built without details, the entries the block may show in full are named; given details only
    those, the block is the one every entry with details gives (real token counts: BPE's quirks)."""
    messages = [m for history in histories for m in history]
    cuts = [i for i, m in enumerate(messages) if m.get("role") in ("user", "assistant")] + [len(messages)]
    spans = list(pairwise(cuts))
    handles = [{b - a - 1: f"h{a}"} for a, b in spans]
    detailed = [headline(messages[a:b], NOW - 60 * (len(spans) - n), count, handles=h)
                for n, ((a, b), h) in enumerate(zip(spans, handles, strict=True))]
    plain = [headline(messages[a:b], NOW - 60 * (len(spans) - n), count, handles=h, details=False)
             for n, ((a, b), h) in enumerate(zip(spans, handles, strict=True))]
    older = detailed[:earlier]  # entries of earlier batches, built with the rule before (all details here)
    full = shown_in_full([*older, *plain[earlier:]], NOW, budget, exact_text)[len(older):]
    chosen = [with_details if shown else without for with_details, without, shown
              in zip(detailed[earlier:], plain[earlier:], full, strict=True)]
    assert render([*older, *chosen], NOW, budget, exact_text) == render(detailed, NOW, budget, exact_text)


def reference_render(entries: list[Headline], now: float, max_tokens: int, count_text) -> str:
    """render as it was before its costs were measured lazily: every line at every level, up front."""
    from proxy.layers.auto_summary import AGE_LABELS, BARE, BRIEF, FULL, _compose, _line
    total_tokens = sum(e.tokens for e in entries)
    cost = [[count_text(_line(e, level)) + 1 for level in (BARE, BRIEF, FULL)] for e in entries]
    frame = count_text(_compose([], [], 1, total_tokens, len(entries), now)) + 8 * len(AGE_LABELS)
    levels = [FULL] * len(entries)
    total = frame + sum(c[FULL] for c in cost)
    for target in (BRIEF, BARE):
        for index in range(len(entries) - 1):
            if total <= max_tokens:
                break
            if levels[index] > target:
                total -= cost[index][levels[index]] - cost[index][target]
                levels[index] = target
    order = [i for i, e in enumerate(entries) if not e.said] + [i for i, e in enumerate(entries) if e.said]
    dropped: set[int] = set()
    for index in order:
        if total <= max_tokens:
            break
        dropped.add(index)
        total -= cost[index][levels[index]]
    while True:
        kept = [i for i in range(len(entries)) if i not in dropped]
        text = _compose([entries[i] for i in kept], [levels[i] for i in kept], len(dropped), total_tokens,
                        len(entries), now)
        if not kept or count_text(text) <= max_tokens:
            return text
        dropped.add(next(i for i in order if i not in dropped))


@settings(max_examples=60, deadline=None)
@given(long_conversation(), st.integers(20, 3_000))
def test_render_measuring_lazily_is_render_measuring_everything(messages, budget):
    cuts = [i for i, m in enumerate(messages) if m.get("role") in ("user", "assistant")] + [len(messages)]
    entries = [headline(messages[a:b], NOW - b, count, handles={0: f"h{a}"}) for a, b in pairwise(cuts)]
    assert render(entries, NOW, budget, exact_text) == reference_render(entries, NOW, budget, exact_text)


def test_lines_measured_to_decide_are_not_measured_again_to_render():
    items = entries(30)
    budget = count_text(render(items, NOW, 100_000, count_text)) * 7 // 10  # some entries shed details
    costs: dict[tuple[int, int], int] = {}
    shown = shown_in_full(items, NOW, budget, count_text, costs)
    assert 0 < sum(shown) < len(items)
    measured: list[str] = []

    def spy(text: str) -> int:
        measured.append(text)
        return count_text(text)

    block = render(items, NOW, budget, spy, costs)
    assert measured and measured[-1] == block  # the block itself is checked
    assert not any(text.startswith("- (") for text in measured)  # but no line is measured again
