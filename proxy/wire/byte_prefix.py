"""Byte prefixes of two bodies compared without copying them: one memcmp call (wire/resent.py tells a
resent body's shared part by them, at every message boundary it tries)."""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable


def _libc_memcmp() -> Callable[[bytes, bytes, int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        memcmp = ctypes.CDLL(name).memcmp if name else None
    except (OSError, AttributeError):
        return None
    if memcmp is not None:
        memcmp.argtypes, memcmp.restype = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t), ctypes.c_int
    return memcmp


_MEMCMP = _libc_memcmp()


WINDOW = 32  # bytes compared before a memcmp call (a call costs more than slicing them)


def same_before(raw: bytes, mine: bytes, end: int) -> bool:
    """Whether the `WINDOW` bytes before `end` are the same: a quick test that two bodies could share
    everything before `end` (they differ there, mostly, when they do not)."""
    return raw[end - WINDOW:end] == mine[end - WINDOW:end] if end >= WINDOW else True


def same_start(raw: bytes, mine: bytes, size: int) -> bool:
    """raw[:size] == mine[:size] without copying megabytes (a slice is a fresh buffer, page faults and
    all; memoryview comparison goes byte by byte in Python's C code)."""
    if len(raw) < size:
        return False
    if _MEMCMP is not None:
        return _MEMCMP(raw, mine, size) == 0
    return raw.startswith(mine[:size])
