"""What a server process costs, read from /proc: CPU seconds, resident memory, time to its first answer."""

from __future__ import annotations

import os
import time

import httpx

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def parse_cpu_seconds(stat: str, ticks: int = TICKS) -> float:
    """utime + stime of a /proc/<pid>/stat line, in seconds (all of the process's threads)."""
    fields = stat[stat.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses
    return (int(fields[11]) + int(fields[12])) / ticks  # fields 14 and 15 of proc(5), counted from 1


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as handle:
        return parse_cpu_seconds(handle.read())


def settled_cpu_seconds(pid: int, quiet: float = 0.3, limit: float = 10.0) -> float:
    """CPU seconds once the process has gone quiet (background work after the answers counted too):
    read until two reads `quiet` seconds apart differ by at most one clock tick."""
    deadline = time.monotonic() + limit
    last = cpu_seconds(pid)
    while time.monotonic() < deadline:
        time.sleep(quiet)
        now = cpu_seconds(pid)
        if now - last <= 1.0 / TICKS:
            return now
        last = now
    return last


def rss_mb(pid: int) -> float | None:
    """VmRSS of /proc/<pid>/status in MB (10^6 bytes)."""
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024 / 1e6
    return None


def first_answer(spawned: float, url: str, body: bytes, headers: dict[str, str],
                 timeout: float = 120.0) -> float:
    """Seconds from `spawned` (perf_counter at process start) to the first 200 answer to POST `url`."""
    deadline = time.perf_counter() + timeout
    with httpx.Client(timeout=30.0, headers=headers) as client:
        while time.perf_counter() < deadline:
            try:
                if client.post(url, content=body).status_code == 200:
                    return time.perf_counter() - spawned
            except httpx.TransportError:
                pass
            time.sleep(0.01)
    raise RuntimeError(f"{url}: no answer within {timeout:.0f}s")
