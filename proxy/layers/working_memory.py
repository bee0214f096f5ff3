"""Working memory: the entities (pages, issues, files, ...) an agent has recently seen in tool results.

When a tool answers `{"page": {"id": "page-123", "title": "About Us"}}`, the proxy learns that page-123 is
called "About Us". The last few such entities, most recent first, are rendered as a short block so the model
can turn "it" or "that page" into an id without calling a tool again. Everything here is pure and
deterministic: the same messages give the same memory and the same block, byte for byte, and no input
(malformed, huge or deeply nested) makes it raise.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import orjson

VERSION = 1
DEFAULT_MAX_ENTITIES = 10
DEFAULT_MAX_FROM_LIST = 3
MAX_CONTENT_CHARS = 2_000_000  # parsing a bigger result costs more than the few entities it could add
MAX_LIST_SCAN = 1_000  # items looked at per list while looking for the first few valid ones
MAX_WRAP_DEPTH = 3  # {"data": {"data": ...}} unwrapped at most this deep
MAX_NAME_CHARS = 80  # the block rides along in every request: keep its lines short
MAX_ID_CHARS = 128  # anything longer is a blob or a token, not an id the model should quote back
MAX_TOOL_NAME_CHARS = 200  # bounds the regex work on a hostile tool name

NAME_KEYS = ("title", "name", "slug", "filename", "heading", "label", "subject", "login")
ID_KEYS = ("id", "_id")
LIST_KEYS = ("matches", "items", "results", "data", "records")  # tried after the type's own plural
WRAPPER_KEYS = ("data", "result")  # single resource wrapped one level down

HINT = ('Entities seen recently in tool results, most recent first; resolve "it", "that page" and the like '
        "to these ids.")

# Tried in order on the words of the tool name after its verb; the first match wins (so a
# get_page_sections tool is about pages, as in the source's table).
DEFAULT_TYPE_PATTERNS: dict[str, str] = {
    r"\bpages?\b": "page", r"\bsections?\b": "section", r"\b(images?|photos?|pictures?)\b": "image",
    r"\bmedia\b": "media", r"\bposts?\b": "post", r"\b(entry|entries)\b": "entry",
    r"\bcollections?\b": "collection", r"\btasks?\b": "task", r"\bissues?\b": "issue",
    r"\b(pull requests?|pulls?|prs?)\b": "pull_request", r"\bcomments?\b": "comment",
    r"\b(users?|members?)\b": "user", r"\borders?\b": "order", r"\bproducts?\b": "product",
    r"\b(files?|documents?|docs?)\b": "file", r"\b(folders?|directory|directories)\b": "folder",
    r"\bprojects?\b": "project", r"\b(repos?|repository|repositories)\b": "repository",
    r"\bbranch(es)?\b": "branch", r"\bcommits?\b": "commit", r"\btickets?\b": "ticket",
    r"\bmessages?\b": "message", r"\bchannels?\b": "channel", r"\bevents?\b": "event", r"\bnotes?\b": "note",
}
VERBS = frozenset({
    "get", "list", "search", "find", "fetch", "read", "query", "lookup", "retrieve", "show", "view",
    "describe", "open", "create", "add", "insert", "make", "update", "edit", "modify", "patch", "put",
    "set", "upsert", "rename", "move", "copy", "delete", "remove", "archive", "publish", "upload",
    "download", "save", "write", "post", "send",
})
FILLER = frozenset({
    "by", "id", "ids", "all", "any", "details", "detail", "info", "information", "content", "contents",
    "data", "for", "of", "the", "a", "an", "to", "from", "with", "in", "on", "and", "or", "my", "current",
    "recent", "latest", "tool", "api",
})
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_UNCOUNTABLE = frozenset({"media", "data", "metadata"})
_PLURAL_ENDINGS = (("ies", "y"), ("sses", "ss"), ("xes", "x"), ("zes", "z"), ("ches", "ch"), ("shes", "sh"))
_MISSING = object()


@dataclass(frozen=True, slots=True)
class Entity:
    id: str
    name: str
    type: str


def plural(word: str) -> str:
    """English plural, good enough for resource names (page -> pages, entry -> entries)."""
    if word in _UNCOUNTABLE:
        return word
    if len(word) > 1 and word.endswith("y") and word[-2] not in "aeiou":
        return word[:-1] + "ies"
    if word.endswith(("s", "x", "z", "ch", "sh")):
        return word + "es"
    return word + "s"


def singular(word: str) -> str:
    """Inverse of `plural` for the usual cases (invoices -> invoice, entries -> entry)."""
    for suffix, replacement in _PLURAL_ENDINGS:
        if word.endswith(suffix) and len(word) > len(suffix):
            return word[: -len(suffix)] + replacement
    if len(word) > 2 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def _nouns(tool_name: str) -> tuple[list[str], bool]:
    """Words naming what a tool acts on (those after its verb, so namespaces drop out); has it a verb?"""
    words = [w for w in re.split(r"[^a-z0-9]+", _CAMEL.sub(" ", tool_name).lower()) if w]
    for index, word in enumerate(words):
        if word in VERBS and index + 1 < len(words):
            return words[index + 1 :], True
    return [w for w in words if w not in VERBS], any(w in VERBS for w in words)


def infer_type(tool_name: str | None, type_patterns: dict[str, str] | None = None) -> str | None:
    """Entity type for a tool: `type_patterns` first (regex -> type, case-insensitive, in order), then the
    default table, then the tool's noun made singular. Only tools named for an action on a noun (a verb such
    as get/list/create) take that last fallback, so run_command or bash give no type."""
    if not isinstance(tool_name, str) or not tool_name:
        return None
    tool_name = tool_name[:MAX_TOOL_NAME_CHARS]
    for pattern, kind in (type_patterns or {}).items():
        try:
            if isinstance(kind, str) and kind and re.search(pattern, tool_name, re.IGNORECASE):
                return kind
        except (re.error, TypeError):  # a bad policy pattern must not break the request path
            continue
    nouns, has_verb = _nouns(tool_name)
    text = " ".join(nouns)
    for pattern, kind in DEFAULT_TYPE_PATTERNS.items():
        if re.search(pattern, text):
            return kind
    if has_verb:
        for word in nouns:
            if word.isalpha() and len(word) > 1 and word not in FILLER:
                return singular(word)
    return None


def _clean_id(value: Any) -> str | None:
    if isinstance(value, bool):  # JSON true is not an id, though Python calls it an int
        return None
    if isinstance(value, int):
        return str(value) if -(2**63) <= value < 2**64 else None  # str() of a giant int is slow, or raises
    if isinstance(value, str):
        value = value.strip()
        if value and len(value) <= MAX_ID_CHARS and value.isprintable():
            return value
    return None


def _name(item: dict[str, Any]) -> str | None:
    for key in NAME_KEYS:
        value = item.get(key)
        if isinstance(value, str) and (text := " ".join(value.split())):
            return text if len(text) <= MAX_NAME_CHARS else text[: MAX_NAME_CHARS - 3] + "..."
    return None


def _entity(item: Any, kind: str) -> Entity | None:
    if not isinstance(item, dict):
        return None
    ident = _clean_id(next((item[key] for key in ID_KEYS if key in item), None))
    attributes = item.get("attributes")  # JSON:API keeps the name beside the id, under "attributes"
    name = _name(item) or (_name(attributes) if isinstance(attributes, dict) else None)
    return Entity(ident, name, kind) if ident and name else None


def _from_list(items: list[Any], kind: str, limit: int) -> list[Entity]:
    found: list[Entity] = []
    for item in islice(items, MAX_LIST_SCAN):
        if len(found) >= limit:
            break
        entity = _entity(item, kind)
        if entity and all(entity.id != seen.id for seen in found):
            found.append(entity)
    return found


def _from_value(value: Any, kind: str, limit: int, depth: int = 0) -> list[Entity]:
    """First shape that yields something wins, so one result never floods memory from several lists."""
    if isinstance(value, list):
        return _from_list(value, kind, limit)
    if not isinstance(value, dict) or depth > MAX_WRAP_DEPTH:
        return []
    for candidate in (value.get(kind), value):  # {"page": {...}} or the resource itself
        if entity := _entity(candidate, kind):
            return [entity]
    for key in (plural(kind), *LIST_KEYS):
        if isinstance(value.get(key), list) and (found := _from_list(value[key], kind, limit)):
            return found
    for key in WRAPPER_KEYS:
        if isinstance(value.get(key), dict) and (found := _from_value(value[key], kind, limit, depth + 1)):
            return found
    return []


def _from_arguments(arguments: dict[str, Any], result: Any, kind: str) -> list[Entity]:
    """A write whose result lacks the name: update_page(pageId, title) -> {"success": true}, or
    create_page(title) -> {"id": "page-123"}. The name comes from the call, the id from either."""
    result = result if isinstance(result, dict) else {}
    if result.get("error") or result.get("errors") or False in (result.get("success"), result.get("ok")):
        return []  # the write failed: the name in the call never took effect
    head, *rest = kind.split("_")
    keys = (f"{head}{''.join(part.title() for part in rest)}Id", f"{kind}_id", "id")  # pageId, page_id, id
    candidates = [result.get("id"), *(arguments.get(key) for key in keys)]
    ident = next((clean for value in candidates if (clean := _clean_id(value))), None)
    name = _name(arguments)
    return [Entity(ident, name, kind)] if ident and name else []


def _parse(text: Any) -> Any:
    if isinstance(text, dict):  # some clients hand arguments over already decoded
        return text
    if not isinstance(text, str | bytes) or len(text) > MAX_CONTENT_CHARS:
        return _MISSING
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:  # also raised for nesting deeper than orjson's limit
        return _MISSING


def extract(tool_name: str | None, arguments: str | None, content: str, *,
            max_from_list: int = DEFAULT_MAX_FROM_LIST,
            type_patterns: dict[str, str] | None = None) -> list[Entity]:
    """Entities in one tool result, in the result's order, at most `max_from_list` of them from a list.
    A result that is not JSON yields nothing; a JSON result naming no entity may still yield one from the
    call's arguments (a rename or a create answered with a bare id or {"success": true})."""
    kind = infer_type(tool_name, type_patterns)
    result = _parse(content) if kind else _MISSING
    if kind is None or result is _MISSING:
        return []
    found = _from_value(result, kind, max(0, max_from_list))
    if not found and isinstance(arguments_value := _parse(arguments), dict):
        found = _from_arguments(arguments_value, result, kind)
    return found


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
            ident, name, kind = _clean_id(item.get("id")), item.get("name"), item.get("type")
            if ident and isinstance(name, str) and name and isinstance(kind, str) and kind:
                restored.append(Entity(ident, name, kind))
        memory.observe(reversed(restored))
        return memory


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: a JSON result may be split across text parts
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def observe_messages(memory: WorkingMemory, messages: Iterable[Any], *,
                     max_from_list: int = DEFAULT_MAX_FROM_LIST,
                     type_patterns: dict[str, str] | None = None, start: int = 0) -> None:
    """Feed every tool result of an OpenAI chat history to `memory`, in message order. A tool message is
    matched to the latest assistant tool call with its id (some agents reuse ids); results whose call is
    unknown are skipped, since without a tool name there is no type. Legacy `function` messages count too."""
    calls: dict[str, tuple[Any, Any]] = {}  # call id -> (tool name, arguments), checked by extract
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role == "assistant" and isinstance(message.get("tool_calls"), list):
            for call in message["tool_calls"]:
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict) and isinstance(call.get("id"), str):
                    calls[call["id"]] = (function.get("name"), function.get("arguments"))
            continue
        if role == "tool" and isinstance(call_id := message.get("tool_call_id"), str) and call_id in calls:
            name, arguments = calls[call_id]
        elif role == "function":
            name, arguments = message.get("name"), None
        else:
            continue
        memory.observe(extract(name, arguments, _text(message.get("content")),
                               max_from_list=max_from_list, type_patterns=type_patterns))
