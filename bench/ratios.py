"""ctxproxy ÷ the bare forwarder: the ratios issue 14 sets its goals in (pure functions over result rows)."""

from __future__ import annotations

from typing import Any

FLOOR = "bare forwarder"
PROXIES = ("ctxproxy default", "ctxproxy passthrough")


def ratio(value: float | None, floor: float | None) -> float | None:
    """value ÷ floor; None where either is missing or the floor is not positive (no meaningful ratio)."""
    if value is None or floor is None or floor <= 0 or value != value or floor != floor:
        return None
    return value / floor


def latency_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each scenario with a bare-forwarder row: each ctxproxy target's added p50 and p99 over the floor's."""
    out = []
    for scenario in dict.fromkeys(r["scenario"] for r in rows):
        by = {r["target"]: r for r in rows if r["scenario"] == scenario}
        floor = by.get(FLOOR)
        if floor is None:
            continue
        for name in PROXIES:
            row = by.get(name)
            if row is None:
                continue
            out.append({"scenario": scenario, "target": name,
                        "added_p50_ms": row["added_p50_ms"], "floor_added_p50_ms": floor["added_p50_ms"],
                        "p50_ratio": ratio(row["added_p50_ms"], floor["added_p50_ms"]),
                        "added_p99_ms": row["added_p99_ms"], "floor_added_p99_ms": floor["added_p99_ms"],
                        "p99_ratio": ratio(row["added_p99_ms"], floor["added_p99_ms"])})
    return out


def cpu_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """CPU seconds per 1,000 requests of each row, with its ratio to the floor's at the same concurrency."""
    floors = {r["concurrency"]: r["cpu_per_1000"] for r in rows if r["target"] == FLOOR}
    return [r | {"ratio": ratio(r["cpu_per_1000"], floors.get(r["concurrency"]))} for r in rows]
