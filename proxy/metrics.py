"""Prometheus metrics, one registry per app so several apps can live in one process (tests)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import Counter as _Counter
from prometheus_client import Histogram as _Histogram

_FAST_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
_SLOW_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class _LabelsOnce:
    """prometheus_client's `labels()` validates the values and takes a lock on every call (~3 us; a request
    makes about ten): here each set of values finds its child once. (No child is ever removed, so none
    goes stale.)"""

    def labels(self, *values: Any, **by_name: Any) -> Any:
        if by_name:
            return super().labels(*values, **by_name)  # type: ignore[misc]
        memo: dict[tuple[Any, ...], Any] = self.__dict__.setdefault("_children_once", {})
        child = memo.get(values)
        if child is None:
            child = memo[values] = super().labels(*values)  # type: ignore[misc]
        return child


class Counter(_LabelsOnce, _Counter):
    pass


class Histogram(_LabelsOnce, _Histogram):
    pass


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("ctxproxy_requests", "Requests answered, by route, status and policy.",
                                ["route", "status", "policy"], registry=self.registry)
        self.upstream_seconds = Histogram("ctxproxy_upstream_seconds",
                                          "Time from sending upstream to its response headers (and body "
                                          "when not streaming).", ["route"], buckets=_SLOW_BUCKETS,
                                          registry=self.registry)
        self.added_seconds = Histogram("ctxproxy_added_seconds",
                                       "Time the proxy itself adds to a request (total minus upstream).",
                                       ["route"], buckets=_FAST_BUCKETS, registry=self.registry)
        self.gate = Counter("ctxproxy_gate", "Budget gate decisions.", ["policy", "gate"],
                            registry=self.registry)
        self.tokens_before = Counter("ctxproxy_tokens_before", "Tokens the client sent.", ["policy"],
                                     registry=self.registry)
        self.tokens_after = Counter("ctxproxy_tokens_after", "Tokens forwarded upstream.", ["policy"],
                                    registry=self.registry)

        self.upstream_headers_seconds = Histogram(
            "ctxproxy_upstream_headers_seconds", "Streamed answers: time from sending upstream to its "
            "response headers (ctxproxy_upstream_seconds runs to the last byte).", ["route"],
            buckets=_SLOW_BUCKETS, registry=self.registry)
        self.actions = Counter("ctxproxy_actions", "What the proxy did: results summarized, observations and "
                               "results masked, results and exchanges evicted, internal rounds, recall and "
                               "read_tool_result calls answered.", ["policy", "action"],
                               registry=self.registry)
        self.archived_bytes = Counter("ctxproxy_archived_bytes", "Bytes handed to the archive (spooled).",
                                      registry=self.registry)
        self.spent_usd = Counter("ctxproxy_spent_usd", "Dollars spent upstream (proxy/accounting.py), "
                                 "internal rounds included.", ["policy", "model"], registry=self.registry)
        self.saved_usd = Counter("ctxproxy_saved_usd", "Dollars saved against the same requests unmodified, "
                                 "on the calls that cost less (net saved = this - ctxproxy_overspent_usd).",
                                 ["policy", "model"], registry=self.registry)
        self.overspent_usd = Counter("ctxproxy_overspent_usd", "Dollars the proxy cost more than the same "
                                     "requests unmodified, on the calls where it did.", ["policy", "model"],
                                     registry=self.registry)
        self.assembly_seconds = Histogram("ctxproxy_assembly_seconds", "Time to assemble injected blocks.",
                                          ["policy"], buckets=_FAST_BUCKETS, registry=self.registry)
        self.block_tokens = Histogram("ctxproxy_block_tokens", "Tokens injected per block.", ["block"],
                                      buckets=(50, 200, 500, 1000, 2000, 5000, 10_000, 50_000, 100_000),
                                      registry=self.registry)
        self.gc_pause_seconds = Histogram("ctxproxy_gc_pause_seconds", "Pauses of Python's cyclic garbage "
                                          "collector (proxy/collector.py), by generation: the event loop "
                                          "waits.", ["generation"], buckets=_FAST_BUCKETS,
                                          registry=self.registry)
        self.counts_restored = Counter("ctxproxy_token_counts_restored", "Messages whose token count came "
                                       "from the counts a previous process kept (proxy/kept_counts.py) "
                                       "instead of the tokenizer.", registry=self.registry)
        self.blocks_skipped = Counter("ctxproxy_blocks_skipped", "Block sources skipped (deadline, error, "
                                      "budget).", ["policy", "reason"], registry=self.registry)

    def observe_blocks(self, policy: str, blocks: Any) -> None:
        self.assembly_seconds.labels(policy).observe(blocks.duration_ms / 1000)
        for block, tokens in blocks.tokens.items():
            self.block_tokens.labels(block).observe(tokens)
        for skipped in blocks.skipped:
            self.blocks_skipped.labels(policy, skipped).inc()

    def observe_archived(self, row: dict[str, Any]) -> None:
        """An exchange row once committed (proxy/archive.py): its dollars."""
        policy, model = str(row.get("policy") or ""), str(row.get("model") or "")
        spent, saved = row.get("cost_usd"), row.get("saved_usd")
        if isinstance(spent, float | int):
            self.spent_usd.labels(policy, model).inc(max(0.0, float(spent)))
        if isinstance(saved, float | int):
            if saved >= 0:
                self.saved_usd.labels(policy, model).inc(float(saved))
            else:
                self.overspent_usd.labels(policy, model).inc(-float(saved))

    def render(self) -> bytes:
        return generate_latest(self.registry)
