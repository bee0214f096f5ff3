"""Which messages are environment output, and where the task statement ends.

Text-protocol agents (mini-swe-agent, SWE-agent, smolagents) send command output back as *user*
messages. Those observations are tool results in all but name: layer 1 may summarize them, the window may
mask them, and they are read back by a handle derived from their content (`obs-<12 hex>`), the same in
every request and on every replica. Words a person typed are never treated so.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Sequence
from typing import Any

# Shapes of environment output that text-protocol agents send as user messages.
DEFAULT_PATTERNS = (
    r"\A\s*<returncode>",  # mini-swe-agent
    r"\(Current directory: [^\n]*\)\s*\n?bash-\$\s*\Z",  # SWE-agent
    r"\A\s*(?:Observation|OBSERVATION|Execution logs):",  # smolagents, ReAct loops
)
HANDLE_PREFIX = "obs-"
CHARS_PER_TOKEN = 4
MEMO_ENTRIES = 16384  # remembered classifications and handles (~2 MB each; a 64-bit collision is negligible)


class Observations:
    """Classifies messages of one conversation; `patterns` extend the defaults (policy)."""

    def __init__(self, patterns: Sequence[str] = (), size_tokens: int | None = None) -> None:
        self._patterns = [re.compile(p) for p in (*DEFAULT_PATTERNS, *patterns)]
        # A user message after the task over this many tokens is output, not typing (by characters:
        # ~4 a token, so the test is cheap enough to run on every message of every request).
        self.size_chars = size_tokens * CHARS_PER_TOKEN if size_tokens is not None else None
        self._matched: dict[tuple[int, int], bool] = {}

    def matches(self, text: str) -> bool:
        # Remembered by the text's hash: a resent history's strings are the same objects request after
        # request (wire/resent.py), whose hash Python keeps, so this is a lookup instead of a search.
        key = (len(text), hash(text))
        found = self._matched.get(key)
        if found is None:
            found = any(p.search(text) for p in self._patterns)
            if len(self._matched) >= MEMO_ENTRIES:
                self._matched.clear()
            self._matched[key] = found
        return found

    def is_observation(self, message: dict[str, Any]) -> bool:
        """A user message holding environment output (by its shape, or by its sheer size)."""
        content = message.get("content")
        if message.get("role") != "user" or not isinstance(content, str):
            return False
        if self.size_chars is not None and len(content) > self.size_chars:
            return True
        return self.matches(content)


def handle_for(content: str) -> str:
    """The call id an observation is stored and read back under: stable for the same text."""
    key = (len(content), hash(content))  # (as in matches: a resent observation is not hashed again)
    handle = _handles.get(key)
    if handle is None:
        handle = HANDLE_PREFIX + hashlib.sha256(content.encode("utf-8", "surrogatepass")).hexdigest()[:12]
        if len(_handles) >= MEMO_ENTRIES:
            _handles.clear()
        _handles[key] = handle
    return handle


_handles: dict[tuple[int, int], str] = {}


GREETING_CHARS = 40  # an opening user turn this short, answered in words (no tool, no command), says hello


def task_end(messages: list[dict[str, Any]]) -> int:
    """Index after the system prompt(s), any opening assistant turns (a greeting) and the opening run of
    user messages (a demonstration followed by the real issue): together, the task statement. A short
    opening user turn answered by a greeting ("hi" / "How can I help?", or the placeholder turn an
    Anthropic or Responses client must open with) does not state the task: the user run after it does.

    Asked about six times a request, of lists that open with the same messages: what it read and said
    is remembered by the first message. It reads only the opening, up to where every walk stopped on a
    message's content (not at the list's end), so a list that opens with equal messages, and goes on
    past them, gets the same answer."""
    if not messages:
        return 0
    known = _TASK_ENDS.get(id(messages[0]))
    if known is not None and len(messages) >= len(known[0]) and tuple(messages[:len(known[0])]) == known[0]:
        return known[1]
    end, read = _task_end(messages)
    if read < len(messages):  # (every walk stopped on what a message says: the answer holds for longer lists)
        if len(_TASK_ENDS) >= _TASK_ENDS_KEPT:
            _TASK_ENDS.clear()
        _TASK_ENDS[id(messages[0])] = (tuple(messages[:read + 1]), end)
    return end


_TASK_ENDS: dict[int, tuple[tuple[dict[str, Any], ...], int]] = {}  # by the first message's id
_TASK_ENDS_KEPT = 256  # lists' openings remembered (about one per active session)


def _task_end(messages: list[dict[str, Any]]) -> tuple[int, int]:
    """`task_end`, and the furthest index any of its walks stopped at (`len(messages)` when one ran off
    the end: then the answer depends on the list's length)."""
    index = 0
    while index < len(messages) and messages[index].get("role") in ("system", "developer"):
        index += 1
    opening = index
    while index < len(messages) and messages[index].get("role") == "assistant" \
            and not messages[index].get("tool_calls"):
        index += 1
    if index >= len(messages) or messages[index].get("role") != "user":
        return opening, index  # no task statement to protect (a pure tool loop; index ≤ len(messages))
    run_start = index
    while index < len(messages) and messages[index].get("role") == "user":
        index += 1
    greeting = index
    while greeting < len(messages) and _says_hello(messages[greeting]):
        greeting += 1
    said = sum(len(_text(m.get("content"))) for m in messages[run_start:index])
    if said <= GREETING_CHARS and greeting > index and greeting < len(messages) \
            and messages[greeting].get("role") == "user":
        index = greeting
        while index < len(messages) and messages[index].get("role") == "user":
            index += 1
        return index, index
    return index, greeting


def _says_hello(message: dict[str, Any]) -> bool:
    return message.get("role") == "assistant" and not message.get("tool_calls") \
        and "```" not in _text(message.get("content"))


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content or [] if isinstance(p, dict))


@functools.lru_cache(maxsize=64)
def for_policy(patterns: tuple[str, ...], size_tokens: int) -> Observations:
    """One classifier per policy setting (compiled once)."""
    return Observations(patterns, size_tokens)
