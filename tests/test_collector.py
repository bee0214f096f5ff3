"""The garbage collector set for a long-lived server (proxy/collector.py) and its pauses in /metrics."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap

import httpx
from prometheus_client import CollectorRegistry, Histogram

from proxy import collector


def test_settle_freezes_what_start_up_left():
    # In a child process: freezing is process-wide, and the test process must keep CPython's defaults.
    script = textwrap.dedent("""
        import gc, json
        from proxy import collector
        held = [{"n": i} for i in range(1000)]  # live objects from "start-up"
        before = gc.get_freeze_count()
        defaults = gc.get_threshold()
        collector.settle()
        print(json.dumps([before, gc.get_freeze_count(), gc.collect(), defaults, gc.get_threshold()]))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    before, frozen, collected, defaults, threshold = json.loads(out)
    assert before == 0 and frozen >= 1000
    assert collected == 0  # what was frozen is never scanned, so nothing of it is found
    # the young generation collected less often; the older ones as often as CPython has them
    assert threshold == [collector.YOUNG_THRESHOLD, *defaults[1:]] and threshold[0] > defaults[0]


def test_the_pause_clock_times_each_collection_by_generation_while_installed():
    histogram = Histogram("pauses", "test", ["generation"], registry=CollectorRegistry())
    clock = collector.PauseClock(histogram)
    clock.install()
    try:
        gc.collect(2)
        gc.collect(0)
    finally:
        clock.remove()
    gc.collect(2)  # after removal: not counted
    samples = {(s.name, s.labels["generation"]): s.value for m in histogram.collect() for s in m.samples}
    assert {g: samples[("pauses_count", g)] for g in "012"} == {"0": 1.0, "1": 0.0, "2": 1.0}
    assert samples[("pauses_sum", "2")] > 0 and samples[("pauses_sum", "1")] == 0
    assert clock not in gc.callbacks
    clock.remove()  # twice is harmless


def test_the_server_exports_its_pauses_and_leaves_no_callback_behind(make_proxy, fake_upstream):
    threshold, frozen = gc.get_threshold(), gc.get_freeze_count()
    running = make_proxy()
    assert (gc.get_threshold(), gc.get_freeze_count()) == (threshold, frozen)  # embedded: left alone
    clocks = [c for c in gc.callbacks if isinstance(c, collector.PauseClock)]
    assert clocks, "the app installs its pause clock at start-up"
    gc.collect()
    text = httpx.get(running.url + "/metrics").text
    full = [line for line in text.splitlines()
            if line.startswith('ctxproxy_gc_pause_seconds_count{generation="2"}')]
    assert full and float(full[0].rsplit(" ", 1)[1]) >= 1
    running.server.__exit__()
    assert not any(c in gc.callbacks for c in clocks)  # shut down: uninstalled
