"""Entities in tool results: which keys are identifiers, what type a record is, what to call it.

From `{"page": {"id": "page-123", "title": "About Us"}}` the entity is page-123, "About Us"; from
`{"reservation_id": "HXDUBJ", "origin": "IAH", ...}` reservation HXDUBJ, labelled by its first few short
fields. Pure and deterministic, bounded in work, and no input (malformed, huge or deeply nested) makes
it raise. Working memory keeps the most recent of them.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import orjson

from proxy.layers.identifiers import MAX_KEY_CHARS, id_key, snake

DEFAULT_MAX_FROM_LIST = 3
MAX_CONTENT_CHARS = 2_000_000  # parsing a bigger result costs more than the few entities it could add
MAX_NESTED_CHARS = 200_000  # a JSON or Python literal inside a string field is parsed up to this size
MAX_LIST_SCAN = 1_000  # items looked at per list while looking for the first few valid ones
MAX_KEYS = 200  # keys looked at per object
MAX_DEPTH = 8  # nesting walked into: records sit a few levels down, never dozens
MAX_NODES = 20_000  # values visited per result: a bounded cost on the request path
MAX_PER_RESULT = 6  # one result never floods the memory (max_entities is 10 by default)
MAX_NAME_CHARS = 80  # the block rides along in every request: keep its lines short
MAX_ID_CHARS = 128  # anything longer is a blob or a token, not an id the model should quote back
MAX_TOOL_NAME_CHARS = 200  # bounds the regex work on a hostile tool name
DESCRIBE_FIELDS = 3  # a nameless record is labelled by this many of its short fields

NAME_KEYS = ("title", "name", "slug", "filename", "heading", "label", "subject", "login", "full_name",
             "fullName", "display_name", "displayName", "username")
# Envelope keys: a generic id below them takes the type from above (the tool's, at the top).
WRAPPER_KEYS = frozenset({"data", "result", "results", "response", "value", "payload", "body", "content",
                          "matches", "records", "hits", "rows", "list", "objects", "nodes", "edges", "node",
                          "output", "items", "entries"})
SKIP_KEYS = frozenset({"error", "errors", "meta", "links", "_links", "headers", "pagination"})
_NOUN = re.compile(r"[a-z][a-z_]*[a-z]")
_SPACE = re.compile(r"\s")


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


def clean_id(value: Any) -> str | None:
    if isinstance(value, bool):  # JSON true is not an id, though Python calls it an int
        return None
    if isinstance(value, int):
        return str(value) if -(2**63) <= value < 2**64 else None  # str() of a giant int is slow, or raises
    if isinstance(value, str):
        value = value.strip()
        if value and len(value) <= MAX_ID_CHARS and value.isprintable() and not _SPACE.search(value):
            return value
    return None


def _context(key: str, ctx: str | None, record: bool) -> str | None:
    """The type a generic id found under `key` takes: the key's noun (`flights` -> flight); through an
    envelope's `data`/`items`/`results` the type from above; a key holding digits is an id-keyed map."""
    if key in WRAPPER_KEYS:
        return singular(key) if record and key in ("items", "entries") else (None if record else ctx)
    noun = snake(key)
    return singular(noun) if _NOUN.fullmatch(noun) and len(noun) <= MAX_KEY_CHARS else ctx


def _name(item: dict[str, Any]) -> str | None:
    for key in NAME_KEYS:
        value = item.get(key)
        if isinstance(value, dict):  # {"name": {"first_name": "Ivan", "last_name": "Rossi"}}
            value = _person(value)
        if isinstance(value, str) and (text := " ".join(value.split())):
            return _clip(text)
    return _person(item)


def _person(item: dict[str, Any]) -> str | None:
    parts = [item.get(key) for key in ("first_name", "firstName", "last_name", "lastName")]
    text = " ".join(" ".join(p.split()) for p in parts if isinstance(p, str) and p.strip())
    return _clip(text) if text else None


def _clip(text: str) -> str:
    return text if len(text) <= MAX_NAME_CHARS else text[: MAX_NAME_CHARS - 3] + "..."


def _describe(item: dict[str, Any], skip: str) -> str | None:
    """A nameless record's label: its first few short scalar fields (`origin IAH, destination SFO`)."""
    parts: list[str] = []
    for key, value in islice(item.items(), MAX_KEYS):
        if len(parts) >= DESCRIBE_FIELDS:
            break
        if key == skip or key in NAME_KEYS or not isinstance(key, str) or id_key(key) is not None:
            continue
        if isinstance(value, str) and value.strip() and len(value) <= 40 and "\n" not in value \
                and value.isprintable():
            parts.append(f"{key} {' '.join(value.split())}")
        elif isinstance(value, int | float) and not isinstance(value, bool) and abs(value) < 1e15:
            parts.append(f"{key} {value}")
    return _clip(", ".join(parts)) if parts else None


def _own_id(item: dict[str, Any], ctx: str | None) -> tuple[str, str | None, str] | None:
    """(key, implied noun, id) of the record's own identifier: a plain `id`, else the key naming the
    record's type, else an id key among its first two fields (APIs put a record's own id first; a
    foreign key further down names another record)."""
    found: list[tuple[str, str | None, str]] = []
    for position, (key, value) in enumerate(islice(item.items(), MAX_KEYS)):
        shape = id_key(key)
        if shape is None or (ident := clean_id(value)) is None:
            continue
        if shape[0] is None and key.lower() == "code" and not isinstance(value, str):
            continue  # {"code": 404, "message": ...} is a status, not a record
        if key.lower() in ("id", "_id") or (shape[0] is not None and shape[0] == ctx):
            return key, shape[0], ident
        found.append((key, shape[0], ident) if position < 2 or shape[0] is None else ("", None, ""))
    return next((entry for entry in found if entry[0]), None)


@dataclass
class _Walk:
    """One bounded walk over a parsed result, collecting (depth, order, entity)."""

    limit: int
    nodes: int = 0
    found: list[tuple[int, int, Entity]] = field(default_factory=list)

    def record(self, item: dict[str, Any], ctx: str | None) -> Entity | None:
        own = _own_id(item, ctx)
        if own is None:
            return None
        key, noun, ident = own
        kind = noun or ctx
        if kind is None:
            return None
        attributes = item.get("attributes")  # JSON:API keeps the name beside the id, under "attributes"
        name = _name(item) or (_name(attributes) if isinstance(attributes, dict) else None) or \
            _describe(item, key)
        return Entity(ident, name, kind) if name else None

    def visit(self, value: Any, ctx: str | None, depth: int) -> bool:
        """Walk `value`; True when it is itself a record that became an entity."""
        self.nodes += 1
        if depth > MAX_DEPTH or self.nodes > MAX_NODES or len(self.found) >= 4 * MAX_PER_RESULT:
            return False
        if isinstance(value, list):
            taken = 0
            for item in islice(value, MAX_LIST_SCAN):
                if taken >= self.limit:
                    break
                taken += self.visit(item, ctx, depth + 1)
            return False
        if isinstance(value, str) and depth <= 2:  # {"response": "[{\"id\": ...}]"} (ToolBench)
            if (inner := _parse_nested(value)) is not _MISSING:
                self.visit(inner, ctx, depth + 1)
            return False
        if not isinstance(value, dict):
            return False
        entity = self.record(value, ctx)
        taken = 0
        for key, child in islice(value.items(), MAX_KEYS):
            if not isinstance(key, str) or key in SKIP_KEYS or not isinstance(child, dict | list | str):
                continue
            if taken < self.limit or not isinstance(child, dict):
                taken += self.visit(child, _context(key, ctx, entity is not None), depth + 1)
        if entity:  # after its children, so the record a tool was about ends up most recent
            self.found.append((depth, len(self.found), entity))
        return entity is not None

    def chosen(self) -> list[tuple[int, int, Entity]]:
        """The shallowest first (what the result is about beats what it mentions), in walk order."""
        return sorted(sorted(self.found, key=lambda f: f[0])[:MAX_PER_RESULT], key=lambda f: f[1])


def _failed(result: Any) -> bool:
    return isinstance(result, dict) and bool(
        result.get("error") or result.get("errors") or False in (result.get("success"), result.get("ok")))


def _id_from_arguments(arguments: dict[str, Any], kind: str) -> str | None:
    """get_user_details(user_id=...) answered by a record that does not repeat its id."""
    head, *rest = kind.split("_")
    keys = (f"{head}{''.join(part.title() for part in rest)}Id", f"{kind}_id", "id")  # pageId, page_id, id
    candidates = [arguments.get(key) for key in keys]
    candidates += [value for key, value in islice(arguments.items(), MAX_KEYS)
                   if isinstance(key, str) and id_key(key) == (kind,)]
    return next((clean for value in candidates if (clean := clean_id(value))), None)


def _from_call(arguments: dict[str, Any], result: Any, kind: str, tool_words: set[str]) -> list[Entity]:
    """A result that names its record without its id (or an id without a name): the rest from the call.
    update_page(pageId, title) -> {"success": true}; create_page(title) -> {"id": "page-123"};
    find_user_id_by_name_zip(first_name, last_name, zip) -> "daiki_sanchez_3253"."""
    if _failed(result):
        return []  # the write failed: the name in the call never took effect
    if isinstance(result, dict):
        ident = clean_id(result.get("id")) or _id_from_arguments(arguments, kind)
        name = _name(result) or _name(arguments) or _describe(result, "id")
    elif tool_words & {"id", "ids"}:  # a tool whose job is to return an id
        ident, name = clean_id(result), _name(arguments) or _describe(arguments, "")
    else:
        return []
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


def _parse_nested(text: str) -> Any:
    """JSON, or a Python literal (ToolBench wraps `repr`s of API answers), inside a string field."""
    stripped = text.strip()
    if len(stripped) < 2 or len(stripped) > MAX_NESTED_CHARS or stripped[0] not in "[{" \
            or stripped[-1] not in "]}":
        return _MISSING
    parsed = _parse(stripped)
    if parsed is not _MISSING:
        return parsed
    try:
        return ast.literal_eval(stripped)  # literals only: no code runs
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _MISSING


def extract(tool_name: str | None, arguments: str | None, content: str, *,
            max_from_list: int = DEFAULT_MAX_FROM_LIST,
            type_patterns: dict[str, str] | None = None) -> list[Entity]:
    """Entities in one tool result: every record with an identifier key (`id`, `reservation_id`,
    `flightNumber`, `sku`, ...) and a name or a few describing fields, in nested records and lists (at most
    `max_from_list` records a list, `MAX_PER_RESULT` a result). A key's noun gives the type; a generic `id`
    takes the containing key's noun, else the tool's type (`type_patterns`, then the tool name). A result
    naming no entity may still yield one with the call's arguments."""
    kind = infer_type(tool_name, type_patterns)
    result = _parse(content)
    if result is _MISSING and kind and isinstance(content, str) and clean_id(content):
        result = content  # a bare id, not JSON-quoted
    if result is _MISSING:
        return []
    walk = _Walk(max(0, max_from_list))
    walk.visit(result, kind, 0)
    found = [entity for _, _, entity in walk.chosen()]
    top_named = any(depth == 0 for depth, _, _ in walk.found)
    call = _parse(arguments) if kind and not top_named and not isinstance(result, list) else None
    if kind and isinstance(call, dict):
        found += _from_call(call, result, kind, set(_nouns(tool_name or "")[0]))
    unique: dict[str, Entity] = {}
    for entity in found:  # one entry an id; the later (the record the call was about) wins
        unique.pop(entity.id, None)
        unique[entity.id] = entity
    return list(unique.values())[-MAX_PER_RESULT:]
