"""The overview: totals, charts over time, and tables by project (policy) and model.

Every figure comes from proxy/report.py, the functions `ctxproxy report` prints, so the page and the CLI
agree by construction.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from proxy import report
from proxy.errors import BadRequest, CtxProxyError
from proxy.ui.charts import Series, bars, compact, dollars
from proxy.ui.page import Column, Page, cards, esc, table, url

if TYPE_CHECKING:
    from proxy.app import ProxyState

TOTALS = (("Requests", "requests", "count"), ("Upstream calls", "calls", "count"),
          ("Sessions", "sessions", "count"), ("Tokens from clients", "tokens_client", "count"),
          ("Tokens forwarded", "tokens_forwarded", "count"), ("Tokens from cache", "tokens_cached", "count"),
          ("Spent", "spent_usd", "usd"), ("Baseline (unmodified)", "baseline_usd", "usd"),
          ("Saved", "saved_usd", "usd"), ("Saved %", "saved_pct", "pct"),
          ("Proxy added (avg)", "added_ms_avg", "ms"), ("Upstream (avg)", "upstream_ms_avg", "ms"))
ACTIVITY = (("Summaries", "summaries", "count"), ("Masked", "masked", "count"),
            ("Evictions", "evictions", "count"), ("Internal rounds", "internal_rounds", "count"),
            ("Recalls", "recalls", "count"), ("Reads", "reads", "count"))


def filters_from(query: Mapping[str, str], session: str | None = None) -> report.Filters:
    since = query.get("since") or None
    if since:
        try:
            report.since_timestamp(since)
        except CtxProxyError as exc:  # the user's input: a 400 page saying what is accepted
            raise BadRequest(exc.message, param="since") from None
    return report.Filters(session=session, policy=query.get("policy") or None,
                          model=query.get("model") or None, since=since)


def figure_columns(key: Column) -> list[Column]:
    return [key, Column("Requests", "requests", "count"), Column("Sessions", "sessions", "count"),
            Column("Client tokens", "tokens_client", "count"),
            Column("Forwarded", "tokens_forwarded", "count"), Column("Cached", "tokens_cached", "count"),
            Column("Spent", "spent_usd", "usd"), Column("Baseline", "baseline_usd", "usd"),
            Column("Saved", "saved_usd", "usd"), Column("Saved %", "saved_pct", "pct"),
            Column("Added (avg)", "added_ms_avg", "ms"), Column("Upstream (avg)", "upstream_ms_avg", "ms")]


def bucket(total: dict[str, Any], asked: str | None) -> str:
    """Per hour when everything fits in two days, else per day (unless asked)."""
    if asked in ("day", "hour"):
        return asked
    try:
        span = datetime.fromisoformat(total["last"]) - datetime.fromisoformat(total["first"])
    except (TypeError, ValueError, KeyError):
        return "day"
    return "hour" if span.total_seconds() <= 48 * 3600 else "day"


def _short(key: str | None, by: str) -> str:
    key = key or "?"
    return key[5:] if by == "day" else f"{key[8:10]} {key[11:13]}h"


def filter_form(state: ProxyState, query: Mapping[str, str], action: str, extra: str = "") -> str:
    names = sorted(set(state.policies.names()) | ({query["policy"]} if query.get("policy") else set()))
    chosen = query.get("policy") or ""
    options = "".join(f'<option value="{esc(n)}"{" selected" if n == chosen else ""}>{esc(n)}</option>'
                      for n in ["", *names])
    return (f'<form class="filters" method="get" action="{esc(action)}">{extra}'
            f'<label>Policy (project)<select name="policy">{options}</select></label>'
            f'<label>Since (2026-11-20, 24h, 7d)<input name="since" value="{esc(query.get("since", ""))}" '
            'size="14"></label><button type="submit">Apply</button></form>')


def build(state: ProxyState, path: Mapping[str, str], query: Mapping[str, str]) -> Page:
    filters = filters_from(query)
    reader = state.reader
    total = report.totals(reader, filters)
    by = bucket(total, query.get("by"))
    over_time = report.grouped(reader, by, filters, order="key")
    by_policy = report.grouped(reader, "policy", filters, order="spent_usd")
    by_model = report.grouped(reader, "model", filters, order="spent_usd")
    labels = [_short(r["key"], by) for r in over_time]
    money = bars(f"Dollars per {by}: spent vs baseline", labels, [
        Series("spent", "spent", [r["spent_usd"] for r in over_time]),
        Series("baseline (unmodified)", "baseline", [r["baseline_usd"] for r in over_time])], dollars,
        ident="chart-dollars")
    tokens = bars(f"Tokens per {by}: from clients, forwarded, from cache", labels, [
        Series("client", "client", [float(r["tokens_client"] or 0) for r in over_time]),
        Series("forwarded", "forwarded", [float(r["tokens_forwarded"] or 0) for r in over_time]),
        Series("cached", "cached", [float(r["tokens_cached"] or 0) for r in over_time])], compact,
        ident="chart-tokens")
    notes = []
    if total.get("unpriced_calls"):
        notes.append(f"{total['unpriced_calls']} call(s) had no price for their model and count $0 "
                     "(set `pricing` in the config).")
    if total.get("estimated_calls"):
        notes.append(f"{total['estimated_calls']} call(s) were priced from estimated tokens (no usage).")
    switch = " · ".join(f'<a href="{esc(url("", **{**query, "by": b}))}">per {b}</a>'
                        for b in ("hour", "day"))
    body = (filter_form(state, query, url())
            + cards(total, TOTALS)
            + "".join(f'<p class="note">{esc(n)}</p>' for n in notes)
            + f'<h2>Over time <span class="muted">({switch})</span></h2>'
            + f'<div class="charts">{money}{tokens}</div>'
            + "<h2>What the proxy did</h2>" + cards(total, ACTIVITY, ident="activity")
            + "<h2>By policy (project)</h2>"
            + table(figure_columns(Column("Policy", "key", href=lambda r: url("/sessions", policy=r["key"]))),
                    by_policy, ident="by-policy")
            + "<h2>By model</h2>" + table(figure_columns(Column("Model", "key")), by_model, ident="by-model")
            + '<p class="note">The same figures as <code>ctxproxy report --by policy</code> / '
              "<code>--by model</code>: spent is what the provider billed for what was forwarded; baseline "
              "what the client's unmodified requests would have cost; saved the difference.</p>")
    return Page("Overview", body, section="Overview")
