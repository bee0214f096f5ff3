"""Prometheus metrics: children found once per label values still count as prometheus_client's own."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from proxy.metrics import Metrics


@given(st.lists(st.tuples(st.sampled_from(["chat", "messages"]), st.sampled_from(["200", "400"]),
                          st.sampled_from(["default", "p"]), st.integers(1, 5)), max_size=30))
def test_counts_through_remembered_children_add_up_in_the_exposition(increments) -> None:
    metrics = Metrics()
    expected: dict[tuple[str, str, str], float] = {}
    for route, status, policy, amount in increments:
        metrics.requests.labels(route, status, policy).inc(amount)
        metrics.added_seconds.labels(route).observe(amount / 1000)
        key = (route, status, policy)
        expected[key] = expected.get(key, 0) + amount
    metrics.requests.labels(route="chat", status="200", policy="named").inc()  # (by name: prometheus's path)
    expected[("chat", "200", "named")] = 1
    families = list(text_string_to_metric_families(metrics.render().decode()))
    seen = {(s.labels["route"], s.labels["status"], s.labels["policy"]): s.value for family in families
            if family.name == "ctxproxy_requests" for s in family.samples if s.name.endswith("_total")}
    assert seen == expected
    counts = {s.labels["route"]: s.value for family in families
              if family.name == "ctxproxy_added_seconds" for s in family.samples if s.name.endswith("_count")}
    assert counts == {route: sum(1 for r, *_ in increments if r == route) for route, *_ in increments}
