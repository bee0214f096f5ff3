"""JSON records as compact tables: every short scalar field of every record (ids, numbers, codes, names,
prices, statuses, dates) under one header line per table, nested records flattened (`prices.economy`) or
split into their own table (`items[]`), long free text left out and named.

A row keeps each value verbatim (strings unquoted unless ambiguous), so every id and number of the original
appears literally. Work is one pass over the document; depth is bounded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from .common import BREAK_RE, MAX_DEPTH, VALUE_W, _clip

LONG_TEXT = 100  # strings longer than this are free text, not a decision field
MAX_TABLES = 40
SEP = " | "


@dataclass
class Table:
    name: str
    rows: list[dict[str, str]] = field(default_factory=list)
    locs: list[str] = field(default_factory=list)  # each row's place, e.g. "[2][0]" or ".items[1]"
    parents: dict[str, None] = field(default_factory=dict)  # containers the rows came from


@dataclass
class Tables:
    fields: list[str] = field(default_factory=list)  # top-level scalars: "key = value"
    tables: dict[str, Table] = field(default_factory=dict)
    long_text: dict[str, int] = field(default_factory=dict)  # field -> values dropped
    dropped: list[str] = field(default_factory=list)  # the dropped texts, for their ids and paths
    more_tables: int = 0


def cell(v: object) -> str:
    if isinstance(v, str):
        s = v if v and SEP.strip() not in v and not BREAK_RE.search(v) and v == v.strip() else json.dumps(v)
    else:
        s = json.dumps(v, ensure_ascii=False)
    return _clip(s, VALUE_W)


def _scalar(v: object) -> bool:
    return v is None or isinstance(v, str | int | float | bool)


def _record_map(v: dict) -> bool:
    """{"6700049080": {...}, "4859937227": {...}}: records keyed by id, a table with a `key` column."""
    return len(v) >= 2 and all(isinstance(x, dict) for x in v.values())


class _Builder:
    def __init__(self) -> None:
        self.out = Tables()

    def _table(self, name: str) -> Table | None:
        if name not in self.out.tables:
            if len(self.out.tables) >= MAX_TABLES:
                self.out.more_tables += 1
                return None
            self.out.tables[name] = Table(name)
        return self.out.tables[name]

    def _text(self, key: str, v: str) -> bool:
        if len(v) <= LONG_TEXT:
            return False
        self.out.long_text[key] = self.out.long_text.get(key, 0) + 1
        self.out.dropped.append(v)
        return True

    def record(self, d: dict, table: str, parent: str, row: dict[str, str], prefix: str, depth: int) -> None:
        for k, v in d.items():
            key = f"{prefix}{k}"
            if _scalar(v):
                if not (isinstance(v, str) and self._text(f"{table}.{key}", v)):
                    row[key] = cell(v)
            elif isinstance(v, dict) and depth < MAX_DEPTH:
                if _record_map(v):
                    self.rows(v, f"{table}.{key}{{}}", f"{parent}.{key}", depth + 1)
                else:
                    self.record(v, table, parent, row, f"{key}.", depth + 1)
            elif isinstance(v, list) and depth < MAX_DEPTH:
                if all(_scalar(x) for x in v):
                    row[key] = _clip(", ".join(cell(x) for x in v), 2 * VALUE_W) if v else "[]"
                else:
                    self.rows(v, f"{table}.{key}[]", f"{parent}.{key}", depth + 1)
            else:
                row[key] = _clip(json.dumps(v, ensure_ascii=False), VALUE_W)

    def rows(self, container: list | dict, table: str, parent: str, depth: int) -> None:
        items = container.items() if isinstance(container, dict) else enumerate(container)
        for k, v in items:
            loc = f"{parent}[{k}]" if isinstance(container, list) else f"{parent}.{k}"
            if isinstance(v, dict):
                target = self._table(table)
                if target is None:
                    continue
                row: dict[str, str] = {} if isinstance(container, list) else {"key": cell(k)}
                target.rows.append(row)
                target.locs.append(loc)
                target.parents[parent] = None
                self.record(v, table, loc, row, "", depth + 1)
            elif isinstance(v, list) and depth < MAX_DEPTH:
                self.rows(v, f"{table}[]", loc, depth + 1)
            elif (target := self._table(table)) is not None:
                target.rows.append({"value": cell(v)} if not isinstance(container, dict) else
                                   {"key": cell(k), "value": cell(v)})
                target.locs.append(loc)
                target.parents[parent] = None


def build(doc: dict | list) -> Tables:
    b = _Builder()
    if isinstance(doc, list) or _record_map(doc):
        b.rows(doc, "[]" if isinstance(doc, list) else "{}", "", 1)
        return b.out
    row: dict[str, str] = {}
    b.record(doc, "", "", row, "", 1)
    nulls = [k for k, v in row.items() if v == "null"]
    # Sibling fields of a nested object share one line ("address: city=Denver; zip=80298"); nulls one more.
    groups: dict[str, list[str]] = {}
    for k, v in row.items():
        if v != "null":
            head, dot, tail = k.rpartition(".")
            groups.setdefault(head if dot else "", []).append(f"{tail} = {v}" if dot else f"{k} = {v}")
    b.out.fields = groups.pop("", [])
    b.out.fields += [f"{head}: {'; '.join(items)}" for head, items in groups.items()]
    if nulls:
        b.out.fields.append("null: " + ", ".join(nulls))
    return b.out


def render(table: Table) -> tuple[str, list[str]]:
    """(title with the column header and the values every row shares, row lines).

    Rows from several containers (a list of lists, the items of each order) start with their place; a row
    equal to an earlier one says so ("= [0][1]") instead of repeating it. A `key` column that repeats
    another column (records keyed by their own id) is left out."""
    cols = list(dict.fromkeys(c for row in table.rows for c in row))
    n = len(table.rows)
    if "key" in cols and any(c != "key" and all(r.get(c) == r.get("key") for r in table.rows) for c in cols):
        cols.remove("key")
    same = {c: table.rows[0].get(c) for c in cols} if n >= 3 else {}
    same = {c: v for c, v in same.items() if v is not None and all(row.get(c) == v for row in table.rows)}
    shown = [c for c in cols if c not in same]
    if not shown and same:  # every row identical: show one
        shown, same = cols, {}
    title = f"{table.name.lstrip('.') or 'records'} ({n} rows)"
    if same:
        title += "; every row: " + ", ".join(f"{c}={v}" for c, v in same.items())
    placed = len(table.parents) > 1
    title += f"\n  {SEP.join((['at'] if placed else []) + shown)}"
    lines: list[str] = []
    first: dict[str, str] = {}
    for row, loc in zip(table.rows, table.locs, strict=True):
        line = SEP.join(row.get(c, "") for c in shown).rstrip(" |")
        if placed:
            where = loc.lstrip(".")
            same_as = first.setdefault(line, where)
            line = f"{where}{SEP}= {same_as}" if same_as != where else f"{where}{SEP}{line}"
        lines.append("  " + line)
    return title, lines
