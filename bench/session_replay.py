"""A real agent session resent turn by turn, for the overhead benchmark (issue 14).

A mini-swe-agent conversation from ../shared/traces (read in place, never copied) is resent as its agent
did: each request the whole history so far, ending on a user turn, under one `x-ctxproxy-session`. For
each size, the consecutive turns from the first one past it, in the conversation where the last of them
is shortest: the turns nearest the size (a row named 10 KB is not a row of 300 KB histories, and the
longest trace jumps from 44 to 255 KB in one turn). No trace is longer than ~384 KB, so for the larger
sizes the longest one is continued with the next conversations' turns (longest first, their system
prompts dropped) until the history reaches the largest size asked for.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

import orjson

TRACES = Path(__file__).resolve().parent.parent.parent / "shared" / "traces"
TRACE = TRACES / "miniswe_gemini3pro_swebv_dev.jsonl"
SIZES = {"10KB": 10_000, "100KB": 100_000, "500KB": 500_000, "2MB": 2_000_000}


class Targetish(Protocol):
    name: str
    url: str
    headers: dict[str, str] | None


def load_session(path: Path = TRACE, at_least: int = max(SIZES.values())) -> list[dict[str, Any]]:
    """The longest conversation, continued by the next longest until `at_least` bytes of JSON."""
    lines = path.read_bytes().splitlines()
    conversations = [orjson.loads(line)["messages"] for line in lines if line.strip()]
    conversations.sort(key=lambda m: len(orjson.dumps(m)), reverse=True)
    messages = list(conversations[0])
    size = len(orjson.dumps(messages))
    for more in conversations[1:]:
        if size >= at_least:
            break
        for message in more[1:]:  # no second system prompt
            if message.get("role") == messages[-1].get("role"):
                continue  # keep the turns alternating where two conversations meet
            messages.append(message)
            size += len(orjson.dumps(message)) + 1
    return messages


def turn_ends(messages: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """(end index, bytes) of every prefix that ends on a user turn: a request the agent sent."""
    ends, size = [], 1
    for i, message in enumerate(messages):
        size += len(orjson.dumps(message)) + 1
        if message.get("role") == "user":
            ends.append((i + 1, size))
    return ends


def prefixes(messages: list[dict[str, Any]], size: int, turns: int) -> list[list[dict[str, Any]]]:
    """`turns` consecutive requests of the session, the first one at least `size` bytes of history."""
    ends = [end for end, nbytes in turn_ends(messages) if nbytes >= size][:turns]
    if len(ends) < turns:
        raise ValueError(f"the session has fewer than {turns} turns past {size} bytes")
    return [messages[:end] for end in ends]


def window(sessions: list[list[dict[str, Any]]], size: int, turns: int) -> list[list[dict[str, Any]]]:
    """`turns` consecutive requests from the first past `size` bytes, from the session where the last of
    them is shortest: the turns nearest `size` (the earlier session on a tie)."""
    best: tuple[int, list[int], list[dict[str, Any]]] | None = None
    for messages in sessions:
        past = [(end, nbytes) for end, nbytes in turn_ends(messages) if nbytes >= size][:turns]
        if len(past) == turns and (best is None or past[-1][1] < best[0]):
            best = (past[-1][1], [end for end, _ in past], messages)
    if best is None:
        raise ValueError(f"no session has {turns} turns past {size} bytes")
    _, ends, chosen = best
    return [chosen[:end] for end in ends]


def session_bodies(sizes: dict[str, int], turns: int, body: Callable[[list[dict[str, Any]]], bytes],
                   path: Path = TRACE) -> dict[str, list[bytes]]:
    lines = path.read_bytes().splitlines()
    conversations = sorted((orjson.loads(line)["messages"] for line in lines if line.strip()),
                           key=lambda m: len(orjson.dumps(m)), reverse=True)
    sessions = [*conversations, load_session(path, max(sizes.values()) + 200_000)]
    return {label: [body(p) for p in window(sessions, size, turns)] for label, size in sizes.items()}


def replay(send: Callable[[str, bytes, dict[str, str] | None], float], targets: Iterable[Targetish],
           bodies: dict[str, list[bytes]], sessions: int) -> tuple[dict[str, dict[str, list[float]]],
                                                                    dict[str, dict[str, int]]]:
    """For each size, `sessions` sessions of its turns; each turn goes to every target, in shuffled order,
    each target under its own session id. `send(url, body, headers)` returns milliseconds.
    Returns samples and errors, by scenario and target name: `session_<size>` every turn, and
    `session_<size>_continued` all but each session's first (the proxy's first sight of a long history,
    which reads all of it: what a session that grew turn by turn through the proxy never pays)."""
    targets = list(targets)
    samples: dict[str, dict[str, list[float]]] = {}
    errors: dict[str, dict[str, int]] = {}
    for label, turns in bodies.items():
        scenario = f"session_{label}"
        rng = random.Random(scenario)
        got = samples[scenario] = {t.name: [] for t in targets}
        continued = samples[f"{scenario}_continued"] = {t.name: [] for t in targets}
        failed = errors[scenario] = dict.fromkeys(got, 0)
        failed_later = errors[f"{scenario}_continued"] = dict.fromkeys(got, 0)
        for _ in range(sessions):
            ids = {t.name: f"bench-{label}-{uuid.uuid4().hex[:12]}" for t in targets}
            order = list(targets)
            for turn, body in enumerate(turns):
                rng.shuffle(order)
                for target in order:
                    headers = {**(target.headers or {}), "x-ctxproxy-session": ids[target.name]}
                    try:
                        ms = send(target.url, body, headers)
                    except Exception:  # any failure is counted and reported as an error
                        failed[target.name] += 1
                        failed_later[target.name] += int(turn > 0)
                        continue
                    got[target.name].append(ms)
                    if turn:
                        continued[target.name].append(ms)
    return samples, errors
