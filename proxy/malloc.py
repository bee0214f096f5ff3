"""Give memory back to the OS after huge requests (glibc only; elsewhere these do nothing).

glibc raises its mmap threshold to the size of the largest buffer freed so far (up to 32 MiB), so after
one 20 MB request every later large buffer comes from the heap and stays there when freed: RSS settles
far above what the process uses. A fixed threshold keeps large buffers in mmap (returned on free), and
`trim()` after huge work returns what the heap keeps free.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("ctxproxy")

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
LARGE_BUFFER = 1024 * 1024

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
    """At start-up: large buffers always mmapped, and the heap trimmed past 4 MiB of free top."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(M_MMAP_THRESHOLD, LARGE_BUFFER)
        libc.mallopt(M_TRIM_THRESHOLD, 4 * LARGE_BUFFER)


def trim() -> None:
    """Return free heap memory to the OS (a few ms; call it off the event loop, after huge work)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
