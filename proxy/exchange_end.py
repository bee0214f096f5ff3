"""The end of an exchange: its timings and what the proxy did, onto its archive records; metrics; the
response headers that say what happened. Dollars are reckoned by the archive writer (proxy/accounting.py)
and come back through `on_archived`, once the exchange is committed."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any

import anyio

from proxy import telemetry
from proxy.archive import ExchangeRecord, request_params, utc_now
from proxy.archive_items import new_id
from proxy.internal_tools import READ_TOOL_RESULT, RECALL
from proxy.layers.tool_results import EVICTED, PLACEHOLDER, SUMMARY
from proxy.logs import log_exchange
from proxy.model_summary import Spend
from proxy.offload import INLINE_BYTES

INTERNAL = "internal"  # the gate column of the proxy's own model calls (not a client request)

if TYPE_CHECKING:
    from proxy.app import ProxyState
    from proxy.metrics import Metrics
    from proxy.pipeline import Outcome
    from proxy.policy import LoadedPolicy
    from proxy.session import Session
    from proxy.wire import Decoded, WireFormat


def exchange_record(wire: WireFormat, decoded: Decoded, policy: LoadedPolicy, session: Session, tenant: str,
                    **fields: Any) -> ExchangeRecord:
    """The archive record of one upstream call (or of an answer the proxy gave itself)."""
    return ExchangeRecord(
        id=new_id(), created_at=utc_now(), session_id=session.id, session_source=session.source,
        tenant=tenant, policy=policy.name, route=wire.route, model=decoded.model,
        stream=decoded.stream, request_messages=decoded.messages,
        params=request_params(decoded.params or decoded.body), **fields)


def ctxproxy_headers(session: Session, policy: LoadedPolicy, outcome: Outcome) -> dict[str, str]:
    skipped = outcome.blocks.skipped
    warning = {"x-ctxproxy-blocks-skipped": ",".join(skipped)} if skipped else {}
    if outcome.unrewritten:
        warning["x-ctxproxy-rewrite"] = "refused"  # a proxy bug, logged: the request went as received
    return warning | {
        "x-ctxproxy-session": session.id,
        "x-ctxproxy-policy": policy.name,
        "x-ctxproxy-gate": outcome.gate,
        "x-ctxproxy-tokens-before": str(outcome.tokens_before),
        "x-ctxproxy-tokens-after": str(outcome.tokens_after),
    }


def overhead(started: float, upstream_ms: float) -> dict[str, str]:
    """`x-ctxproxy-overhead-ms`: what the proxy added until the response starts (all of it but the time
    spent waiting on the upstream: to its headers when streaming, to its whole answer otherwise)."""
    added = (time.perf_counter() - started) * 1000 - upstream_ms
    return {"x-ctxproxy-overhead-ms": f"{max(0.0, added):.2f}"}


async def finish(state: ProxyState, wire: WireFormat, records: list[ExchangeRecord], started: float,
                 policy: str, outcome: Outcome | None = None, calls: Counter[str] | None = None) -> None:
    """Account for the exchange(s) and hand them to the archive. Returns once they are durable (in the
    archive's spool), so an answered exchange survives a crash; a busy writer makes us wait."""
    rest = finish_soon(state, wire, records, started, policy, outcome, calls)
    if rest is not None:
        await rest


def finish_soon(state: ProxyState, wire: WireFormat, records: list[ExchangeRecord], started: float,
                policy: str, outcome: Outcome | None = None,
                calls: Counter[str] | None = None) -> Coroutine[Any, Any, None] | None:
    """`finish` as far as it goes without waiting: None when the archive took the records at once (a
    spool append that will not wait, most exchanges), else what is left to await (the records spooled
    from a worker thread). Nothing done here can be interrupted (it never suspends): a stream's end
    needs no cancel scope around it but for what is left."""
    metrics = state.metrics
    elapsed_ms = (time.perf_counter() - started) * 1000
    upstream_ms = sum(r.upstream_ms for r in records)
    if records and not records[0].stream:
        metrics.added_seconds.labels(wire.route).observe(max(0.0, elapsed_ms - upstream_ms) / 1000)
    for number, record in enumerate(records):
        record.round, record.latency_ms = number, elapsed_ms
        metrics.upstream_seconds.labels(wire.route).observe(record.upstream_ms / 1000)
        if record.upstream_headers_ms is not None:
            metrics.upstream_headers_seconds.labels(wire.route).observe(record.upstream_headers_ms / 1000)
        metrics.requests.labels(wire.route, str(record.status), policy).inc()
    if records:
        note_activity(records[0], len(records) - 1, outcome, calls or Counter(), metrics, policy)
        records[0].overhead_ms = max(0.0, elapsed_ms - upstream_ms)
    if records and records[0].tokens_before is not None:
        metrics.tokens_before.labels(policy).inc(records[0].tokens_before)
        metrics.tokens_after.labels(policy).inc(records[-1].tokens_after or 0)
    telemetry.records_done(records)  # its trace span's usage and models (a stream's span ends here)
    archive = state.archive
    spooled: int | None = None
    if archive.has_room and all(_small(record) for record in records):
        spooled = archive.submit_many(records)  # a spool append that will not wait: no thread hop
    elif len(records) == 1 and _small_answer(records[0]):  # a resent history: only its new part is spooled
        spooled = archive.submit_small(records[0], INLINE_BYTES)
    if spooled is None:
        return _spooled_in_thread(state, records)
    metrics.archived_bytes.inc(spooled)
    return None


async def _spooled_in_thread(state: ProxyState, records: list[ExchangeRecord]) -> None:
    spooled = await anyio.to_thread.run_sync(state.archive.submit_many, records)
    state.metrics.archived_bytes.inc(spooled)


def _small(record: ExchangeRecord) -> bool:
    """A record that encodes and spools in well under a millisecond: a short request (by its tokens,
    ~4 bytes each; forwarded messages are no longer) and a short answer."""
    tokens = record.tokens_before
    return tokens is not None and tokens * 4 <= INLINE_BYTES and _small_answer(record)


def _small_answer(record: ExchangeRecord) -> bool:
    answer = len(record.response_body or b"") + sum(len(chunk) for chunk in record.response_chunks)
    return answer <= INLINE_BYTES


def note_activity(first: ExchangeRecord, rounds: int, outcome: Outcome | None, calls: Counter[str],
                  metrics: Metrics, policy: str) -> None:
    """What the proxy did in this exchange, on its first record and in the counters."""
    decided = outcome.decided if outcome is not None else {}
    if outcome is not None:
        first.client_cached_tokens = outcome.client_cached
        first.forwarded_cached_tokens = outcome.forwarded_cached
        first.evictions = len(outcome.evicted)
    first.summaries, first.masked = decided.get(SUMMARY, 0), decided.get(PLACEHOLDER, 0)
    first.evicted_results, first.internal_rounds = decided.get(EVICTED, 0), rounds
    first.recalls, first.reads = calls.get(RECALL, 0), calls.get(READ_TOOL_RESULT, 0)
    for action, count in (("summarized", first.summaries), ("masked", first.masked),
                          ("evicted_results", first.evicted_results), ("evicted_exchanges", first.evictions),
                          ("internal_rounds", rounds), ("recall", first.recalls),
                          ("read_tool_result", first.reads)):
        if count:
            metrics.actions.labels(policy, action).inc(count)


def on_archived(metrics: Metrics, log: Callable[[Mapping[str, Any]], None] = log_exchange,
                ) -> Callable[[list[dict[str, Any]]], None]:
    """The archive writer's hook: the exchange rows of each commit (no content) to the metrics, and one
    log line per exchange (its internal rounds' dollars added to its first call's)."""
    def hook(rows: list[dict[str, Any]]) -> None:
        line: dict[str, Any] | None = None
        for row in rows:
            metrics.observe_archived(row)
            if row.get("round") and line is not None:
                for key in ("cost_usd", "saved_usd"):
                    if isinstance(row.get(key), float | int):
                        line[key] = (line.get(key) or 0.0) + row[key]
                continue
            if line is not None:
                log(line)
            line = exchange_line(row)
        if line is not None:
            log(line)
    return hook


def exchange_line(row: Mapping[str, Any]) -> dict[str, Any]:
    """The log line's fields (proxy/logs.py EXCHANGE_FIELDS) from an archived row."""
    return {"session": row.get("session_id"), "policy": row.get("policy"), "model": row.get("model"),
            "route": row.get("route"), "status": row.get("status"), "gate": row.get("gate"),
            "tokens_in": row.get("tokens_before"), "tokens_out": row.get("tokens_after"),
            "tokens_cached": row.get("cached_tokens"), "summaries": row.get("summaries"),
            "masked": row.get("masked"), "evictions": row.get("evictions"),
            "internal_rounds": row.get("internal_rounds"), "recalls": row.get("recalls"),
            "upstream_ms": row.get("upstream_ms"), "added_ms": row.get("overhead_ms"),
            "cost_usd": row.get("cost_usd"), "saved_usd": row.get("saved_usd")}


def spend_recorder(state: ProxyState, policy: LoadedPolicy, session: Session, tenant: str) -> Spend:
    """Archives each model call the proxy makes for this client request (summaries, headlines, folding):
    no prompt is kept (it is the client's content, archived already), only the call, its answer and
    usage, so it counts as spent and against saved (proxy/accounting.py)."""
    async def spend(model: str, status: int, upstream_ms: float, payload: bytes) -> None:
        record = ExchangeRecord(
            id=new_id(), created_at=utc_now(), session_id=session.id, session_source=session.source,
            tenant=tenant, policy=policy.name, route="proxy/model", model=model, stream=False,
            request_messages=[], params={}, status=status, upstream_ms=upstream_ms, latency_ms=upstream_ms,
            gate=INTERNAL, response_body=payload)
        state.metrics.actions.labels(policy.name, "model_call").inc()
        await anyio.to_thread.run_sync(state.archive.submit, record)
    return spend
