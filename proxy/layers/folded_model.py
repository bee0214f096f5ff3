"""Folded memory's model path: the prompts the proxy sends upstream, and strict checks of the answers.

Anything invalid yields None; the caller retries once, then uses the deterministic fallback in folded.py.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson
from pydantic import ValidationError

from proxy.layers.folded import (
    CAPS,
    Episode,
    SemanticMemory,
    _call_label,
    _capped,
    _normalized,
    _text,
)

_EPISODE_SYSTEM = """You compress a slice of an agent's conversation into one episode record.
Keep outcomes, not the back-and-forth. Record each decision with the reason it was taken, every approach
that was tried and abandoned with the reason, questions still unanswered at the end of the slice, and the
tool results later turns will need (one short line each; copy ids, paths, numbers and error text exactly).
Leave out anything a fresh agent could get back by re-reading a file or re-running a command.
Reply with one JSON object and nothing else, with exactly these keys:
{"summary": "2-3 sentences", "decisions": [{"decision": "", "reason": ""}],
 "eliminated": [{"approach": "", "why": ""}], "open_questions": [""], "tool_results": {"call": "result"}}"""

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
    parts = []
    for msg in messages:
        role, text = str(msg.get("role")), _text(msg.get("content")).strip()
        if len(text) > _PROMPT_MESSAGE_CHARS:
            text = text[:_PROMPT_MESSAGE_CHARS] + f"\n[... {len(text) - _PROMPT_MESSAGE_CHARS} chars cut]"
        if role == "tool":
            role = f"tool result {msg.get('tool_call_id', '')}".rstrip()
        calls = [f"calls {c.get('id')}: {_call_label(c)}" for c in msg.get("tool_calls") or ()
                 if isinstance(c, dict)]
        parts.append(f"[{role}]\n" + "\n".join(filter(None, [text, *calls])))
    return "\n\n".join(parts)


def episode_prompt(messages: list[dict[str, Any]]) -> list[dict[str, str]]:
    return [{"role": "system", "content": _EPISODE_SYSTEM},
            {"role": "user", "content": "Conversation slice:\n\n" + _transcript(messages)}]


def semantic_prompt(episodes: list[Episode], existing: SemanticMemory) -> list[dict[str, str]]:
    payload = {"existing_memory": existing.model_dump(mode="json"),
               "episodes": [e.model_dump(mode="json") for e in episodes]}
    return [{"role": "system", "content": _SEMANTIC_SYSTEM},
            {"role": "user", "content": orjson.dumps(payload, option=orjson.OPT_INDENT_2).decode()}]


def _json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object inside a ``` fence, else the first one anywhere in the text (prose around it)."""
    decoder = json.JSONDecoder()
    fenced = [(body.strip(), 0) for body in re.findall(r"```(?:json)?(.*?)```", text, re.S | re.I)]
    for source, start in fenced + [(text, m.start()) for m in re.finditer(r"\{", text)][:50]:
        try:
            data, _ = decoder.raw_decode(source, start)
        except ValueError:
            continue
        if isinstance(data, dict):
            return data
    return None


def parse_episode(text: str, episode_id: int, turn_range: tuple[int, int]) -> Episode | None:
    """A model's episode, or None when it is not one (every key present, right types, a summary)."""
    data = _json_object(text or "")
    keys = ("summary", "decisions", "eliminated", "open_questions", "tool_results")
    if data is None or any(k not in data for k in keys):
        return None
    try:
        ep = Episode.model_validate({k: data[k] for k in keys} | {"episode_id": episode_id,
                                                                  "turn_range": turn_range})
    except ValidationError:
        return None
    return _capped(ep) if ep.summary.strip() else None


def parse_semantic(text: str) -> SemanticMemory | None:
    data = _json_object(text or "")
    if data is None or any(k not in data for k in CAPS):
        return None
    try:
        return _normalized(SemanticMemory.model_validate({k: data[k] for k in CAPS}))
    except ValidationError:
        return None


