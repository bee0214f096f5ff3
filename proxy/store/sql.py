"""One way to write queries for both databases: SQLite's `?` placeholders, translated for psycopg.

Queries that read the archive (reports, the dashboard, pins, read-back) are written once, in the SQL
both databases share; the PostgreSQL schema provides what SQLite has built in (`rowid` columns, a
`group_concat` aggregate). `QmarkConnection` wraps a psycopg connection so such code takes either."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
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
    """A psycopg connection that takes `?` queries and returns rows as tuples (cursor) or dicts (rows).

    `encode`/`decode`, when given, map each parameter on its way in and each value read on its way out
    (postgres.encode_text / decode_text: text cells that hold NUL), whatever the connection's rows are."""

    def __init__(self, conn: Any, *, encode: Callable[[Any], Any] | None = None,
                 decode: Callable[[Any], Any] | None = None) -> None:
        self.conn = conn
        self._encode, self._decode = encode, decode

    def execute(self, sql: str, params: Iterable[Any] = ()) -> Any:
        encode = self._encode
        params = [encode(p) for p in params] if encode is not None else list(params)
        query = to_pyformat(sql) if params else sql
        if self._decode is None:
            return self.conn.execute(query, params or None)
        cursor = self.conn.cursor(row_factory=self._decoding(self.conn.row_factory))
        return cursor.execute(query, params or None)

    def _decoding(self, rows: Callable[[Any], Callable[[Sequence[Any]], Any]]) -> Callable[[Any], Any]:
        decode = self._decode
        assert decode is not None

        def row_factory(cursor: Any) -> Callable[[Sequence[Any]], Any]:
            make = rows(cursor)
            return lambda values: make([decode(value) for value in values])
        return row_factory

    def rows(self, sql: str, params: Iterable[Any] = ()) -> list[dict[str, Any]]:
        cursor = self.execute(sql, params)
        if cursor.description is None:
            return []
        names = [d.name for d in cursor.description]
        return [dict(zip(names, values, strict=True)) for values in cursor.fetchall()]
