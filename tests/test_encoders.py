"""Tokenizer families: each built once per process, however many requests ask for it first at once."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

import pytest


def _inside(thread: threading.Thread, function: str) -> bool:
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if frame.f_code.co_name == function:
            return True
        frame = frame.f_back
    return False


def test_concurrent_first_requests_of_a_family_wait_for_one_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sixteen requests ask for a family not built yet, all at once: one build, and every one of them gets
    its counter (Claude's tokenizer loads at its first request: each build holds the GIL ~0.2 s)."""
    from proxy import encoders

    builds: list[str] = []
    release = threading.Event()

    def build(name: str) -> Callable[[str], int]:
        builds.append(name)
        assert release.wait(30)
        return len

    monkeypatch.setattr(encoders, "_built_encoder", build)
    monkeypatch.setattr(encoders, "_encoders", {})
    got: list[Callable[[str], int]] = []
    threads = [threading.Thread(target=lambda: got.append(encoders._encoder("family"))) for _ in range(16)]
    for thread in threads:
        thread.start()
    # Every thread is inside `_encoder` (building, or waiting for the build) before the build ends.
    deadline = time.monotonic() + 30
    while not all(_inside(t, "_encoder") for t in threads) and time.monotonic() < deadline:
        release.wait(0.001)
    release.set()
    for thread in threads:
        thread.join(30)
    assert builds == ["family"]
    assert got == [len] * 16
    assert encoders._encoder("family") is len  # (and later asks find it built)

