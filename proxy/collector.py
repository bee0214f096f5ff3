"""Python's cyclic garbage collector in a long-lived server: what start-up left is frozen, and every
collection's pause is timed (issue 14).

A full collection walks every live container and stops the event loop meanwhile, so every client waits.
At start-up ~65k containers are live (modules, the model-window map, the app), all of them for the life of
the process, and a full collection of them alone takes ~50 ms on the 2-core test VM. Under a long run
(20,000 requests, 16 sessions at a time) CPython made 46 full collections, 58-70 ms each (p50). Freezing
what start-up left moves it out of every later collection: the same run's 48-49 full collections took
10-11 ms on average (two runs of bench/overhead.py). The young generation is collected every 10,000 new
containers instead of 700: a request makes hundreds (the history's new messages, the lists a rewrite
builds over it), and 664 young collections took 0.4-0.5 s of a long run's ~24 s. Measured with the
servers interleaved (48 sessions x 200 turns, 2 runs), the CPU is 0.981-0.987 of CPython's thresholds
(five runs one server after the other, before, could not tell: their ratio swung by more than that).
"""

from __future__ import annotations

import gc
import time
from typing import Any

from prometheus_client import Histogram

YOUNG_THRESHOLD = 10_000  # new containers between young collections (CPython's default: 700)


def settle() -> None:
    """Once start-up is done (process-wide: only the server calls it, never a library user). Only the young
    generations are collected first: start-up leaves next to no garbage (10 unreachable objects of ~69k
    measured), and a full collection to find them cost 70-80 ms of the start before the first answer."""
    gc.collect(1)
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)


def start(histogram: Histogram, *, settle_process: bool) -> PauseClock:
    """At an app's start: its pause clock, installed (remove it at shutdown); `settle_process` in the
    server's own process only, never in one that embeds the app."""
    clock = PauseClock(histogram)
    clock.install()
    if settle_process:
        settle()
    return clock


class PauseClock:
    """Times every collection into `histogram` (labelled by generation) while installed."""

    def __init__(self, histogram: Histogram) -> None:
        self.children = [histogram.labels(str(generation)) for generation in range(3)]
        self.started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self.started = time.perf_counter()
        else:
            self.children[info["generation"]].observe(time.perf_counter() - self.started)

    def install(self) -> None:
        gc.callbacks.append(self)

    def remove(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)
