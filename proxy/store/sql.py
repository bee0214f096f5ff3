"""One way to write queries for both databases: SQLite's `?` placeholders, translated for psycopg.

Queries that read the archive (reports, the dashboard, pins, read-back) are written once, in the SQL
both databases share; the PostgreSQL schema provides what SQLite has built in (`rowid` columns, a
`group_concat` aggregate). `QmarkConnection` wraps a psycopg connection so such code takes either."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any


@functools.lru_cache(maxsize=512)
def to_pyformat(sql: str) -> str:
    """`?` outside string literals becomes `%s`; every literal `%` is doubled (psycopg's syntax)."""
    out, quoted = [], False
    for char in sql:
        if char == "'":
            quoted = not quoted  # '' inside a literal toggles twice: still inside
        if char == "%":
            out.append("%%")
        elif char == "?" and not quoted:
            out.append("%s")
        else:
            out.append(char)
    return "".join(out)


class QmarkConnection:
    """A psycopg connection that takes `?` queries and returns rows as tuples (cursor) or dicts (rows)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def execute(self, sql: str, params: Iterable[Any] = ()) -> Any:
        params = list(params)
        return self.conn.execute(to_pyformat(sql) if params else sql, params or None)

    def rows(self, sql: str, params: Iterable[Any] = ()) -> list[dict[str, Any]]:
        cursor = self.execute(sql, params)
        if cursor.description is None:
            return []
        names = [d.name for d in cursor.description]
        return [dict(zip(names, values, strict=True)) for values in cursor.fetchall()]
