"""JSON summaries: merged shapes, top-level fields, samples and every id-like value verbatim."""

from __future__ import annotations

import json

from .common import (
    BREAK_RE,
    ERR_W,
    LINE_W,
    MAX_DEPTH,
    MAX_ERR,
    MAX_FIELDS,
    MAX_ID_KEYS,
    SAMPLE,
    VALUE_W,
    _clip,
    _distinct,
    _layout,
    _plural,
    _Sec,
)
from .json_table import build, render
from .salient import STRONG_RE, collapsed, find_ids, find_paths, flag_lines, group_paths

STRONG_ID_KEYS = frozenset({"id", "uuid", "key", "sku", "code", "number"})
ID_KEYS = STRONG_ID_KEYS | {"name", "title", "slug", "filename", "path", "url", "email"}
NOUNS = {"object": "objects", "str": "strings", "": "items"}  # JSON array element types -> header noun


def _tname(v: object) -> str:
    if v is None or isinstance(v, bool):
        return "null" if v is None else "bool"
    return {int: "int", float: "float", str: "str", dict: "object", list: "array"}.get(type(v), "value")


def _dump(v: object) -> str:
    return json.dumps(v, ensure_ascii=False)  # values came from json.loads, so this cannot fail


def _fields(dicts: list[dict], depth: int) -> list[str]:
    by_key: dict[str, list[object]] = {}
    for d in dicts:
        for k, v in d.items():
            by_key.setdefault(k, []).append(v)
    return [f"{k}{'' if len(vs) == len(dicts) else '?'}: {_shape(vs, depth)}" for k, vs in by_key.items()]


def _shape(values: list[object], depth: int) -> str:
    """Merged shape of sample values, e.g. 'str|null', 'array[3] of {sku: str, qty: int}'."""
    parts = []
    for t in _distinct([_tname(v) for v in values[:SAMPLE]]):
        if t == "object":
            fields = _fields([v for v in values[:SAMPLE] if isinstance(v, dict)], depth + 1) \
                if depth < MAX_DEPTH else ["…"]
            more = f", +{len(fields) - MAX_FIELDS} keys" if len(fields) > MAX_FIELDS else ""
            parts.append("{" + ", ".join(fields[:MAX_FIELDS]) + more + "}")
        elif t == "array":
            arrays = [v for v in values[:SAMPLE] if isinstance(v, list)]
            lo, hi = min(map(len, arrays)), max(map(len, arrays))
            items = [x for a in arrays for x in a[:SAMPLE]][:SAMPLE]
            inner = "" if not items else " of …" if depth >= MAX_DEPTH else f" of {_shape(items, depth + 1)}"
            parts.append(f"array[{lo if lo == hi else f'{lo}..{hi}'}]{inner}")
        else:
            parts.append(t)
    return "|".join(parts)


def _is_id_key(key: str) -> bool:
    low = key.lower()
    return low in ID_KEYS or low.endswith(("_id", "-id")) or (len(key) > 2 and key.endswith(("Id", "ID")))


def _id_value(v: object) -> str:
    s = v if isinstance(v, str) else _dump(v)
    if not s or ", " in s or s != s.strip() or BREAK_RE.search(s):
        s = _dump(s)  # quoted only when the bare value would be ambiguous in a ", " list
    return _clip(s, VALUE_W)


def _collect_ids(doc: object) -> dict[str, dict[str, None]]:
    """Values of id-like keys anywhere in the document, per key, de-duplicated in document order."""
    found: dict[str, dict[str, None]] = {}
    stack = [doc]  # explicit stack: json.loads accepts nesting deeper than our recursion limit
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for k, v in node.items():
                if isinstance(v, str | int | float) and not isinstance(v, bool) and _is_id_key(k):
                    found.setdefault(k, {})[_id_value(v)] = None
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend(c for c in reversed(list(children)) if isinstance(c, dict | list))
    return found


def _id_secs(found: dict[str, dict[str, None]]) -> list[_Sec]:
    def weight(key: str) -> int:  # real identifiers before names and titles
        return 4 if key.lower() in STRONG_ID_KEYS or key.lower().endswith("id") else 2

    secs = [_Sec(list(vals), f"{_clip(k, 40)} ({len(vals)} distinct): ", "", weight(k), inline=True)
            for k, vals in list(found.items())[:MAX_ID_KEYS]]
    return secs + [_Sec([f"(+{len(found) - MAX_ID_KEYS} more id-like keys)"])] * (len(found) > MAX_ID_KEYS)


def _json_title(doc: dict | list) -> str:
    if isinstance(doc, dict):
        return f"JSON object with {_plural(len(doc), 'key')}"
    types = _distinct([_tname(v) for v in doc])
    noun = NOUNS.get("|".join(types), f"items ({'|'.join(types)})")
    return f"JSON array of {len(doc)} {noun}"


def _json_summary(doc: dict | list, text: str, max_chars: int, cap: int | None = None) -> str:
    """Header, top-level fields, one table per kind of record (critical), the structure as context, and
    the ids, paths and error lines of long free text that the tables leave out."""
    found = build(doc)
    secs = [_Sec([f"{_json_title(doc)}, {len(text)} chars"], weight=50, critical=True),
            _Sec([_clip(f, LINE_W) for f in found.fields], "fields:", "fields", 6, critical=True)]
    for table in found.tables.values():
        title, rows = render(table)
        secs.append(_Sec(rows, _clip(title, 4 * LINE_W), "rows", 5, critical=True))
    if found.more_tables:
        secs.append(_Sec([f"(+{found.more_tables} more record kinds)"], critical=True))
    if isinstance(doc, dict) and not found.tables:
        secs.append(_Sec([_clip(f"{k}: {_shape([v], 1)}", LINE_W) for k, v in doc.items()
                          if isinstance(v, dict | list)], "structure:", "keys", 2))
    if found.long_text:
        secs.append(_Sec([", ".join(f"{k.lstrip('.')} ({n})" for k, n in found.long_text.items())],
                         "long text left out: ", "", 2, inline=True))
    dropped = "\n".join(found.dropped)
    lines = text.splitlines()
    strong, _ = flag_lines(lines) if len(lines) > 1 else ([], [])
    if strong:
        secs.append(_Sec(collapsed(lines, strong[:MAX_ERR]), "error lines:", "error lines", 8, critical=True))
    elif dropped:
        flagged = [line for line in found.dropped if STRONG_RE.search(line)]
        secs.append(_Sec([_clip(x, ERR_W) for x in flagged[:MAX_ERR]], "error text:", "", 8, critical=True))
    if dropped:
        paths = find_paths(dropped)
        ids = [_clip(t, VALUE_W) for t in find_ids(dropped, skip=paths)]
        secs.append(_Sec(group_paths(paths), "paths in that text:", "directories", 4, critical=True))
        secs.append(_Sec(ids, "ids in that text: ", "ids", 3, inline=True, critical=True))
    return _layout(secs, max_chars, cap)
