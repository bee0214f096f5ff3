"""OpenAI Responses streaming, one upstream round at a time: relay output items as they come, hold
function calls until the round's end decides, and keep what the next round needs.

The counterpart of `proxy.wire.messages_stream` over the Responses event flow (response.created /
in_progress, output items as response.output_item.added, their part / delta / done events and
response.output_item.done, then response.completed, incomplete or failed, plus `error`). Pure logic
over SSE event bytes: no HTTP.

The client sees one response: round 0's response.created and response.in_progress, output items
numbered 0..n-1 across rounds (`output_index`), one `sequence_number` counter over the whole stream
(each round continues from `sequence`), no internal function_call, and the one response.completed
the caller emits at the end (`final_events`). Every function_call and custom_tool_call item is held
(the proxy only knows at the round's end whether the round continues); the client's are re-emitted
by `ResponsesRound.release`. Other items (reasoning, message, the provider's own tool calls such as
web_search_call) are the model's content and are relayed as they come.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.sse import DONE, event_data
from proxy.wire.messages_stream import add_usage, event_name, is_int, sse

__all__ = ["ResponsesRound", "add_usage", "error_event", "final_events", "is_whole", "sse"]

END = b"\n\n"
HELD_TYPES = frozenset({"function_call", "custom_tool_call"})  # the client's and the proxy's tool calls
OPENING = frozenset({"response.created", "response.in_progress", "response.queued"})  # round 0's relayed
ENDING = frozenset({"response.completed", "response.incomplete"})  # held: the caller ends the stream
FAILED = "response.failed"
# Events that add a part to an item's list: (the list, the event's index field).
PARTS = {"response.content_part.added": ("content", "content_index"),
         "response.reasoning_summary_part.added": ("summary", "summary_index")}
# Events that grow (delta) or set (done) a text field: (the item's list or None for the item itself,
# the event's index field, the field to write, the event's field to read).
TEXTS = {
    "response.output_text.delta": ("content", "content_index", "text", "delta"),
    "response.output_text.done": ("content", "content_index", "text", "text"),
    "response.refusal.delta": ("content", "content_index", "refusal", "delta"),
    "response.refusal.done": ("content", "content_index", "refusal", "refusal"),
    "response.reasoning_text.delta": ("content", "content_index", "text", "delta"),
    "response.reasoning_text.done": ("content", "content_index", "text", "text"),
    "response.reasoning_summary_text.delta": ("summary", "summary_index", "text", "delta"),
    "response.reasoning_summary_text.done": ("summary", "summary_index", "text", "text"),
    "response.function_call_arguments.delta": (None, None, "arguments", "delta"),
    "response.function_call_arguments.done": (None, None, "arguments", "arguments"),
    "response.custom_tool_call_input.delta": (None, None, "input", "delta"),
    "response.custom_tool_call_input.done": (None, None, "input", "input"),
}


@dataclass
class _Slot:
    """One output item of the round, keyed by its upstream output_index."""

    item: dict[str, Any]  # the output_item.added item, events applied; output_item.done's item once done
    index: int | None  # the client's output_index when relayed; None when held
    events: list[dict[str, Any]] = field(default_factory=list)  # held: the item's events, as parsed
    done: bool = False
    # delta pieces not yet joined onto their field, by (id of the dict, field): joining each as it came
    # copied the text so far on every delta (a long answer streams thousands)
    pieces: dict[tuple[int, str], tuple[dict[str, Any], list[str]]] = field(default_factory=dict)

    def joined(self) -> dict[str, Any]:
        """The item, every delta so far on it."""
        for (_, name), (target, pieces) in self.pieces.items():
            target[name] = _str(target.get(name)) + "".join(pieces)
        self.pieces.clear()
        return self.item


class ResponsesRound:
    """One upstream round of a streamed Responses answer, seen event by event.

    `sequence` is the client's next sequence_number (continue from the previous round's `sequence`);
    `response_id` (for rounds after the first: round 0's id) replaces the upstream's id in the response
    objects this round relays or keeps, so the client sees one response.
    """

    def __init__(self, round_no: int, items_sent: int, is_internal: Callable[[str], bool], *,
                 sequence: int = 0, response_id: str | None = None) -> None:
        self.round_no = round_no
        self.items_sent = items_sent  # output items the client got in earlier rounds
        self.is_internal = is_internal
        self.sequence = sequence  # the next sequence_number the client gets; advanced by every event out
        self.response_id = response_id
        self.usage: dict[str, Any] | None = None  # the round's response.usage (completed / incomplete)
        self.response: dict[str, Any] | None = None  # the last response object seen
        # the ending event's response object as the upstream sent it (None: not seen, or its id rewritten)
        self.final: dict[str, Any] | None = None
        self.done = False  # response.completed or response.incomplete seen
        self.error: Any = None  # an `error` event's error, or a failed response's (relayed; the stream ends)
        # The first event that could not be read (relayed untouched), or a function call whose
        # arguments are not a JSON object.
        self.malformed: str | None = None
        self._slots: dict[int, _Slot] = {}  # by upstream output_index, in the order items were added
        self._relayed = 0
        self._released: list[dict[str, Any]] = []

    @property
    def items_sent_after(self) -> int:
        """`items_sent` plus the items relayed to the client in this round (held ones not counted)."""
        return self.items_sent + self._relayed

    # -- what the round produced -------------------------------------------------------------------

    @property
    def items(self) -> list[dict[str, Any]]:
        """The round's output items as the model produced them, in order (held calls included)."""
        return [slot.joined() for slot in self._slots.values()]

    @property
    def sent_items(self) -> list[dict[str, Any]]:
        """The items the client got from this round, in its order: relayed, then released."""
        return [slot.joined() for slot in self._slots.values() if slot.index is not None] + self._released

    @property
    def text(self) -> str:
        return "".join(part["text"] for item in self.items if item.get("type") == "message"
                       for part in _list(item.get("content"))
                       if isinstance(part, dict) and part.get("type") == "output_text"
                       and isinstance(part.get("text"), str))

    @property
    def calls(self) -> list[dict[str, Any]]:
        """function_call items as chat-shaped calls, in order; custom_tool_call items as chat's
        `{"type": "custom", "custom": {name, input}}` calls (never internal, so released)."""
        calls: list[dict[str, Any]] = []
        for item in self.items:
            if item.get("type") == "function_call":
                calls.append({"id": item.get("call_id"), "type": "function",
                              "function": {"name": _str(item.get("name")),
                                           "arguments": _str(item.get("arguments"))}})
            elif item.get("type") == "custom_tool_call":
                calls.append({"id": item.get("call_id"), "type": "custom",
                              "custom": {"name": _str(item.get("name")), "input": _str(item.get("input"))}})
        return calls

    # -- events ------------------------------------------------------------------------------------

    def feed(self, event: bytes) -> bytes | None:
        """What one upstream event (without its blank line) becomes for the client: itself, a
        renumbered copy, or None (held or dropped)."""
        data = event_data(event)
        if data is None:
            return event + END  # comments, keep-alives
        if data.strip() == DONE:
            return None  # not a Responses event; the stream's end is the caller's
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return self._bad(event, f"data is not JSON: {data[:120]!r}")
        if not isinstance(obj, dict):
            return self._bad(event, f"a JSON {type(obj).__name__}, not an object: {data[:120]!r}")
        name = event_name(event)
        kind = obj["type"] if isinstance(obj.get("type"), str) else name or ""
        if kind == "error" or name == "error":
            if self.error is None:
                self.error = obj.get("error") or obj
            return self._out(event, obj)
        if kind in OPENING or kind in ENDING or kind == FAILED:
            return self._lifecycle(event, obj, kind)
        if kind == "response.output_item.added":
            return self._added(event, obj)
        if "output_index" not in obj:
            return self._out(event, obj)  # events this proxy does not know, about no item: relayed
        index = obj["output_index"]
        if not is_int(index) or index not in self._slots:
            return self._bad(event, f"{kind} for an item that was not added: {data[:120]!r}")
        slot = self._slots[index]
        problem = _apply(slot, kind, obj)
        if problem:
            self.malformed = self.malformed or problem
        if slot.index is None:
            slot.events.append(obj)
            return None
        return self._out(event, obj, slot.index)

    def _bad(self, event: bytes, problem: str) -> bytes:
        self.malformed = self.malformed or problem
        return event + END

    def _out(self, event: bytes | None, obj: dict[str, Any], index: int | None = None) -> bytes:
        """The event for the client under the next sequence_number (and `index`): its own bytes when
        nothing changes."""
        changed = event is None
        if index is not None and obj.get("output_index") != index:
            obj["output_index"], changed = index, True
        if obj.get("sequence_number") != self.sequence or isinstance(obj.get("sequence_number"), bool):
            obj["sequence_number"], changed = self.sequence, True
        self.sequence += 1
        return sse(obj) if changed or event is None else event + END

    def _lifecycle(self, event: bytes, obj: dict[str, Any], kind: str) -> bytes | None:
        response = obj.get("response")
        if not isinstance(response, dict):
            return self._bad(event, f"{kind} without a response object")
        untouched: bytes | None = event
        if self.response_id and response.get("id") != self.response_id:
            response["id"], untouched = self.response_id, None  # re-serialized under the client's id
        self.response = response
        if isinstance(response.get("usage"), dict):
            self.usage = copy.deepcopy(response["usage"])
        if kind in ENDING:
            self.done = True
            self.final = response if untouched is not None else None
            return None
        if kind == FAILED:
            self.error = response.get("error") or {"message": "upstream response failed", "code": None}
            output = _list(response.get("output"))
            response["output"] = [item for item in output if not self._internal(item)]
            return self._out(None, obj)
        if self.round_no:
            return None  # one response.created / in_progress per client stream
        return self._out(untouched, obj)

    def _internal(self, item: Any) -> bool:
        return isinstance(item, dict) and item.get("type") == "function_call" \
            and self.is_internal(_str(item.get("name")))

    def _added(self, event: bytes, obj: dict[str, Any]) -> bytes | None:
        index, item = obj.get("output_index"), obj.get("item")
        if not is_int(index) or not isinstance(item, dict) or not isinstance(item.get("type"), str):
            return self._bad(event, f"output_item.added without an output_index and a typed item: "
                                    f"{obj!r:.120}")
        if index in self._slots:
            return self._bad(event, f"output_item.added for output_index {index} twice")
        slot = _Slot(item=copy.deepcopy(item), index=None)
        self._slots[index] = slot
        if item["type"] in HELD_TYPES:
            slot.events.append(obj)
            return None
        slot.index = self.items_sent_after
        self._relayed += 1
        return self._out(event, obj, slot.index)

    # -- after the round ---------------------------------------------------------------------------

    def release(self, client_call_ids: list[str], items_sent: int) -> list[bytes]:
        """The held call items whose call_id is in `client_call_ids`, in the round's order, re-emitted
        (added, argument deltas, done) at output_index `items_sent`, `items_sent` + 1..., under the
        next sequence numbers."""
        wanted = set(client_call_ids)
        out: list[bytes] = []
        index = items_sent
        for slot in self._slots.values():
            if slot.index is not None or slot.item.get("call_id") not in wanted:
                continue
            events = list(slot.events)
            if not slot.done:
                events.append({"type": "response.output_item.done", "item": slot.joined()})
            out.extend(self._out(None, {**obj, "output_index": index}) for obj in events)
            self._released.append(slot.joined())
            index += 1
        return out


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _apply(slot: _Slot, kind: str, obj: dict[str, Any]) -> str | None:
    """Fold one item event into the slot's item; a problem is named, not raised."""
    item = slot.item
    if kind == "response.output_item.done":
        if isinstance(obj.get("item"), dict):
            slot.pieces.clear()  # (the deltas were of the item it replaces: nothing to join)
            slot.item = copy.deepcopy(obj["item"])
        slot.done = True
        return _check(slot.joined())
    if kind in PARTS:
        key, at = PARTS[kind]
        parts, part, where = item.setdefault(key, []), obj.get("part"), obj.get(at)
        if isinstance(parts, list) and isinstance(part, dict):
            if is_int(where) and 0 <= where < len(parts):
                parts[where] = copy.deepcopy(part)
            else:
                parts.append(copy.deepcopy(part))
    elif kind in TEXTS:
        listed, at_field, name, source = TEXTS[kind]
        value = obj.get(source)
        target: Any = item
        if listed is not None:
            parts, where = item.get(listed), obj.get(str(at_field))
            target = parts[where] if isinstance(parts, list) and is_int(where) and 0 <= where < len(parts) \
                else None
        if isinstance(target, dict) and isinstance(value, str):
            if source != "delta":  # the whole field: what the deltas made is replaced
                slot.pieces.pop((id(target), name), None)
                target[name] = value
            elif (entry := slot.pieces.get((id(target), name))) is not None:
                entry[1].append(value)
            else:
                slot.pieces[(id(target), name)] = (target, [value])
    return None  # other events are relayed (or held) without being understood


def _check(item: dict[str, Any]) -> str | None:
    """A function call whose arguments are not a JSON object is named (the framer records it)."""
    if item.get("type") != "function_call":
        return None
    raw = _str(item.get("arguments"))
    try:
        parsed = orjson.loads(raw) if raw.strip() else {}
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict):
        return None
    return f"function_call {item.get('call_id')} arguments are not a JSON object: {raw[:120]!r}"


def final_events(response_template: dict[str, Any] | None, output_items: list[dict[str, Any]],
                 usage: dict[str, Any] | None, next_sequence: int, *,
                 is_internal: Callable[[str], bool] | None = None) -> list[bytes]:
    """The end of the client's stream: one response.completed (response.incomplete when the template,
    the last round's response, is incomplete) carrying `output_items` (function calls to an internal
    tool left out when `is_internal` is given) and the whole answer's `usage`."""
    response = copy.deepcopy(response_template) if isinstance(response_template, dict) else {}
    kind = "response.incomplete" if response.get("status") == "incomplete" else "response.completed"
    if kind == "response.completed":
        response["status"] = "completed"
    response["output"] = [copy.deepcopy(item) for item in output_items if not (
        is_internal and item.get("type") == "function_call" and is_internal(_str(item.get("name"))))]
    if usage is not None:
        response["usage"] = usage
    return [sse({"type": kind, "sequence_number": next_sequence, "response": response})]


def error_event(message: str, code: str, kind: str = "upstream_error", sequence: int | None = None) -> bytes:
    """The last event of a failed stream. The openai SDKs raise APIError on a payload with an `error`
    object (the shape the API itself sends); `code`, `message` and `param` on top also make it a
    well-formed ResponseErrorEvent for clients that read the documented shape."""
    payload: dict[str, Any] = {"type": "error", "code": code, "message": message, "param": None}
    if sequence is not None:
        payload["sequence_number"] = sequence
    payload["error"] = {"type": kind, "code": code, "message": message, "param": None}
    return sse(payload)


def is_whole(round: ResponsesRound) -> bool:
    """Whether the round got to its end: response.completed or response.incomplete."""
    return round.done
