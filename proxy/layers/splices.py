"""Splices: the proxy's own tool calls in an assistant turn that also called the client's tools.

With parallel tool calls the model can call `read_tool_result` (ours) and `read_file` (the client's) in
one turn. The proxy answers its calls, the client gets the turn with only its own calls, and the
splice remembers what was taken out: the internal calls with their positions among the turn's
tool_calls, and their result messages. On every later request whose history holds that turn (the
same client calls), the internal calls go back in at their positions and their results right after
the turn, before the client's results: the model sees exactly what it produced, every call keeps its
answer, and the bytes are the same on every request (prompt caching).

Pure functions over plain data; a splice that does not fit the history (edited, removed) is skipped.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

if TYPE_CHECKING:
    from proxy.session_state import SessionState
    from proxy.state import StateStore

VERSION = 1
MAX_SPLICES = 256  # per session; the oldest go first (their turns then reach the model without our calls)

C = TypeVar("C")
Fingerprint = tuple[Any, Any, Any]  # (id, function name, arguments) of one client call
Key = tuple[Any, ...]  # the client call ids of the turn, in order


@dataclass(frozen=True)
class Splice:
    client: tuple[Fingerprint, ...]  # the turn's client calls as the client got them
    internal: tuple[tuple[int, dict[str, Any]], ...]  # (position in the model's tool_calls, call)
    results: tuple[dict[str, Any], ...]  # the tool messages answering the internal calls, in order

    @property
    def key(self) -> Key:
        return tuple(f[0] for f in self.client)

    def to_dict(self) -> dict[str, Any]:
        return {"client": [list(f) for f in self.client], "internal": [[p, c] for p, c in self.internal],
                "results": list(self.results)}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Splice:
        return Splice(tuple(tuple(f) for f in data["client"]),
                      tuple((int(p), c) for p, c in data["internal"]), tuple(data["results"]))


def fingerprint(call: Any) -> Fingerprint | None:
    if not isinstance(call, dict):
        return None
    function = call.get("function")
    if not isinstance(function, dict):
        return None
    return call.get("id"), function.get("name"), function.get("arguments")


def make(tool_calls: list[dict[str, Any]], internal_positions: list[int],
         results: list[dict[str, Any]]) -> Splice | None:
    """The splice of one assistant turn: `tool_calls` as the model produced them, the positions of the
    ones the proxy answered and their result messages. None if the client calls cannot be told apart."""
    taken = set(internal_positions)
    if not taken or not taken <= set(range(len(tool_calls))) or len(results) != len(taken):
        return None
    client = [fingerprint(c) for i, c in enumerate(tool_calls) if i not in taken]
    if not client or any(f is None or not isinstance(f[0], str) or not f[0] for f in client):
        return None
    return Splice(tuple(client), tuple((i, tool_calls[i]) for i in sorted(taken)),  # type: ignore[arg-type]
                  tuple(results))


def restored(conversation: C, state: SessionState) -> C:
    """A conversation (any dataclass with `messages`) with the session's splices put back, or itself.

    The results put back are never summarized by layer 1 (kept, sticky): the model asked for exactly
    that text, often because a summary was all it had.
    """
    messages, applied = _restore(conversation.messages, state.splices)  # type: ignore[attr-defined]
    if not applied:
        return conversation
    for splice in applied:
        for result in splice.results:
            content = result.get("content")
            if isinstance(content, str):  # always: the proxy's own tool output
                state.kept.add((str(result.get("tool_call_id") or ""), content))
    return dataclasses.replace(conversation, messages=messages)  # type: ignore[type-var]


def restore(messages: list[dict[str, Any]], splices: dict[Key, Splice]) -> list[dict[str, Any]]:
    """The history with every applicable splice put back; the same list object when none applies.

    Never mutates `messages` or its messages.
    """
    return _restore(messages, splices)[0]


def _restore(messages: list[dict[str, Any]],
             splices: dict[Key, Splice]) -> tuple[list[dict[str, Any]], list[Splice]]:
    if not splices:
        return messages, []
    out: list[dict[str, Any]] | None = None
    applied: list[Splice] = []
    for index, message in enumerate(messages):
        splice = _match(message, splices)
        if splice is None:
            if out is not None:
                out.append(message)
            continue
        if out is None:
            out = list(messages[:index])
        calls = list(message["tool_calls"])
        for position, call in splice.internal:  # ascending: each lands where the model put it
            calls.insert(position, call)
        out.append({**message, "tool_calls": calls})
        out.extend(dict(result) for result in splice.results)
        applied.append(splice)
    return (messages, []) if out is None else (out, applied)


def _match(message: Any, splices: dict[Key, Splice]) -> Splice | None:
    if not isinstance(message, dict) or message.get("role") != "assistant":
        return None
    calls = message.get("tool_calls")
    if not isinstance(calls, list) or not calls:
        return None
    prints = [fingerprint(c) for c in calls]
    if any(p is None for p in prints):
        return None
    try:
        splice = splices.get(tuple(p[0] for p in prints))  # type: ignore[index]
    except TypeError:  # an unhashable id
        return None
    if splice is None or tuple(prints) != splice.client:
        return None  # not this turn, or the client edited its calls
    ids = {p[0] for p in prints}  # type: ignore[index]
    if any(c.get("id") in ids for _, c in splice.internal):
        return None  # our calls are already there
    if splice.internal[-1][0] > len(calls) + len(splice.internal) - 1:
        return None
    return splice


def remember(store: StateStore, tenant: str, session_id: str, splice: Splice) -> None:
    """Keep a splice for this session (sticky) and persist the session's splices."""
    with store.session(tenant, session_id) as state:
        splices = state.splices
        splices.pop(splice.key, None)
        splices[splice.key] = splice
        while len(splices) > MAX_SPLICES:
            splices.pop(next(iter(splices)))
        store.grow(state, len(orjson.dumps(splice.to_dict())))
        store.save_memory(state, "splices", dumps(splices))


def dumps(splices: dict[Key, Splice]) -> str:
    return orjson.dumps({"version": VERSION, "splices": [s.to_dict() for s in splices.values()]}).decode()


def loads(data: str | bytes) -> OrderedDict[Key, Splice]:
    """Splices saved by `dumps`; anything unreadable is dropped (history then goes without them)."""
    out: OrderedDict[Key, Splice] = OrderedDict()
    try:
        saved = orjson.loads(data)
        for item in saved.get("splices") or ():
            splice = Splice.from_dict(item)
            out[splice.key] = splice
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError):
        pass
    return out
