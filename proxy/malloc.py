"""Give memory back to the OS after huge requests (glibc only; elsewhere these do nothing).

glibc raises its mmap threshold to the size of the largest buffer freed so far (up to 32 MiB), so after
one 20 MB request every later large buffer comes from the heap and stays there when freed: RSS settles
far above what the process uses. A fixed threshold keeps large buffers in mmap (returned on free), and
`trim()` after huge work returns what the heap keeps free.

The threshold is 4 MiB, not lower: a long agent history's body (1-4 MB) is joined, parsed and written
upstream again at every turn, and a buffer mapped anew has each of its pages faulted in (~1.2 ms for
2 MB on the 2-core test VM, against ~0.06 ms to reuse heap memory). At 1 MiB, a 2 MB history resent with
every layer off cost 6.6-7.9 ms of CPU a request against the floor's 5.6-5.9; at 4 MiB 5.5-5.6.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("ctxproxy")

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MIB = 1024 * 1024
MMAP_FROM = 4 * MIB  # a buffer this large or larger is mapped, and unmapped when freed
TRIM_FROM = 8 * MIB  # free memory at the heap's top past this goes back to the OS

_libc: ctypes.CDLL | None = None


def _glibc() -> ctypes.CDLL | None:
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        try:
            libc = ctypes.CDLL(name) if name else None
            _libc = libc if libc is not None and hasattr(libc, "malloc_trim") else None
        except OSError:
            _libc = None
    return _libc


def tune() -> None:
    """At start-up: large buffers always mmapped, and the heap trimmed past TRIM_FROM of free top."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_FROM)
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_FROM)


def trim() -> None:
    """Return free heap memory to the OS (a few ms; call it off the event loop, after huge work)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
