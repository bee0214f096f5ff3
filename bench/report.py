"""Markdown tables for the overhead benchmark (milliseconds, three significant digits)."""

from __future__ import annotations

import math
from typing import Any


def sig3(value: float | None) -> str:
    """Three significant digits, never in exponent form."""
    if value is None or math.isnan(value):
        return "-"
    if value == 0:
        return "0"
    decimals = 2 - math.floor(math.log10(abs(value)))
    return f"{round(value, decimals):.{max(decimals, 0)}f}"


def table(headers: list[str], rows: list[list[str]], left: int = 1) -> str:
    """A markdown table; the first `left` columns are text, the rest numbers (right-aligned)."""
    align = ["---" if i < left else "---:" for i in range(len(headers))]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def print_report(result: dict[str, Any]) -> None:
    print(f"## ctxproxy overhead ({result['mode']}; python {result['python']}, {result['cpus']} cpus, "
          "loopback, fake upstream)\n")
    print("Latency, sequential, time to last byte. added = target percentile minus direct percentile.\n")
    print(table(["scenario", "target", "n", "p50 ms", "p99 ms", "added p50 ms", "added p99 ms", "errors"],
                [[r["scenario"], r["target"], str(r["n"]), sig3(r["p50_ms"]), sig3(r["p99_ms"]),
                  sig3(r["added_p50_ms"]), sig3(r["added_p99_ms"]), str(r["errors"])]
                 for r in result["latency"]], left=2))
    print(f"\nThroughput, small non-streaming requests, concurrency {result['concurrency']} "
          "(load generator is one Python process on the same 2 cores).\n")
    print(table(["target", "requests", "seconds", "req/s", "p50 ms", "p99 ms", "errors"],
                [[r["target"], str(r["requests"]), sig3(r["seconds"]), sig3(r["rps"]), sig3(r["p50_ms"]),
                  sig3(r["p99_ms"]), str(r["errors"])] for r in result["throughput"]]))
    print(f"\nhistory payload: {result['big_bytes']} bytes, {result['big_messages']} messages")
    mean = sig3(result["ctxproxy_added_mean_ms"])
    by_route = ", ".join(f"{route} {sig3(ms)} ms"
                         for route, ms in sorted(result.get("ctxproxy_added_mean_ms_by_route", {}).items()))
    print(f"ctxproxy's own ctxproxy_added_seconds metric (handler time outside the upstream call), "
          f"mean over all its requests: {mean} ms" + (f" (by route: {by_route})" if by_route else ""))
    for scenario, gap in result.get("route_gap", {}).items():
        print(f"{scenario}: the messages route adds {sig3(gap['p50_ms'])} ms at p50 and "
              f"{sig3(gap['p99_ms'])} ms at p99 more than the chat route (goal: within 0.3 ms)")
    archive = result["archive"]
    match = "all recorded" if archive.get("exchanges") == result["ctxproxy_requests"] else "MISMATCH"
    print(f"ctxproxy archive after SIGINT (exit {archive.get('exit_code')}): "
          f"{archive.get('exchanges', archive.get('error'))} exchanges for {result['ctxproxy_requests']} "
          f"requests sent ({match}); {archive.get('messages')} distinct messages, "
          f"{archive.get('db_bytes')} bytes")
    print(f"ctxproxy source: {result['ctxproxy_src']}")
    print(f"litellm: {result['litellm']}")
