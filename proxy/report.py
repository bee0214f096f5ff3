"""Figures over the archive, one definition for `ctxproxy report`, the dashboard and the tests.

Every figure is a sum over archived calls (proxy/accounting.py says what a call's spent, baseline and
saved are), so a total only moves when calls are added. Requests are what clients asked for (the first
call of each exchange); calls include the proxy's internal rounds and its own model calls (summaries,
headlines, folding: gate "internal"). Rows archived before accounting
existed count as requests with no dollars.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from proxy.errors import CtxProxyError
from proxy.store.storage import ArchiveQueries

GROUPS = {"session": "session_id", "policy": "policy", "model": "model", "day": "substr(created_at, 1, 10)",
          "hour": "substr(created_at, 1, 13)", "route": "route"}
FIELDS = ("requests", "calls", "sessions", "tokens_client", "tokens_forwarded", "tokens_cached",
          "spent_usd", "baseline_usd", "saved_usd", "saved_pct", "estimated_calls", "unpriced_calls",
          "summaries", "masked", "evictions", "internal_rounds", "recalls", "reads", "upstream_ms_avg",
          "added_ms_avg", "first", "last")
_FIRST = "coalesce(round, 0) = 0 and coalesce(gate, '') != 'internal'"  # a client's request
_SELECT = f"""
    sum(case when {_FIRST} then 1 else 0 end) as requests,
    count(*) as calls,
    count(distinct session_id) as sessions,
    sum(case when {_FIRST} then coalesce(tokens_before, 0) else 0 end) as tokens_client,
    sum(coalesce(tokens_after, 0)) as tokens_forwarded,
    sum(coalesce(cached_tokens, 0)) as tokens_cached,
    coalesce(sum(cost_usd), 0) as spent_usd,
    coalesce(sum(baseline_usd), 0) as baseline_usd,
    coalesce(sum(saved_usd), 0) as saved_usd,
    sum(case when cost_source = 'estimated' then 1 else 0 end) as estimated_calls,
    sum(case when cost_source = 'unpriced' then 1 else 0 end) as unpriced_calls,
    sum(coalesce(summaries, 0)) as summaries, sum(coalesce(masked, 0)) as masked,
    sum(coalesce(evictions, 0)) as evictions, sum(coalesce(internal_rounds, 0)) as internal_rounds,
    sum(coalesce(recalls, 0)) as recalls, sum(coalesce(reads, 0)) as reads,
    avg(upstream_ms) as upstream_ms_avg,
    avg(case when {_FIRST} then overhead_ms end) as added_ms_avg,
    min(created_at) as first, max(created_at) as last"""
_RELATIVE = re.compile(r"^(\d+)([mhdw])$")


@dataclass(frozen=True)
class Filters:
    session: str | None = None
    policy: str | None = None
    model: str | None = None
    since: str | None = None  # ISO date/time, or relative: 30m, 24h, 7d, 2w

    def where(self, now: datetime | None = None) -> tuple[str, list[Any]]:
        clauses, params = [], []
        for column, value in (("session_id", self.session), ("policy", self.policy), ("model", self.model)):
            if value:
                clauses.append(f"{column} = ?")
                params.append(value)
        if self.since:
            clauses.append("created_at >= ?")
            params.append(since_timestamp(self.since, now))
        return (" where " + " and ".join(clauses) if clauses else ""), params


def since_timestamp(value: str, now: datetime | None = None) -> str:
    """`--since` as the archive's timestamp format (UTC ISO); a clear error for anything else."""
    match = _RELATIVE.match(value.strip())
    if match:
        amount, unit = int(match.group(1)), match.group(2)
        delta = {"m": timedelta(minutes=amount), "h": timedelta(hours=amount), "d": timedelta(days=amount),
                 "w": timedelta(weeks=amount)}[unit]
        return ((now or datetime.now(UTC)) - delta).isoformat()
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        raise CtxProxyError(f"--since {value!r}: use an ISO date or time (2026-11-20, 2026-11-20T08:00) "
                            "or a span back from now (30m, 24h, 7d, 2w)", code="bad_argument") from None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).astimezone(UTC).isoformat()


def _finish(row: dict[str, Any]) -> dict[str, Any]:
    baseline = row.get("baseline_usd") or 0.0
    row["saved_pct"] = round(100.0 * (row.get("saved_usd") or 0.0) / baseline, 2) if baseline else None
    for key in ("spent_usd", "baseline_usd", "saved_usd"):
        row[key] = round(float(row.get(key) or 0.0), 6)
    for key in ("upstream_ms_avg", "added_ms_avg"):
        row[key] = round(row[key], 2) if row.get(key) is not None else None
    return row


def totals(reader: ArchiveQueries, filters: Filters = Filters()) -> dict[str, Any]:
    where, params = filters.where()
    rows = reader.rows(f"select {_SELECT} from exchanges{where}", params)
    return _finish(rows[0] if rows else {})


def grouped(reader: ArchiveQueries, by: str, filters: Filters = Filters(), limit: int | None = None,
            order: str = "last") -> list[dict[str, Any]]:
    """One row per session / policy / model / day / hour / route, newest activity first (or by `order`:
    last, spent_usd, saved_usd, requests)."""
    if by not in GROUPS:
        raise CtxProxyError(f"unknown grouping {by!r}: one of {', '.join(GROUPS)}", code="bad_argument")
    if order not in ("last", "spent_usd", "saved_usd", "requests", "key"):
        raise CtxProxyError(f"unknown order {order!r}", code="bad_argument")
    where, params = filters.where()
    sort = "key" if order == "key" else f"{order} desc"
    sql = (f"select {GROUPS[by]} as key, {_SELECT} from exchanges{where} group by key order by {sort}"
           + (" limit ?" if limit else ""))
    return [_finish(row) for row in reader.rows(sql, params + ([limit] if limit else []))]


def render(rows: list[dict[str, Any]], fmt: str, key: str | None = None) -> str:
    """table (aligned columns), csv or json."""
    columns = ([key] if key else []) + list(FIELDS)
    data = [{c: (row.get("key") if c == key else row.get(c)) for c in columns} for row in rows]
    if fmt == "json":
        return orjson.dumps(data, option=orjson.OPT_INDENT_2).decode()
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(data)
        return out.getvalue()
    if fmt != "table":
        raise CtxProxyError(f"unknown format {fmt!r}: table, csv or json", code="bad_argument")
    shown = [c for c in columns if c not in ("first", "tokens_cached", "recalls", "reads")]
    cells = [[_cell(row.get(c)) for c in shown] for row in data]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(shown)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(shown, widths, strict=True))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 100 else f"{value:,.2f}"
    return str(value)
