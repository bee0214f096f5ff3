"""The sessions table, and one session: its figures, per-request timeline, requests and memory blocks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from proxy import report
from proxy.session import SESSION_ID
from proxy.store.storage import ArchiveQueries
from proxy.ui import memory
from proxy.ui.charts import timeline
from proxy.ui.overview import TOTALS, filter_form, filters_from
from proxy.ui.page import NONE, Column, NotFoundPage, Page, badge, cards, esc, pairs, seg, table, url

if TYPE_CHECKING:
    from proxy.app import ProxyState

LIMIT = 500  # sessions listed (newest activity first)
_CHUNK = 500  # ids per `in (...)` query
DOLLARS = (("spent_usd", "cost_usd"), ("saved_usd", "saved_usd"), ("baseline_usd", "baseline_usd"))


def session_info(reader: ArchiveQueries, ids: list[str]) -> dict[str, dict[str, Any]]:
    """Policies, models and how each session was identified (exchanges.session_source)."""
    info: dict[str, dict[str, Any]] = {}
    for start in range(0, len(ids), _CHUNK):
        part = ids[start:start + _CHUNK]
        for row in reader.rows(
                "select session_id, group_concat(distinct policy) as policy, group_concat(distinct model) "
                "as model, group_concat(distinct session_source) as source from exchanges "
                f"where session_id in ({', '.join('?' * len(part))}) group by session_id", part):
            info[row.pop("session_id")] = row
    return info


def session_link(row: Mapping[str, Any]) -> str:
    return url(f"/sessions/{seg(str(row['key']))}")


def listing(state: ProxyState, path: Mapping[str, str], query: Mapping[str, str]) -> Page:
    reader = state.reader
    rows = report.grouped(reader, "session", filters_from(query), limit=LIMIT)
    info = session_info(reader, [r["key"] for r in rows])
    for row in rows:
        row.update(info.get(row["key"], {}))
    wanted = query.get("q", "").strip().lower()
    if wanted:  # the same filter the page's script applies live, for browsers without it
        rows = [r for r in rows if wanted in " ".join(
            str(r.get(k) or "") for k in ("key", "policy", "model", "source", "last")).lower()]
    columns = [Column("Session", "key", href=session_link), Column("Policy", "policy"),
               Column("Model", "model"), Column("Client", "source"), Column("Requests", "requests", "count"),
               Column("Client tokens", "tokens_client", "count"),
               Column("Forwarded", "tokens_forwarded", "count"),
               Column("Cached", "tokens_cached", "count"), Column("Spent", "spent_usd", "usd"),
               Column("Saved", "saved_usd", "usd"), Column("Last activity", "last")]
    search = (f'<label>Filter<input name="q" value="{esc(query.get("q", ""))}" data-filter="sessions" '
              'placeholder="session, policy, model, client" size="28"></label>')
    more = f'<p class="note">The {LIMIT} sessions with the newest activity.</p>' if len(rows) == LIMIT else ""
    body = filter_form(state, query, url("/sessions"), extra=search) + table(columns, rows, ident="sessions",
                                                                             empty="no sessions") + more
    return Page("Sessions", body, section="Sessions")


def requests_of(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per client request: its first call plus its internal rounds (round > 0, same request)."""
    out: list[dict[str, Any]] = []
    open_by_leaf: dict[Any, dict[str, Any]] = {}
    for row in rows:
        first = open_by_leaf.get(row["request_leaf"]) if (row.get("round") or 0) > 0 else None
        if first is None:
            first = {**row, "calls": [], "tokens_client": row.get("tokens_before") or 0,
                     "tokens_forwarded": 0, "tokens_cached": 0, "spent_usd": 0.0, "saved_usd": 0.0,
                     "baseline_usd": 0.0}
            out.append(first)
            open_by_leaf[row["request_leaf"]] = first
        first["calls"].append(row)
        first["tokens_forwarded"] += row.get("tokens_after") or 0
        first["tokens_cached"] += row.get("cached_tokens") or 0
        for key, column in DOLLARS:
            first[key] += row.get(column) or 0.0
        first["status"] = row.get("status")
    for number, request in enumerate(out, 1):
        request["number"] = number
        request["rounds_shown"] = len(request["calls"]) - 1
    return out


def gate_badge(gate: Any) -> str:
    return badge(str(gate or NONE), f"g-{gate}")


def exchange_link(row: Mapping[str, Any]) -> str:
    return url(f"/exchanges/{seg(str(row['id']))}")


def one(state: ProxyState, path: Mapping[str, str], query: Mapping[str, str]) -> Page:
    session_id = path["session_id"]
    if not SESSION_ID.match(session_id):
        raise NotFoundPage("That is not a session id.")
    reader = state.reader
    rows = reader.exchanges(session_id)
    if not rows:
        raise NotFoundPage(f"No session {session_id!r} in the archive.")
    total = report.totals(reader, report.Filters(session=session_id))
    requests = requests_of(rows)
    for request in requests:
        request["gate_html"] = gate_badge(request.get("gate"))
    last = rows[-1]

    def distinct(key: str) -> str:
        return ", ".join(sorted({str(r[key]) for r in rows if r.get(key)})) or NONE

    about = pairs([("Policy", esc(distinct("policy"))), ("Model", esc(distinct("model"))),
                   ("Client (identified by)", esc(distinct("session_source"))),
                   ("Route", esc(distinct("route"))), ("Tenant (API key hash)", esc(distinct("tenant"))),
                   ("First", esc(rows[0]["created_at"])), ("Last", esc(last["created_at"]))], ident="about")
    columns = [Column("#", "number", href=exchange_link), Column("Time", "created_at"),
               Column("Gate", "gate_html", "html"), Column("Status", "status"),
               Column("Client tokens", "tokens_client", "count"),
               Column("Forwarded", "tokens_forwarded", "count"),
               Column("Cached", "tokens_cached", "count"), Column("Summaries", "summaries", "count"),
               Column("Masked", "masked", "count"), Column("Evictions", "evictions", "count"),
               Column("Rounds", "rounds_shown", "count"), Column("Recalls", "recalls", "count"),
               Column("Spent", "spent_usd", "usd"), Column("Saved", "saved_usd", "usd")]
    body = (about + cards(total, TOTALS)
            + "<h2>Timeline</h2>" + timeline(requests, exchange_link)
            + "<h2>Requests</h2>" + table(columns, requests, ident="requests")
            + '<p class="note">Forwarded, cached and dollars of a request include its internal rounds (the '
              "proxy answering read_tool_result / recall before the client gets its answer).</p>"
            + "<h2>Memory blocks as they stand</h2>"
            + memory.blocks(state, str(last["tenant"]), session_id, str(last["policy"] or "default")))
    return Page(f"Session {session_id}", body, section="Sessions")
