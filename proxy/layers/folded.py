"""Folded memory: evicted turns become small episodes (L2), old episodes are distilled into semantic memory (L3).

Pure and deterministic: no I/O, no clock, no model calls. The proxy sends `episode_prompt`/`semantic_prompt`
through its own upstream and validates the answer with `parse_episode`/`parse_semantic`; when that fails it
falls back to `episode_from_messages`/`distill`, which use plain sentence heuristics.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

VERSION = 1
EPISODE_CAP = 8  # items per episode list: an episode must stay a digest, not a transcript
CAPS = {"facts": 30, "decisions": 20, "eliminated_approaches": 20, "patterns": 10}
TOOL_VALUE_CHARS = 160
ITEM_CHARS = 240  # longest line render() prints for one item
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
        """Stored state from an older or broken build must never stop a session: start empty instead."""
        try:
            data = orjson.loads(raw or b"")
            if isinstance(data, dict) and data.get("version") == VERSION:
                return cls.model_validate(data)
        except (orjson.JSONDecodeError, ValidationError, TypeError):
            pass
        return cls()


# ---------------------------------------------------------------- text helpers

def _text(content: Any) -> str:
    if isinstance(content, list):
        content = "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content.replace("\u2019", "'") if isinstance(content, str) else ""


def _clip(text: str, limit: int) -> str:
    """Cut at a space so an id or a path at the edge is dropped whole rather than shown broken."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    if " " in cut[limit // 2:]:
        cut = cut[: cut.rfind(" ")]
    return cut.rstrip() + "…"


def _first_line(text: str) -> str:
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")


def _sentences(text: str) -> list[str]:
    """Prose sentences, skipping fenced code (decisions are stated in prose, not in code)."""
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
    """Later items replace earlier ones with the same key and move to the end; the oldest go past the cap."""
    seen: dict[str, T] = {}
    for item in items:
        k = key(item)
        if k:
            seen.pop(k, None)
            seen[k] = item
    return list(seen.values())[-cap:] if cap > 0 else []


# ---------------------------------------------------------------- deterministic compactor

_DECIDE = re.compile(r"\b(?:decided|decide to|will use|we'll use|I'll use|chose|choosing|going with|go with|"
                     r"opted|settled on|switch(?:ed|ing)? to|instead of)\b", re.I)
# Only ", as" counts: a bare "as" is mostly "such as" / "as well" and would cut decisions in half.
_REASON = re.compile(r"\s*(?:\bbecause\b(?:\s+of\b)?|\bsince\b|\bdue to\b|,\s*as\b)\s*", re.I)
_STRONG = (r"does(?:n't| not) work|did(?:n't| not) work|won't work|will not work|ruled out|rules? out|"
           r"not the (?:issue|problem|cause|culprit)|dead end|no longer works")
# "failed" alone is mostly a status report ("3 tests failed"); it counts only for an attempt or with a reason.
_WEAK = r"failed|fails|did(?:n't| not) help|does(?:n't| not) help"
_ELIM = re.compile(rf"\b(?:{_STRONG}|{_WEAK})\b", re.I)
_ATTEMPT = re.compile(r"\b(?:tried|trying|attempt\w*|approach)\b", re.I)
_AUX = re.compile(r"(?:\s+\b(?:is|was|are|were|has|have|had|just|also|still|definitely|already|so|it)\b)+$", re.I)
_STOP = frozenset("what which when where does should would could this that there with from have into about "
                  "your them they then than also just will".split())


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
    weak = re.fullmatch(_WEAK, m.group(0), re.I) is not None
    if weak and not why and not _ATTEMPT.search(sentence):
        return None
    before = _AUX.sub("", sentence[: m.start()].rstrip(" ,;:-")).strip()
    if before:
        approach = before
        why = why or sentence[m.start():].rstrip(" .!")
    else:  # "Ruled out X because Y": the approach follows the verdict
        approach = clause[m.end():].strip(" ,:") or clause
    return Eliminated(approach=_clip(approach, ITEM_CHARS), why=_clip(why, ITEM_CHARS))


def _keywords(text: str) -> set[str]:
    return {w for w in re.findall(r"[\w./-]{4,}", text.casefold()) if w not in _STOP}


def _open_questions(spoken: list[tuple[int, str, str]]) -> list[str]:
    """A question is open unless the other party spoke later, or later text repeats half its keywords."""
    out: list[str] = []
    for i, (_, role, text) in enumerate(spoken):
        later = spoken[i + 1:]
        for q in (s for s in _sentences(text) if s.endswith("?") and len(s.split()) >= 3):
            words = _keywords(q)
            need = max(2, (len(words) + 1) // 2)
            answered = any(r != role for _, r, _ in later) or any(
                len(words & _keywords(t)) >= need for _, _, t in later)
            if not answered:
                out.append(_clip(q, ITEM_CHARS))
    return out


def _call_label(call: dict[str, Any]) -> str:
    fn = call.get("function") or {}
    raw = fn.get("arguments") or ""
    try:
        args = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        args = raw
    if isinstance(args, dict):
        shown = ", ".join(f"{k}={v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}"
                          for k, v in args.items())
    else:
        shown = str(args)
    return f"{fn.get('name') or 'tool'}({_clip(shown, 100)})"


def _tool_value(text: str) -> str:
    value = _first_line(text)
    error = next((ln.strip() for ln in text.splitlines() if re.search(r"error|exception|traceback", ln, re.I)),
                 "")
    if error and error != value:  # an error line further down matters more than a banner line
        value = f"{value} | {error}" if value else error
    return _clip(value, TOOL_VALUE_CHARS)


def episode_from_messages(messages: list[dict[str, Any]], episode_id: int,
                          turn_range: tuple[int, int]) -> Episode:
    """Fallback L1→L2 compactor: no model, same messages always give the same episode."""
    labels: dict[str, str] = {}
    tools: dict[str, str] = {}
    spoken: list[tuple[int, str, str]] = []
    decisions: list[Decision] = []
    eliminated: list[Eliminated] = []
    for idx, msg in enumerate(messages):
        role, text = msg.get("role"), _text(msg.get("content"))
        if role == "assistant":
            for call in msg.get("tool_calls") or ():
                if isinstance(call, dict):
                    labels[str(call.get("id"))] = _call_label(call)
            for s in _sentences(text):
                d = _decision(s)
                e = None if d else _eliminated(s)
                decisions += [d] if d else []
                eliminated += [e] if e else []
        if role in ("user", "assistant") and text.strip():
            spoken.append((idx, role, text))
        if role == "tool":
            label = labels.get(str(msg.get("tool_call_id")), str(msg.get("name") or msg.get("tool_call_id")))
            tools.pop(label, None)  # a repeated call keeps its newest result
            tools[label] = _tool_value(text)
    asked = next((_first_line(t) for _, r, t in spoken if r == "user"), "")
    outcome = next((_first_line(t) for _, r, t in reversed(spoken) if r == "assistant"), "")
    summary = f"Asked: {_clip(asked, 200)}" if asked else "Continued earlier work."
    if outcome:
        summary += f" Outcome: {_clip(outcome, 200)}"
    return Episode(
        episode_id=episode_id, turn_range=turn_range, summary=summary,
        decisions=_dedupe_newest(decisions, lambda d: _key(d.decision), EPISODE_CAP),
        eliminated=_dedupe_newest(eliminated, lambda e: _key(e.approach), EPISODE_CAP),
        open_questions=_dedupe_newest(_open_questions(spoken), _key, EPISODE_CAP),
        tool_results=dict(list(tools.items())[-EPISODE_CAP:]),
    )


# ---------------------------------------------------------------- L2 → L3

# Stable-looking: a path, a file name, a hex id, a version or a multi-digit number; error lines are transient.
_FACTLIKE = re.compile(r"\w/[\w.-]|\b[\w-]+\.[a-z]{1,5}\b|\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,}\b|"
                       r"\b\d+(?:\.\d+)+\b|\b\d{2,}\b", re.I)
_TRANSIENT = re.compile(r"error|exception|traceback|failed|not found|denied|timed? ?out", re.I)


def _normalized(s: SemanticMemory) -> SemanticMemory:
    return SemanticMemory(
        facts=_dedupe_newest((f.strip() for f in s.facts), _key, CAPS["facts"]),
        decisions=_dedupe_newest(s.decisions, lambda d: _key(d.decision), CAPS["decisions"]),
        eliminated_approaches=_dedupe_newest(s.eliminated_approaches, lambda e: _key(e.approach),
                                             CAPS["eliminated_approaches"]),
        patterns=_dedupe_newest((p.strip() for p in s.patterns), _key, CAPS["patterns"]),
    )


def distill(episodes: list[Episode], existing: SemanticMemory) -> SemanticMemory:
    """Fallback L2→L3: existing memory, then the episodes oldest to newest; newer entries win, caps drop oldest.

    Facts are tool results whose line names a path/id/number and is not an error. Patterns are approaches
    ruled out, or questions left open, in two or more of these episodes.
    """
    facts = list(existing.facts)
    decisions, eliminated = list(existing.decisions), list(existing.eliminated_approaches)
    seen_in: dict[str, set[int]] = {}
    for ep in episodes:
        decisions += ep.decisions
        eliminated += ep.eliminated
        facts += [f"{k} → {v}" for k, v in ep.tool_results.items()
                  if _FACTLIKE.search(v) and not _TRANSIENT.search(v)]
        for label in [f"Repeatedly ruled out: {e.approach}" for e in ep.eliminated] + [
                f"Recurring open question: {q}" for q in ep.open_questions]:
            seen_in.setdefault(label, set()).add(ep.episode_id)
    patterns = list(existing.patterns) + [p for p, ids in seen_in.items() if len(ids) >= 2]
    return _normalized(SemanticMemory(facts=facts, decisions=decisions, eliminated_approaches=eliminated,
                                      patterns=patterns))


def add_episode(memory: FoldedMemory, episode: Episode, max_episodes: int) -> tuple[FoldedMemory, list[Episode]]:
    """Append; past `max_episodes` hand back the oldest half (or more, to fit) for the caller to distill."""
    if max_episodes < 1:
        raise ValueError("max_episodes must be at least 1")
    episodes = [*memory.episodes, episode]
    flushed: list[Episode] = []
    if len(episodes) > max_episodes:
        n = max(max_episodes // 2, len(episodes) - max_episodes)
        flushed, episodes = episodes[:n], episodes[n:]
    return memory.model_copy(update={
        "episodes": episodes,
        "current_episode_id": max(memory.current_episode_id, episode.episode_id + 1),
        "total_turns_seen": max(memory.total_turns_seen, episode.turn_range[1] + 1),
    }), flushed


def apply_distilled(memory: FoldedMemory, semantic: SemanticMemory) -> FoldedMemory:
    """Replace L3 (the model was given the old one to merge into); dedupe and caps still hold."""
    return memory.model_copy(update={"semantic": _normalized(semantic)})


# ---------------------------------------------------------------- model path

_EPISODE_SYSTEM = """You compress a slice of an agent's conversation into one episode record.
Keep outcomes, not the back-and-forth. Record each decision with the reason it was taken, every approach
that was tried and abandoned with the reason it was abandoned, questions still unanswered at the end of the
slice, and the tool results later turns will need (a short line each; copy ids, paths, numbers and error
text exactly). Leave out anything a fresh agent could get back by re-reading a file or re-running a command.
Reply with one JSON object and nothing else, with exactly these keys:
{"summary": "2-3 sentences", "decisions": [{"decision": "", "reason": ""}],
 "eliminated": [{"approach": "", "why": ""}], "open_questions": [""], "tool_results": {"call": "result line"}}"""

_SEMANTIC_SYSTEM = """You maintain an agent's long-term memory. You get the current memory and older episode
records. Produce the updated memory: keep only knowledge that will still matter many turns from now (stable
facts about the system, decisions that should not be reopened and why, approaches proven not to work and why,
recurring patterns). Drop in-progress state and results tied to a single call. Merge rather than append:
correct facts the episodes contradict, drop duplicates and decisions that are resolved. Copy ids, paths and
numbers exactly. Reply with one JSON object and nothing else, with exactly these keys:
{"facts": [""], "decisions": [{"decision": "", "reason": ""}],
 "eliminated_approaches": [{"approach": "", "why": ""}], "patterns": [""]}"""

_PROMPT_MESSAGE_CHARS = 4000  # per message, so one huge tool output cannot crowd out the dialogue


def _transcript(messages: list[dict[str, Any]]) -> str:
    lines = []
    for msg in messages:
        role, text = str(msg.get("role")), _text(msg.get("content"))
        if len(text) > _PROMPT_MESSAGE_CHARS:
            text = text[:_PROMPT_MESSAGE_CHARS] + f"\n[... {len(text) - _PROMPT_MESSAGE_CHARS} chars cut]"
        if role == "tool":
            role = f"tool result {msg.get('tool_call_id', '')}".rstrip()
        calls = [f"{c.get('id')}: {_call_label(c)}" for c in msg.get("tool_calls") or () if isinstance(c, dict)]
        body = "\n".join(filter(None, [text.strip(), *(f"calls {c}" for c in calls)]))
        lines.append(f"[{role}]\n{body}")
    return "\n\n".join(lines)


def episode_prompt(messages: list[dict[str, Any]]) -> list[dict[str, str]]:
    return [{"role": "system", "content": _EPISODE_SYSTEM},
            {"role": "user", "content": "Conversation slice:\n\n" + _transcript(messages)}]


def semantic_prompt(episodes: list[Episode], existing: SemanticMemory) -> list[dict[str, str]]:
    payload = {"existing_memory": existing.model_dump(mode="json"),
               "episodes": [e.model_dump(mode="json") for e in episodes]}
    return [{"role": "system", "content": _SEMANTIC_SYSTEM},
            {"role": "user", "content": orjson.dumps(payload, option=orjson.OPT_INDENT_2).decode()}]


def _json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in a fenced block, else the first one anywhere in the text."""
    for body in re.findall(r"```(?:json)?\s*(.*?)```", text, re.S | re.I):
        try:
            data = json.loads(body)
        except ValueError:
            continue
        if isinstance(data, dict):
            return data
    decoder = json.JSONDecoder()
    for m in list(re.finditer(r"\{", text))[:50]:
        try:
            data, _ = decoder.raw_decode(text, m.start())
        except ValueError:
            continue
        if isinstance(data, dict):
            return data
    return None


def parse_episode(text: str, episode_id: int, turn_range: tuple[int, int]) -> Episode | None:
    data = _json_object(text or "")
    keys = ("summary", "decisions", "eliminated", "open_questions", "tool_results")
    if data is None or any(k not in data for k in keys):
        return None
    try:
        ep = Episode.model_validate({k: data[k] for k in keys} | {"episode_id": episode_id,
                                                                  "turn_range": turn_range})
    except ValidationError:
        return None
    if not ep.summary.strip():
        return None
    return ep.model_copy(update={
        "decisions": _dedupe_newest(ep.decisions, lambda d: _key(d.decision), EPISODE_CAP),
        "eliminated": _dedupe_newest(ep.eliminated, lambda e: _key(e.approach), EPISODE_CAP),
        "open_questions": _dedupe_newest(ep.open_questions, _key, EPISODE_CAP),
        "tool_results": {k: _clip(v, TOOL_VALUE_CHARS) for k, v in list(ep.tool_results.items())[-EPISODE_CAP:]},
    })


def parse_semantic(text: str) -> SemanticMemory | None:
    data = _json_object(text or "")
    if data is None or any(k not in data for k in CAPS):
        return None
    try:
        return _normalized(SemanticMemory.model_validate({k: data[k] for k in CAPS}))
    except ValidationError:
        return None


# ---------------------------------------------------------------- rendering

def _items(lines: list[str], limit: int | None) -> list[str]:
    """Newest kept when trimming: the hidden ones are the oldest."""
    if limit is None or len(lines) <= limit:
        return lines
    return [f"- (+{len(lines) - limit} more)", *lines[len(lines) - limit:]] if limit else [
        f"- (+{len(lines)} more)"]


def _compose(memory: FoldedMemory, episodes: list[Episode], limit: int | None) -> str:
    s = memory.semantic
    out: list[str] = []
    sections = [
        ("Facts:", [f"- {_clip(f, ITEM_CHARS)}" for f in s.facts]),
        ("Decisions:", [f"- {_clip(d.decision, ITEM_CHARS)}" + (f" (because {_clip(d.reason, ITEM_CHARS)})"
                                                               if d.reason else "") for d in s.decisions]),
        ("Ruled out:", [f"- {_clip(e.approach, ITEM_CHARS)}" + (f" — {_clip(e.why, ITEM_CHARS)}" if e.why else "")
                        for e in s.eliminated_approaches]),
        ("Patterns:", [f"- {_clip(p, ITEM_CHARS)}" for p in s.patterns]),
    ]
    if any(lines for _, lines in sections):
        out.append("### Durable knowledge")
        for title, lines in sections:
            out += [title, *_items(lines, limit)] if lines else []
    if episodes:
        out.append("### Recent episodes (oldest first)")
        for ep in episodes:
            out.append(f"Episode {ep.episode_id}, turns {ep.turn_range[0]}–{ep.turn_range[1]}: "
                       f"{_clip(ep.summary, 2 * ITEM_CHARS)}")
            out += _items([f"- decided: {_clip(d.decision, ITEM_CHARS)}" for d in ep.decisions[-3:]], limit)
            out += _items([f"- open: {_clip(q, ITEM_CHARS)}" for q in ep.open_questions[-2:]], limit)
    if not out:
        return ""
    head = "## Folded memory (summaries of earlier turns; `recall` finds the originals)"
    return "\n".join([head, *out])


def render(memory: FoldedMemory, *, recent_episodes: int = 3, max_chars: int = 6000) -> str:
    """Semantic memory first, then a digest of the newest episodes; shrinks until it fits `max_chars`."""
    episodes = memory.episodes[-recent_episodes:] if recent_episodes > 0 else []
    text = _compose(memory, episodes, None)
    while len(text) > max_chars and episodes:  # oldest episode digests go first
        episodes = episodes[1:]
        text = _compose(memory, episodes, None)
    s = memory.semantic
    longest = max(len(s.facts), len(s.decisions), len(s.eliminated_approaches), len(s.patterns))
    for limit in range(longest - 1, -1, -1):
        if len(text) <= max_chars:
            break
        text = _compose(memory, episodes, limit)
    if len(text) > max_chars:  # only with a tiny max_chars: keep whole lines that fit
        kept = ""
        for line in text.splitlines():
            if len(kept) + len(line) + 1 > max_chars:
                break
            kept += ("\n" if kept else "") + line
        text = kept
    return text
