"""Folded memory: evicted turns fold into small episodes (L2); old episodes distill into semantic memory (L3).

Pure and deterministic: no I/O, no clock, no model calls. The model path (prompts and answer checks) is
in folded_model.py; when it fails the proxy falls back to `episode_from_messages`/`distill` here, which
use plain sentence heuristics.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from proxy import shallow_json

VERSION = 1
EPISODE_CAP = 8  # items per episode list: an episode is a digest, not a transcript
CAPS = {"facts": 30, "decisions": 20, "eliminated_approaches": 20, "patterns": 10}
TOOL_VALUE_CHARS = 160
ITEM_CHARS = 240  # longest text render() prints for one item
T = TypeVar("T")


class Decision(BaseModel):
    decision: str
    reason: str = ""


class Eliminated(BaseModel):
    approach: str
    why: str = ""


class Episode(BaseModel):
    episode_id: int
    turn_range: tuple[int, int]
    summary: str
    decisions: list[Decision] = []
    eliminated: list[Eliminated] = []
    open_questions: list[str] = []
    tool_results: dict[str, str] = {}


class SemanticMemory(BaseModel):
    facts: list[str] = []
    decisions: list[Decision] = []
    eliminated_approaches: list[Eliminated] = []
    patterns: list[str] = []


class FoldedMemory(BaseModel):
    semantic: SemanticMemory = SemanticMemory()
    episodes: list[Episode] = []
    current_episode_id: int = 0
    total_turns_seen: int = 0
    version: int = VERSION

    def to_json(self) -> str:
        return orjson.dumps(self.model_dump(mode="json")).decode()

    @classmethod
    def from_json(cls, raw: str | bytes | None) -> FoldedMemory:
        """State from an older or broken build must never stop a session: start empty instead."""
        try:
            data = orjson.loads(raw or b"")
            if isinstance(data, dict) and data.get("version") == VERSION:
                return cls.model_validate(data)
        except (orjson.JSONDecodeError, ValidationError, TypeError):
            pass
        return cls()


def _text(content: Any) -> str:
    if isinstance(content, list):
        content = "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content.replace("\u2019", "'") if isinstance(content, str) else ""


def _clip(text: str, limit: int) -> str:
    """Cut at a space, so an id or path at the edge is dropped whole rather than shown half."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    if " " in cut[limit // 2:]:
        cut = cut[: cut.rfind(" ")]
    return cut.rstrip() + "…"


def _first_line(text: str) -> str:
    """First line that says something: rules like "-----" and blank lines are skipped."""
    return next((ln.strip() for ln in text.splitlines() if re.search(r"\w", ln)), "")


def _sentences(text: str) -> list[str]:
    """Prose sentences; fenced code is skipped (decisions are stated in prose)."""
    out: list[str] = []
    in_code = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        line = re.sub(r"^\s*(?:[-*#>]+|\d+[.)])\s*", "", line).strip()
        if not in_code and line:
            out += [s.strip() for s in re.split(r"(?<=[.!?])\s+", line) if s.strip()]
    return out


def _key(text: str) -> str:
    return " ".join(text.casefold().split()).rstrip(".!;:, ")


def _dedupe_newest(items: Iterable[T], key: Callable[[T], str], cap: int) -> list[T]:
    """A later item replaces an earlier one with the same key and moves to the end; caps drop the oldest."""
    seen: dict[str, T] = {}
    for item in items:
        if k := key(item):
            seen.pop(k, None)
            seen[k] = item
    return list(seen.values())[-cap:] if cap > 0 else []


# ---- deterministic compactor (L1 → L2 without a model)

_DECIDE = re.compile(r"\b(?:decided|decide to|will use|we'll use|I'll use|chose|choosing|going with|go with|"
                     r"opted|settled on|switch(?:ed|ing)? to|instead of)\b", re.I)
# Only ", as" counts: a bare "as" is mostly "such as" / "as well" and would cut a decision in half.
_REASON = re.compile(r"\s*(?:\bbecause\b(?:\s+of\b)?|\bsince\b|\bdue to\b|,\s*as\b)\s*", re.I)
_STRONG = (r"does(?:n't| not) work|did(?:n't| not) work|won't work|will not work|ruled out|rules? out|"
           r"not the (?:issue|problem|cause|culprit)|dead end|no longer works")
# "failed" alone is mostly a status report ("3 tests failed"): it counts for an attempt or with a reason.
_WEAK = r"failed|fails|did(?:n't| not) help|does(?:n't| not) help"
_ELIM = re.compile(rf"\b(?:{_STRONG}|{_WEAK})\b", re.I)
_ATTEMPT = re.compile(r"\b(?:tried|trying|attempt\w*|approach)\b", re.I)
_AUX = re.compile(r"(?:\s+\b(?:is|was|are|were|has|have|had|just|also|still|definitely|already|so|it)\b)+$",
                  re.I)
_STOP = frozenset(["what", "which", "when", "where", "does", "should", "would", "could", "this", "that",
                   "there", "with", "from", "have", "into", "about", "your", "they", "then", "also", "will"])


def _split_reason(sentence: str) -> tuple[str, str]:
    m = _REASON.search(sentence)
    if not m or m.start() == 0:
        return sentence.rstrip(" .!"), ""
    return sentence[: m.start()].rstrip(" ,.!"), sentence[m.end():].rstrip(" .!")


def _decision(sentence: str) -> Decision | None:
    if sentence.endswith("?") or not _DECIDE.search(sentence):
        return None
    what, why = _split_reason(sentence)
    return Decision(decision=_clip(what, ITEM_CHARS), reason=_clip(why, ITEM_CHARS))


def _eliminated(sentence: str) -> Eliminated | None:
    m = _ELIM.search(sentence)
    if sentence.endswith("?") or not m:
        return None
    clause, why = _split_reason(sentence)
    if re.fullmatch(_WEAK, m.group(0), re.I) and not why and not _ATTEMPT.search(sentence):
        return None
    approach = _AUX.sub("", sentence[: m.start()].rstrip(" ,;:-")).strip(" ,;:-")
    if approach:
        why = why or sentence[m.start():].rstrip(" .!")
    else:  # "Ruled out X because Y": the approach follows the verdict
        approach = clause[m.end():].strip(" ,:") or clause
    return Eliminated(approach=_clip(approach, ITEM_CHARS), why=_clip(why, ITEM_CHARS))


def _keywords(text: str) -> set[str]:
    return {w for w in re.findall(r"[\w./-]{4,}", text.casefold()) if w not in _STOP}


def _open_questions(spoken: list[tuple[str, str]]) -> list[str]:
    """Open unless the other party spoke later, or later text repeats half of the question's keywords."""
    out: list[str] = []
    for i, (role, text) in enumerate(spoken):
        later = spoken[i + 1:]
        for q in (s for s in _sentences(text) if s.endswith("?") and len(s.split()) >= 3):
            words = _keywords(q)
            need = max(2, (len(words) + 1) // 2)
            if not any(r != role or len(words & _keywords(t)) >= need for r, t in later):
                out.append(_clip(q, ITEM_CHARS))
    return out


def _call_label(call: dict[str, Any]) -> str:
    fn = call.get("function") or {}
    try:  # arguments are the model's text: anything goes (nesting past the limit: shown as text)
        args = shallow_json.loads(fn.get("arguments") or "null")
        if isinstance(args, dict):
            args = ", ".join(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in args.items())
    except (TypeError, ValueError):
        args = fn.get("arguments")
    return f"{fn.get('name') or 'tool'}({_clip(str(args or ''), 100)})"


def _tool_value(text: str) -> str:
    value = _first_line(text)
    errors = (ln.strip() for ln in text.splitlines() if re.search(r"error|exception|traceback", ln, re.I))
    error = next(errors, "")
    if error and error != value:  # an error line further down matters more than a banner line
        value = f"{value} | {error}" if value else error
    return _clip(value, TOOL_VALUE_CHARS)


def _capped(ep: Episode) -> Episode:
    return ep.model_copy(update={
        "decisions": _dedupe_newest(ep.decisions, lambda d: _key(d.decision), EPISODE_CAP),
        "eliminated": _dedupe_newest(ep.eliminated, lambda e: _key(e.approach), EPISODE_CAP),
        "open_questions": _dedupe_newest(ep.open_questions, _key, EPISODE_CAP),
        "tool_results": {k: _clip(v, TOOL_VALUE_CHARS)
                         for k, v in list(ep.tool_results.items())[-EPISODE_CAP:]},
    })


def episode_from_messages(messages: list[dict[str, Any]], episode_id: int,
                          turn_range: tuple[int, int]) -> Episode:
    """Fallback compactor for OpenAI chat messages: the same messages always give the same episode."""
    labels: dict[str, str] = {}
    tools: dict[str, str] = {}
    spoken: list[tuple[str, str]] = []
    decisions: list[Decision] = []
    eliminated: list[Eliminated] = []
    for msg in messages:
        role, text = msg.get("role"), _text(msg.get("content"))
        if role in ("user", "assistant") and text.strip():
            spoken.append((str(role), text))
        if role == "assistant":
            calls = [c for c in msg.get("tool_calls") or () if isinstance(c, dict)]
            labels |= {str(c.get("id")): _call_label(c) for c in calls}
            for s in _sentences(text):
                if d := _decision(s):
                    decisions.append(d)
                elif e := _eliminated(s):
                    eliminated.append(e)
        elif role == "tool":
            call_id = str(msg.get("tool_call_id"))
            label = labels.get(call_id) or str(msg.get("name") or msg.get("tool_call_id") or "tool")
            tools.pop(label, None)  # a repeated call keeps its newest result
            tools[label] = _tool_value(text)
    asked = next((_first_line(t) for r, t in spoken if r == "user"), "")
    outcome = next((_first_line(t) for r, t in reversed(spoken) if r == "assistant"), "")
    names = Counter(label.split("(")[0] for label in labels.values()).most_common(4)
    used = ", ".join(f"{n} x{k}" if k > 1 else n for n, k in names)
    summary = f"Asked: {_clip(asked, 200)}" if asked else "Continued earlier work."
    summary += f" Tools: {used}." if used else ""
    summary += f" Outcome: {_clip(outcome, 200)}" if outcome else ""
    return _capped(Episode(episode_id=episode_id, turn_range=turn_range, summary=summary, decisions=decisions,
                           eliminated=eliminated, open_questions=_open_questions(spoken), tool_results=tools))


# ---- L2 → L3 and the flush-half rule

# Stable-looking: a path, file name, hex id, version or multi-digit number; error lines are transient state.
_FACTLIKE = re.compile(r"\w/[\w.-]|\b[\w-]+\.[a-z]{1,5}\b|\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,}\b|"
                       r"\b\d+(?:\.\d+)+\b|\b\d{2,}\b", re.I)
_TRANSIENT = re.compile(r"error|exception|traceback|failed|not found|denied|timed? ?out", re.I)


def _normalized(s: SemanticMemory) -> SemanticMemory:
    return SemanticMemory(
        # A fact "call → result" is keyed by its call: a newer result of the same call replaces the old one.
        facts=_dedupe_newest((f.strip() for f in s.facts), lambda f: _key(f.split(" → ")[0]), CAPS["facts"]),
        decisions=_dedupe_newest(s.decisions, lambda d: _key(d.decision), CAPS["decisions"]),
        eliminated_approaches=_dedupe_newest(s.eliminated_approaches, lambda e: _key(e.approach),
                                             CAPS["eliminated_approaches"]),
        patterns=_dedupe_newest((p.strip() for p in s.patterns), _key, CAPS["patterns"]),
    )


def distill(episodes: list[Episode], existing: SemanticMemory) -> SemanticMemory:
    """Fallback L2→L3: existing memory, then episodes oldest to newest; newer wins, caps drop the oldest.

    Facts are tool results whose line names a path/id/number and is not an error. Patterns are approaches
    ruled out, or questions left open, in two or more of these episodes.
    """
    facts, decisions = list(existing.facts), list(existing.decisions)
    eliminated = list(existing.eliminated_approaches)
    seen_in: dict[str, tuple[str, set[int]]] = {}  # case-folded label -> (newest wording, episode ids)
    for ep in episodes:
        decisions += ep.decisions
        eliminated += ep.eliminated
        facts += [f"{k} → {v}" for k, v in ep.tool_results.items()
                  if _FACTLIKE.search(v) and not _TRANSIENT.search(v)]
        for label in [f"Repeatedly ruled out: {e.approach}" for e in ep.eliminated] + [
                f"Recurring open question: {q}" for q in ep.open_questions]:
            seen_in[_key(label)] = (label, seen_in.get(_key(label), ("", set()))[1] | {ep.episode_id})
    patterns = list(existing.patterns) + [p for p, ids in seen_in.values() if len(ids) >= 2]
    return _normalized(SemanticMemory(facts=facts, decisions=decisions, eliminated_approaches=eliminated,
                                      patterns=patterns))


def add_episode(memory: FoldedMemory, episode: Episode,
                max_episodes: int) -> tuple[FoldedMemory, list[Episode]]:
    """Append; past `max_episodes` hand back the oldest half (more if needed) for the caller to distill."""
    if max_episodes < 1:
        raise ValueError("max_episodes must be at least 1")
    episodes, flushed = [*memory.episodes, episode], []
    if len(episodes) > max_episodes:
        n = max(max_episodes // 2, len(episodes) - max_episodes)
        flushed, episodes = episodes[:n], episodes[n:]
    return memory.model_copy(update={
        "episodes": episodes,
        "current_episode_id": max(memory.current_episode_id, episode.episode_id + 1),
        "total_turns_seen": max(memory.total_turns_seen, episode.turn_range[1] + 1),
    }), flushed


def apply_distilled(memory: FoldedMemory, semantic: SemanticMemory) -> FoldedMemory:
    """Replace L3 (a model was given the old one to merge into); dedupe and caps still hold."""
    return memory.model_copy(update={"semantic": _normalized(semantic)})


# ---- rendering

def _items(lines: list[str], limit: int | None) -> list[str]:
    """Trimming keeps the newest items; the count of hidden (oldest) ones comes first."""
    if limit is None or len(lines) <= limit:
        return lines
    return [f"- (+{len(lines) - limit} more)", *lines[len(lines) - limit:]]


def _compose(memory: FoldedMemory, episodes: list[Episode], limit: int | None) -> str:
    s, c = memory.semantic, (lambda t: _clip(t, ITEM_CHARS))
    sections = {
        "Facts:": [f"- {c(f)}" for f in s.facts],
        "Decisions:": [f"- {c(d.decision)}" + (f" (because {c(d.reason)})" if d.reason else "")
                       for d in s.decisions],
        "Ruled out:": [f"- {c(e.approach)}" + (f" — {c(e.why)}" if e.why else "")
                       for e in s.eliminated_approaches],
        "Patterns:": [f"- {c(p)}" for p in s.patterns],
    }
    out: list[str] = []
    if any(sections.values()):
        out.append("### Durable knowledge")
        for title, lines in sections.items():
            out += [title, *_items(lines, limit)] if lines else []
    if episodes:
        out.append("### Recent episodes (oldest first)")
    for ep in episodes:
        out.append(f"Episode {ep.episode_id}, turns {ep.turn_range[0]}-{ep.turn_range[1]}: "
                   f"{_clip(ep.summary, 2 * ITEM_CHARS)}")
        out += [f"- decided: {c(d.decision)}" for d in ep.decisions[-3:]]
        out += [f"- open: {c(q)}" for q in ep.open_questions[-2:]]
    head = "## Folded memory (summaries of earlier turns; `recall` finds the originals)"
    return "\n".join([head, *out]) if out else ""


def render(memory: FoldedMemory, *, recent_episodes: int = 3, max_chars: int = 6000) -> str:
    """Semantic memory first, then a digest of the newest episodes; shrunk until it fits `max_chars`."""
    episodes = memory.episodes[-recent_episodes:] if recent_episodes > 0 else []
    s = memory.semantic
    longest = max(len(s.facts), len(s.decisions), len(s.eliminated_approaches), len(s.patterns))
    # Shrink order: drop the oldest episode digests, then show fewer (newest) items per list.
    attempts: list[tuple[list[Episode], int | None]] = [(episodes[i:], None)
                                                         for i in range(len(episodes) + 1)]
    attempts += [([], limit) for limit in range(longest - 1, -1, -1)]
    for shown, limit in attempts:
        text = _compose(memory, shown, limit)
        if len(text) <= max_chars:
            return text
    while len(text) > max_chars:  # only a tiny max_chars gets here: drop whole lines from the end
        text = text.rsplit("\n", 1)[0] if "\n" in text else ""
    return text
