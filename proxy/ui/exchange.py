"""One request (one archived upstream call): what the client sent beside what went upstream, the answer,
usage, dollars and timings, and the other calls (internal rounds) of the same request."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson

from proxy.archive_codec import loads
from proxy.ui.messages import align, answer, column, tally
from proxy.ui.page import NONE, NotFoundPage, Page, badge, esc, figure, link, pairs, pre, seg, url

if TYPE_CHECKING:
    from proxy.app import ProxyState

EXCHANGE_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def prices(stored: str | None) -> str:
    """The prices a call was reckoned with (stored per token) as people read them: per million tokens."""
    try:
        found = orjson.loads(stored or "null")
    except orjson.JSONDecodeError:
        return str(stored)
    if not isinstance(found, dict):
        return NONE
    shown = [f"{k.replace('_', ' ')} {v * 1e6:g}" for k, v in found.items()
             if isinstance(v, (int, float)) and not isinstance(v, bool)]
    source = f" (from {found['source']})" if isinstance(found.get("source"), str) else ""
    return ", ".join(shown) + source


def _fig(row: Mapping[str, Any], key: str, kind: str) -> str:
    return figure(key, row.get(key), kind)


def _calls(rows: list[dict[str, Any]], row: Mapping[str, Any]) -> str:
    """Every call of this request: the first and its internal rounds (same request chain)."""
    if len(rows) <= 1:
        return ""
    items = []
    for call in rows:
        label = f"call {call['round'] or 0}"
        if call["id"] == row["id"]:
            items.append(f"<b>{esc(label)} (this one)</b>")
        else:
            items.append(link(url(f"/exchanges/{seg(call['id'])}"), label))
    return ('<p id="calls">Upstream calls of this request (after the first, internal rounds: the proxy '
            f"answering read_tool_result / recall): {' · '.join(items)}</p>")


def _message(state: ProxyState, row: Mapping[str, Any]) -> dict[str, Any] | None:
    """The answer a call got (its archived response message)."""
    if not row.get("response_message_id"):
        return None
    found = state.reader.rows("select body from messages where id = ?", [row["response_message_id"]])
    return loads(found[0]["body"]) if found else None


def _final(state: ProxyState, calls: list[dict[str, Any]], row: Mapping[str, Any], session_id: str) -> str:
    """After internal rounds the client got the last call's answer: show it on every call's page."""
    if len(calls) <= 1 or calls[-1]["id"] == row["id"]:
        return ""
    return "<h2>What the client got (the last call's answer)</h2>" + answer(
        _message(state, calls[-1]), session_id, ident="final-answer")


def build(state: ProxyState, path: Mapping[str, str], query: Mapping[str, str]) -> Page:
    exchange_id = path["exchange_id"]
    if not EXCHANGE_ID.match(exchange_id):
        raise NotFoundPage("That is not an exchange id.")
    reader = state.reader
    found = reader.rows("select * from exchanges where id = ?", [exchange_id])
    if not found:
        raise NotFoundPage(f"No exchange {exchange_id!r} in the archive.")
    row = found[0]
    session_id = str(row["session_id"])
    sent = reader.chain(row["request_leaf"])
    forwarded = sent if row["forwarded_leaf"] == row["request_leaf"] else reader.chain(row["forwarded_leaf"])
    calls = reader.rows("select id, round, response_message_id from exchanges where session_id = ? and "
                        "request_leaf = ? order by created_at, rowid", [session_id, row["request_leaf"]])
    sent_marks, forwarded_marks = align(sent, forwarded)
    about = pairs([
        ("Session", link(url(f"/sessions/{seg(session_id)}"), session_id)),
        ("Time", esc(row["created_at"])), ("Policy", esc(row["policy"])), ("Model", esc(row["model"])),
        ("Route", esc(row["route"]) + (" (stream)" if row.get("stream") else "")),
        ("Round", esc(row.get("round") or 0)),
        ("Gate", badge(str(row.get("gate") or NONE), f"g-{row.get('gate')}")),
        ("Status", esc(row["status"]) + (f" — {esc(row['error'])}" if row.get("error") else "")),
        ("Finish reason", esc(row.get("finish_reason") or NONE)),
    ], ident="about")
    tokens = pairs([
        ("Client tokens (estimated)", _fig(row, "tokens_before", "count")),
        ("Forwarded tokens (estimated)", _fig(row, "tokens_after", "count")),
        ("Prompt tokens (provider)", _fig(row, "prompt_tokens", "count")),
        ("Completion tokens", _fig(row, "completion_tokens", "count")),
        ("Cached tokens", _fig(row, "cached_tokens", "count")),
        ("Cache writes", _fig(row, "cache_write_tokens", "count")),
        ("Baseline tokens", _fig(row, "baseline_tokens", "count")),
    ], ident="usage")
    money = pairs([
        ("Spent", _fig(row, "cost_usd", "usd")), ("Baseline", _fig(row, "baseline_usd", "usd")),
        ("Saved", _fig(row, "saved_usd", "usd")), ("Priced from", esc(row.get("cost_source") or NONE)),
        ("Prices ($ per million tokens)", esc(prices(row.get("prices")))),
    ], ident="costs")
    timing = pairs([
        ("Total", _fig(row, "latency_ms", "ms")), ("Upstream", _fig(row, "upstream_ms", "ms")),
        ("Upstream headers", _fig(row, "upstream_headers_ms", "ms")),
        ("Proxy added", _fig(row, "overhead_ms", "ms")),
    ], ident="timings")
    activity = pairs([(label, _fig(row, key, "count")) for label, key in (
        ("Summaries", "summaries"), ("Masked", "masked"), ("Evicted results", "evicted_results"),
        ("Evicted exchanges", "evictions"), ("Internal rounds", "internal_rounds"), ("Recalls", "recalls"),
        ("Reads", "reads"))], ident="activity")
    raw = f"<details><summary>as the provider sent it</summary>{pre(row['usage'])}</details>" \
        if row.get("usage") else ""
    boxes = (("Request", about), ("Usage", tokens + raw), ("Dollars", money), ("Timings", timing),
             ("What the proxy did", activity))
    body = ('<div class="boxes">' + "".join(f'<div class="box"><h3>{t}</h3>{b}</div>' for t, b in boxes)
            + "</div>" + _calls(calls, row)
            + '<h2>Messages</h2><div class="compare">'
            + f'<section id="sent"><h3>What the client sent ({len(sent)})</h3><p>{tally(sent_marks)}</p>'
            + column(sent, sent_marks, "req", session_id) + "</section>"
            + f'<section id="forwarded"><h3>What went upstream ({len(forwarded)})</h3>'
            + f"<p>{tally(forwarded_marks)}</p>"
            + column(forwarded, forwarded_marks, "fwd", session_id) + "</section></div>"
            + "<h2>Answer of this call</h2>" + answer(_message(state, row), session_id)
            + _final(state, calls, row, session_id))
    return Page(f"Request {exchange_id}", body, section="Sessions")
