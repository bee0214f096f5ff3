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
    print_floor(result)
    print("\nThroughput, small non-streaming requests (load generator is one Python process on the same "
          "2 cores).\n")
    print(table(["target", "concurrency", "requests", "seconds", "req/s", "p50 ms", "p99 ms", "errors"],
                [[r["target"], str(r["concurrency"]), str(r["requests"]), sig3(r["seconds"]), sig3(r["rps"]),
                  sig3(r["p50_ms"]), sig3(r["p99_ms"]), str(r["errors"])] for r in result["throughput"]]))
    print(f"\nhistory payload: {result['big_bytes']} bytes, {result['big_messages']} messages")
    mean = sig3(result["ctxproxy_added_mean_ms"])
    by_route = ", ".join(f"{route} {sig3(ms)} ms"
                         for route, ms in sorted(result.get("ctxproxy_added_mean_ms_by_route", {}).items()))
    print(f"ctxproxy's own ctxproxy_added_seconds metric (handler time outside the upstream call), "
          f"mean over all its requests: {mean} ms" + (f" (by route: {by_route})" if by_route else ""))
    route_rows = by_route_rows(result)
    if route_rows:
        print("\nBy route (same process, interleaved; added = through ctxproxy minus the fake upstream's own "
              "route called directly; gap = added minus the chat route's added; goal: gap p50 within 0.3 ms):"
              "\n")
        print(table(["scenario", "route", "added p50 ms", "added p99 ms", "gap to chat p50 ms",
                     "gap to chat p99 ms"], route_rows, left=2))
        events = result.get("stream_events") or {}
        if events:
            print("\nSSE events in one streamed answer (the same 18 text deltas in each format; the proxy "
                  "relays each event on its own): " + ", ".join(f"{k} {v}" for k, v in events.items()))
    archive = result["archive"]
    match = "all recorded" if archive.get("exchanges") == result["ctxproxy_requests"] else "MISMATCH"
    print(f"ctxproxy archive after SIGINT (exit {archive.get('exit_code')}): "
          f"{archive.get('exchanges', archive.get('error'))} exchanges for {result['ctxproxy_requests']} "
          f"requests sent ({match}); {archive.get('messages')} distinct messages, "
          f"{archive.get('db_bytes')} bytes")
    print(f"ctxproxy source: {result['ctxproxy_src']}")
    print(f"litellm: {result['litellm']}")


def by_route_rows(result: dict[str, Any]) -> list[list[str]]:
    """One row per route of each `*_by_route` scenario: its added latency and its gap to chat's."""
    rows = []
    gaps = result.get("route_gap", {})
    for r in result["latency"]:
        if not r["scenario"].endswith("_by_route") or not r["target"].startswith("ctxproxy "):
            continue
        route = r["target"].removeprefix("ctxproxy ")
        gap = gaps.get(r["scenario"], {}).get(route, {})
        rows.append([r["scenario"], route, sig3(r["added_p50_ms"]), sig3(r["added_p99_ms"]),
                     sig3(gap.get("p50_ms")), sig3(gap.get("p99_ms"))])
    return rows


def print_floor(result: dict[str, Any]) -> None:
    """The comparison with the bare forwarder (issue 14): latency ratios, CPU per request, start-up."""
    ratios = result.get("ratios") or []
    if ratios:
        print("\nctxproxy ÷ bare forwarder (added = target minus direct; goal ≤ 1.1, flat in size):\n")
        print(table(["scenario", "target", "added p50 ms", "bare p50 ms", "p50 ratio", "added p99 ms",
                     "bare p99 ms", "p99 ratio"],
                    [[r["scenario"], r["target"], sig3(r["added_p50_ms"]), sig3(r["floor_added_p50_ms"]),
                      sig3(r["p50_ratio"]), sig3(r["added_p99_ms"]), sig3(r["floor_added_p99_ms"]),
                      sig3(r["p99_ratio"])] for r in ratios], left=2))
    session = result.get("session") or {}
    if session:
        spans = "; ".join(f"{label} {first / 1000:.0f} to {last / 1000:.0f} KB" for label, (first, last)
                          in (session.get("body_bytes") or {}).items())
        print(f"\nsession_*: a real mini-swe-agent session ({session['status']}), {session['sessions']} "
              f"session(s) of {session['turns']} consecutive turns from each size, in the trace's "
              f"conversation where they stay nearest it (request bodies: {spans or 'not recorded'}), own "
              "x-ctxproxy-session per target; *_continued: the same turns but each session's first (the "
              "proxy's first sight of a long history: it reads all of it once); *_ttfb: time to the first "
              "byte of the stream")
    cpu = result.get("cpu") or []
    if cpu:
        print("\nServer CPU (utime+stime from /proc, read once the process is quiet), small requests:\n")
        print(table(["server", "concurrency", "requests", "CPU s", "CPU s per 1,000", "÷ bare forwarder"],
                    [[r["target"], str(r["concurrency"]), str(r["requests"]), sig3(r["cpu_s"]),
                      sig3(r["cpu_per_1000"]), sig3(r["ratio"])] for r in cpu]))
    startup = result.get("startup") or {}
    if startup:
        print("\nStart-up: process start to the first answered request, the median of the starts beside it "
              "(ctxproxy and the floor started in turn; ctxproxy each time on an empty data dir: a first "
              "start; restarted: after the long run below, its data dir kept); VmRSS right after it:\n")
        print(table(["server", "cold start s", "each start s", "RSS at start MB"],
                    [[name, sig3(v["cold_start_s"]),
                      " / ".join(sig3(t) for t in v.get("cold_starts_s") or ()), sig3(v["rss_mb"])]
                     for name, v in startup.items()]))
    resumed = (result.get("long_run") or {}).get("resumed")
    if resumed:
        print(f"\nA real {resumed['size']} session continued across the restart above (its "
              "turns before it, then after it; ms to each answer):\n")
        print(table(["first sight", "next turns", "first turn after the restart", "next turn"],
                    [[sig3(resumed["first_sight_ms"]), " / ".join(sig3(t) for t in resumed["turns_ms"]),
                      sig3(resumed["after_restart_ms"]), " / ".join(sig3(t) for t in resumed["next_ms"])]]))
    long_run = result.get("long_run") or {}
    if long_run:
        how = "measured interleaved (each turn to both in turn)" if long_run.get("interleaved") \
            else "one after the other"
        print(f"\nA long run, each in a fresh process: {long_run['sessions']} sessions of "
              f"{long_run['turns']} turns, the history resent every turn, 16 sessions at a time, {how}; "
              "VmRSS before and after:\n")
        servers = [name for name in long_run if isinstance(long_run[name], dict) and name != "resumed"]
        floor_cpu = (long_run.get("bare forwarder") or {}).get("cpu_s")
        print(table(["server", "requests", "errors", "seconds", "CPU s", "÷ bare forwarder",
                     "RSS at start MB", "RSS after MB"],
                    [[name, str(long_run[name]["requests"]), str(long_run[name]["errors"]),
                      sig3(long_run[name]["seconds"]), sig3(long_run[name].get("cpu_s")),
                      sig3(long_run[name]["cpu_s"] / floor_cpu) if floor_cpu and long_run[name].get("cpu_s")
                      else "-",
                      sig3(long_run[name].get("rss_start_mb")), sig3(long_run[name]["rss_mb"])]
                     for name in servers]))
        pauses = (long_run.get("ctxproxy") or {}).get("gc")
        if pauses:
            print("\nctxproxy's garbage-collector pauses in that run (ctxproxy_gc_pause_seconds; the event "
                  "loop waits through each):\n")
            print(table(["generation", "pauses", "total ms", "over 25 ms"],
                        [[generation, f"{row['count']:.0f}", sig3(row["ms"]), f"{row['over_25ms']:.0f}"]
                         for generation, row in sorted(pauses.items())]))
    print_claude_sessions(result.get("claude_sessions"))
    print_claude_sessions(result.get("codex_sessions"))
    print_claude_sessions(result.get("chat_sessions"))


AGENT_SHAPES = {
    "claude": "Claude-style sessions on /v1/messages (bench/claude_sessions.py), shaped as Claude Code sends "
              "them (its key order and tools), the cache marker moving every turn, streamed",
    "codex": "Codex-style sessions on /v1/responses (bench/claude_sessions.py), shaped as Codex sends them "
             "(store false: the whole history in input, streamed)",
    "chat": "Chat-style sessions on /v1/chat/completions (bench/claude_sessions.py), as the traces' own "
            "agents sent them through litellm (the whole history every turn, not streamed)"}


def print_claude_sessions(found: dict[str, Any] | None) -> None:
    if not found:
        return
    how = "measured interleaved (each request to every server in turn)" if found.get("interleaved") \
        else "each server in turn"
    fresh = "each server fresh" + (" and warmed up by one request" if found.get("warmed_up") else "")
    print(f"\n{AGENT_SHAPES[found.get('shape', 'claude')]}: {found['sessions']} real sessions, "
          f"{found['concurrency']} at a time, {fresh}, {how}; {found['requests_per_run']} "
          f"requests, {found['mb_sent']:.0f} MB:\n")
    servers = [name for name in found if isinstance(found[name], dict)]
    floor = found.get("bare forwarder") or {}
    floor_cpu = floor["cpu_s"] / floor["requests"] if floor.get("requests") else None

    def per_request(row: dict[str, Any]) -> float:
        return float(row["cpu_s"]) / row["requests"] * 1000 if row["requests"] else math.nan

    rows = [[name, str(row["requests"]), str(row["errors"]), sig3(row["seconds"]), sig3(per_request(row)),
             sig3(per_request(row) / 1000 / floor_cpu) if floor_cpu else "-", sig3(row["p50_ms"]),
             sig3(row["p99_ms"]), sig3(row["rss_mb"])] for name, row in ((n, found[n]) for n in servers)]
    print(table(["server", "requests", "errors", "seconds", "CPU ms per request", "÷ bare forwarder",
                 "p50 ms", "p99 ms", "RSS after MB"], rows))
