"""Working memory: the entities (pages, reservations, orders, ...) an agent has recently seen in tool results.

When a tool answers `{"page": {"id": "page-123", "title": "About Us"}}`, the proxy learns that page-123 is
called "About Us"; from `{"reservation_id": "HXDUBJ", "origin": "IAH", ...}` that reservation HXDUBJ is the
one from IAH (a record without a name is labelled by its first few short fields). The last few such
entities, most recent first, are rendered as a short block so the model can turn "it" or "that page" into
an id without calling a tool again. Everything here is pure and
deterministic: the same messages give the same memory and the same block, byte for byte, and no input
(malformed, huge or deeply nested) makes it raise.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.layers.entities import (
    DEFAULT_MAX_FROM_LIST,
    MAX_CONTENT_CHARS,
    MAX_PER_RESULT,
    Entity,
    clean_id,
    extract,
    infer_type,
    plural,
)

__all__ = ["MAX_CONTENT_CHARS", "MAX_PER_RESULT", "Entity", "WorkingMemory", "extract", "infer_type",
           "observe_messages"]

VERSION = 1
DEFAULT_MAX_ENTITIES = 10
HINT = ('Entities seen recently in tool results, most recent first; resolve "it", "that one" and the like '
        "to these ids.")


@dataclass
class WorkingMemory:
    """Entities most recent first, unique by id, at most `max_entities` of them."""

    max_entities: int = DEFAULT_MAX_ENTITIES
    entities: list[Entity] = field(default_factory=list)

    def __post_init__(self) -> None:
        given, self.entities = self.entities, []
        self.observe(reversed(given))  # oldest first, so the given order survives de-duplication

    def observe(self, entities: Iterable[Entity]) -> None:
        """Each entity in turn moves to the front (as the source's addEntities does), so observing [a, b]
        equals observing [a] then [b]: the last entity of a batch ends up most recent. A re-seen id keeps
        its newest name; the oldest entity drops out once the cap is passed."""
        for entity in entities:
            self.entities = [entity, *(seen for seen in self.entities if seen.id != entity.id)]
            del self.entities[max(0, self.max_entities) :]

    def by_type(self, kind: str) -> list[Entity]:
        return [entity for entity in self.entities if entity.type == kind]

    def render(self) -> str:
        """The block for the prompt: types by most recent use, entities newest first; "" when empty."""
        if not self.entities:
            return ""
        groups: dict[str, list[Entity]] = {}
        for entity in self.entities:
            groups.setdefault(entity.type, []).append(entity)
        lines = ["[WORKING MEMORY]", HINT]
        for kind, members in groups.items():
            lines.append(f"{plural(kind)}:")
            # JSON quoting: a name holding quotes or control characters cannot break the block
            lines.extend(f"  - {orjson.dumps(e.name).decode()} ({e.id})" for e in members)
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"version": VERSION, "max_entities": self.max_entities,
                "entities": [{"id": e.id, "name": e.name, "type": e.type} for e in self.entities]}

    @classmethod
    def from_dict(cls, data: Any, *, max_entities: int | None = None) -> WorkingMemory:
        """Restore a checkpoint. Unknown fields are ignored, bad entries skipped, and anything from another
        version starts empty (losing recent entities is cheap; misreading them is not)."""
        data = data if isinstance(data, dict) else {}
        stored = data.get("max_entities")
        if max_entities is None:
            valid = isinstance(stored, int) and not isinstance(stored, bool) and stored >= 0
            max_entities = stored if valid else DEFAULT_MAX_ENTITIES
        memory = cls(max_entities)
        version, items = data.get("version"), data.get("entities")
        if type(version) is not int or version != VERSION or not isinstance(items, list):
            return memory
        restored = []
        for item in items:
            if not isinstance(item, dict):
                continue
            ident, name, kind = clean_id(item.get("id")), item.get("name"), item.get("type")
            if ident and isinstance(name, str) and name and isinstance(kind, str) and kind:
                restored.append(Entity(ident, name, kind))
        memory.observe(reversed(restored))
        return memory


def _calls_from(messages: Sequence[Any], start: int) -> int:
    """Where the walk must begin so that every result from `start` on finds the latest call with its id:
    back from `start` until each of those ids was seen once (a resent history costs what is new). A
    result whose call came after `start` (a turn's new call and its result, most) is found by the walk
    forward: looking back for it went to the start of the history every turn."""
    missing: set[str] = set()
    called: set[Any] = set()
    for message in messages[start:]:  # (a slice: islice would step over the first `start` one by one)
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role == "assistant" and isinstance(calls := message.get("tool_calls"), list):
            called.update(c.get("id") for c in calls if isinstance(c, dict))
        elif role == "tool" and isinstance(call_id := message.get("tool_call_id"), str) \
                and call_id not in called:
            missing.add(call_id)
    index = start
    while index > 0 and missing:
        index -= 1
        message = messages[index]
        if isinstance(message, dict) and message.get("role") == "assistant" \
                and isinstance(message.get("tool_calls"), list):
            missing.difference_update(c.get("id") for c in message["tool_calls"] if isinstance(c, dict))
    return index


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: a JSON result may be split across text parts
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def observe_messages(memory: WorkingMemory, messages: Sequence[Any], *,
                     max_from_list: int = DEFAULT_MAX_FROM_LIST,
                     type_patterns: dict[str, str] | None = None, start: int = 0) -> None:
    """Feed every tool result of an OpenAI chat history to `memory`, in message order. A tool message is
    matched to the latest assistant tool call with its id (some agents reuse ids); results whose call is
    unknown are skipped, since without a tool name there is no type. Legacy `function` messages count too."""
    calls: dict[str, tuple[Any, Any]] = {}  # call id -> (tool name, arguments), checked by extract
    for index in range(_calls_from(messages, start), len(messages)):
        message = messages[index]
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role == "assistant" and isinstance(message.get("tool_calls"), list):
            for call in message["tool_calls"]:
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict) and isinstance(call.get("id"), str):
                    calls[call["id"]] = (function.get("name"), function.get("arguments"))
            continue
        if index < start:  # seen by an earlier request; its calls above still name later results
            continue
        if role == "tool" and isinstance(call_id := message.get("tool_call_id"), str) and call_id in calls:
            name, arguments = calls[call_id]
        elif role == "function":
            name, arguments = message.get("name"), None
        else:
            continue
        memory.observe(extract(name, arguments, _text(message.get("content")),
                               max_from_list=max_from_list, type_patterns=type_patterns))
