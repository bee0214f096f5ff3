"""Huge texts are counted and summarized in a worker process, with the same results as inline."""

from __future__ import annotations

import os

import pytest

from proxy import encoders, heavy
from proxy.encoders import count_text
from proxy.summarize import summarize
from proxy.tokens import TokenCounter


def pid_of(text: str) -> int:
    return os.getpid()


@pytest.fixture
def enabled():
    heavy.enable()
    yield
    heavy.shutdown()


def test_only_huge_texts_leave_the_process(enabled):
    assert heavy.call(pid_of, "small") == os.getpid()
    assert heavy.call(pid_of, "x" * heavy.HUGE_CHARS) != os.getpid()


def test_without_enable_everything_runs_inline():
    assert heavy.call(pid_of, "x" * heavy.HUGE_CHARS) == os.getpid()


def test_worker_results_equal_inline_results():
    text = "\n".join(f"2026-11-22 ERROR worker-{i} failed: ValueError at src/mod_{i % 9}.py:{i}"
                     for i in range(30_000))
    assert len(text) >= heavy.HUGE_CHARS
    message = {"role": "tool", "tool_call_id": "c1", "content": text}
    inline = (count_text(text, "o200k_base"), summarize(text), TokenCounter().message(message, "gpt-4o"))
    heavy.enable()
    try:
        in_worker = (heavy.call(count_text, text, "o200k_base"), heavy.call(summarize, text),
                     TokenCounter().message(message, "gpt-4o"))
    finally:
        heavy.shutdown()
    assert in_worker == inline


def test_the_worker_runs_its_setup_first(tmp_path):
    """The server's worker keeps its tokenizer's ranks where the server does (proxy/tokenizer_cache.py)."""
    heavy.enable(encoders.use_cache_dir, tmp_path)
    try:
        assert heavy.call(count_text, "x" * heavy.HUGE_CHARS, "o200k_base") > 0
    finally:
        heavy.shutdown()
    assert [p.name.split("-")[1] for p in tmp_path.iterdir()] == ["o200k_base"]
