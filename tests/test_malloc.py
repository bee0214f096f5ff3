"""proxy/malloc.py, in a fresh interpreter each (malloc's settings are process-wide): a buffer of an
agent's request size is reused rather than mapped anew each time, and a huge one goes back to the OS."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from proxy import malloc

pytestmark = pytest.mark.skipif(malloc._glibc() is None or not Path("/proc/self/status").exists(),
                                reason="glibc's malloc and /proc only")

MIB = 1024 * 1024

PROBE = """
import resource, sys
from proxy import malloc

def anon_kb():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])

malloc.tune()
size, rounds = int(sys.argv[1]), int(sys.argv[2])
held = b"x" * size  # (the first: fresh pages whatever the settings)
del held
faults, anon = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, anon_kb()
for _ in range(rounds):
    held = b"x" * size  # (written whole: every page is touched)
    del held
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults, anon_kb() - anon)
"""


def _probe(size: int, rounds: int) -> tuple[int, int]:
    """(minor page faults, change of anonymous memory in KB) over `rounds` buffers of `size` bytes made
    and freed one after another, after one made and freed first."""
    done = subprocess.run([sys.executable, "-c", PROBE, str(size), str(rounds)], capture_output=True,
                          text=True, check=True, timeout=60)
    faults, anon_kb = done.stdout.split()
    return int(faults), int(anon_kb)


def test_a_request_sized_buffer_is_reused_not_mapped_anew():
    # A 2 MiB body is joined, parsed and written again at every turn of a 2 MB history: mapped anew
    # each time, each of its 512 pages faulted in cost ~1.2 ms a buffer here (bench: ~1.5 ms of CPU
    # a request). Reused, twenty of them fault in fewer pages than one.
    faults, _ = _probe(2 * MIB, 20)
    assert faults < (2 * MIB) // 4096


def test_a_huge_buffer_goes_back_to_the_os():
    # glibc's own threshold rises to the largest buffer freed: the second 20 MiB buffer would come from
    # the heap and stay there (RSS 20 MiB up for good).
    _, anon_kb = _probe(20 * MIB, 2)
    assert anon_kb < 4 * 1024
