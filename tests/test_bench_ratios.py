"""The overhead benchmark's ratio helpers and /proc parsing (bench/ratios.py, bench/procstat.py)."""

from __future__ import annotations

import os

from bench.procstat import cpu_seconds, parse_cpu_seconds, rss_mb
from bench.ratios import cpu_ratios, latency_ratios, ratio


def _row(scenario: str, target: str, p50: float | None, p99: float | None) -> dict[str, object]:
    return {"scenario": scenario, "target": target, "added_p50_ms": p50, "added_p99_ms": p99}


def test_ratio_guards_missing_and_non_positive_floors() -> None:
    assert ratio(2.0, 1.0) == 2.0
    assert ratio(None, 1.0) is None
    assert ratio(1.0, 0.0) is None
    assert ratio(1.0, -0.5) is None
    assert ratio(float("nan"), 1.0) is None


def test_latency_ratios_per_scenario_and_proxy_target() -> None:
    rows = [_row("small", "direct", None, None), _row("small", "ctxproxy default", 3.0, 9.0),
            _row("small", "ctxproxy passthrough", 2.0, 6.0), _row("small", "bare forwarder", 2.0, 3.0),
            _row("small_by_route", "ctxproxy chat", 1.0, 1.0)]
    got = latency_ratios(rows)
    assert [(r["scenario"], r["target"], r["p50_ratio"], r["p99_ratio"]) for r in got] == [
        ("small", "ctxproxy default", 1.5, 3.0), ("small", "ctxproxy passthrough", 1.0, 2.0)]


def test_cpu_ratios_against_the_floor_at_the_same_concurrency() -> None:
    rows = [{"target": "bare forwarder", "concurrency": 1, "cpu_per_1000": 2.0},
            {"target": "ctxproxy default", "concurrency": 1, "cpu_per_1000": 3.0},
            {"target": "ctxproxy default", "concurrency": 16, "cpu_per_1000": 3.0}]
    assert [r["ratio"] for r in cpu_ratios(rows)] == [1.0, 1.5, None]


def test_parse_cpu_seconds_with_a_command_name_holding_spaces_and_parens() -> None:
    fields = ["S"] + ["0"] * 10 + ["150", "50"] + ["0"] * 30  # state, then fields 4..; utime 150, stime 50
    assert parse_cpu_seconds("42 (a (b) c) " + " ".join(fields), ticks=100) == 2.0


def test_own_process_reads() -> None:
    assert cpu_seconds(os.getpid()) >= 0
    assert (rss_mb(os.getpid()) or 0) > 1


def test_the_floor_report_prints_the_restart_and_the_long_run(capsys) -> None:
    from bench.report import print_floor

    run = {"requests": 20, "errors": 0, "seconds": 1.0, "cpu_s": 0.5, "rss_start_mb": 100.0, "rss_mb": 120.0}
    print_floor({"latency": [], "session": {"status": "ran", "sessions": 1, "turns": 2},
                 "startup": {"ctxproxy": {"cold_start_s": 1.4, "cold_starts_s": [1.8, 1.4, 1.2],
                                          "rss_mb": 119.0},
                             "ctxproxy, restarted": {"cold_start_s": 0.9, "rss_mb": 119.0}},
                 "long_run": {"sessions": 1, "turns": 20, "interleaved": True,
                              "ctxproxy": {**run, "cpu_s": 0.6}, "bare forwarder": run,
                              "resumed": {"size": "2MB", "first_sight_ms": 567.0, "turns_ms": [10.0, 12.0],
                                          "after_restart_ms": 108.0, "next_ms": [9.19]}}})
    out = capsys.readouterr().out
    assert "| 567 | 10.0 / 12.0 | 108 | 9.19 |" in out
    assert "measured interleaved" in out
    assert "| ctxproxy | 1.40 | 1.80 / 1.40 / 1.20 | 119 |" in out
    assert "| ctxproxy, restarted | 0.900 |  | 119 |" in out
    assert "| ctxproxy | 20 | 0 | 1.00 | 0.600 | 1.20 |" in out
    assert "| bare forwarder | 20 | 0 | 1.00 | 0.500 | 1.00 |" in out


def test_each_request_goes_to_every_target_in_a_rotating_order() -> None:
    from bench.measure import in_turn

    assert in_turn(3, 0) == [0, 1, 2] and in_turn(3, 4) == [1, 2, 0] and in_turn(1, 7) == [0]
