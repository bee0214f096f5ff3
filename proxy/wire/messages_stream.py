"""Anthropic Messages streaming, one upstream round at a time: relay content blocks as they come, hold
tool_use blocks until the round's end decides, and keep what the next round needs.

The counterpart of the chat-completions event handling in `proxy.round_stream`, over the Messages event
flow (message_start, content blocks as content_block_start / _delta / _stop, message_delta, message_stop,
plus ping and error). Pure logic over SSE event bytes: no HTTP.

The client sees one message: one message_start (round 0's), content blocks numbered 0..n-1 across
rounds, no internal tool_use, and the one message_delta + message_stop the caller emits at the end
(`final_events`). Every tool_use block is held (the proxy only knows at the round's end whether the
round continues); the client's are re-emitted by `MessagesRound.release`, renumbered, after the
round's relayed blocks. Blocks of the provider's own tools (server_tool_use, web_search_tool_result...)
are the model's content and are relayed like text.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import orjson

from proxy.sse import event_data

END = b"\n\n"
HELD_TYPES = frozenset({"tool_use"})  # blocks the proxy holds back: the client's and its own tool calls


@dataclass
class _Slot:
    """One content block of the round, keyed by its upstream index."""

    block: dict[str, Any]  # the content_block_start's block, deltas applied
    index: int | None  # the client's index when relayed; None when held
    events: list[dict[str, Any]] = field(default_factory=list)  # held: the block's events, as parsed
    json: list[str] = field(default_factory=list)  # input_json_delta pieces
    # text_delta / thinking_delta pieces not yet joined into the block (joining them as they come would
    # copy the text so far on every delta: an answer streams hundreds)
    pieces: dict[str, list[str]] = field(default_factory=dict)
    stopped: bool = False


class MessagesRound:
    """One upstream round of a streamed Anthropic Messages answer, seen event by event."""

    def __init__(self, round_no: int, blocks_sent: int, is_internal: Callable[[str], bool]) -> None:
        self.round_no = round_no
        self.blocks_sent = blocks_sent  # blocks the client got in earlier rounds
        self.is_internal = is_internal
        self.usage: dict[str, Any] | None = None  # message_start's usage, updated by message_delta's
        self.stop_reason: str | None = None
        self.message_start: dict[str, Any] | None = None  # the parsed message_start payload
        self.delta_template: dict[str, Any] | None = None  # the last message_delta payload (for final_events)
        self.done = False  # message_stop seen
        self.error: Any = None  # the `error` object of an upstream error event (relayed; the stream ends)
        # The first event that could not be read (relayed untouched), or a held tool_use whose input
        # is not a JSON object.
        self.malformed: str | None = None
        self._slots: dict[int, _Slot] = {}  # by upstream index, in the order their blocks started
        self._relayed = 0

    @property
    def blocks_sent_after(self) -> int:
        """`blocks_sent` plus the blocks relayed to the client in this round (held ones not counted)."""
        return self.blocks_sent + self._relayed

    # -- what the round produced -------------------------------------------------------------------

    @property
    def blocks(self) -> list[dict[str, Any]]:
        """The round's content blocks as the model produced them, in order (tool_use input parsed)."""
        out = []
        for slot in self._slots.values():
            if not slot.stopped:
                _assemble(slot)
            elif slot.pieces:  # (deltas after the block's stop)
                _join_pieces(slot)
            out.append(slot.block)
        return out

    @property
    def text(self) -> str:
        return "".join(block["text"] for block in self.blocks
                       if block.get("type") == "text" and isinstance(block.get("text"), str))

    @property
    def calls(self) -> list[dict[str, Any]]:
        """The tool_use blocks as chat-shaped calls, in order; `arguments` is the model's JSON text."""
        calls = []
        for slot in self._slots.values():
            block = slot.block
            if block.get("type") != "tool_use":
                continue
            if not slot.stopped:
                _assemble(slot)
            raw = "".join(slot.json)
            arguments = raw if raw.strip() else orjson.dumps(block.get("input") or {}).decode()
            calls.append({"id": block.get("id"), "type": "function",
                          "function": {"name": block.get("name") or "", "arguments": arguments}})
        return calls

    @property
    def internal_calls(self) -> list[dict[str, Any]]:
        return [call for call in self.calls if self.is_internal(call["function"]["name"])]

    @property
    def client_calls(self) -> list[dict[str, Any]]:
        return [call for call in self.calls if not self.is_internal(call["function"]["name"])]

    # -- events ------------------------------------------------------------------------------------

    def feed(self, event: bytes) -> bytes | None:
        """What one upstream event (without its blank line) becomes for the client: itself, a renumbered
        copy, or None (held or dropped)."""
        return self.feed_fields(event, event_name(event), event_data(event))

    def feed_fields(self, event: bytes, name: str | None, data: bytes | None) -> bytes | None:
        """`feed`, the event's name and data already read from it (`event_name`, `event_data`)."""
        if data is None:
            return event + END  # comments, keep-alives
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return self._bad(event, f"data is not JSON: {data[:120]!r}")
        if not isinstance(obj, dict):
            return self._bad(event, f"a JSON {type(obj).__name__}, not an object: {data[:120]!r}")
        kind = obj.get("type")
        if kind == "content_block_delta" and name != "error":  # most of a stream: straight to its block
            index = obj.get("index")
            if type(index) is int and (slot := self._slots.get(index)) is not None:  # (True is not 1)
                return self._block_event(event, obj, kind, slot)
        return self._feed_object(event, name, data, obj)

    def _feed_object(self, event: bytes, name: str | None, data: bytes, obj: dict[str, Any]) -> bytes | None:
        kind = obj["type"] if isinstance(obj.get("type"), str) else name
        if kind == "error" or name == "error":
            if self.error is None:
                self.error = obj.get("error") or obj
            return event + END
        if kind == "message_start":
            return self._message_start(event, obj)
        if kind == "content_block_start":
            return self._block_start(event, obj)
        if kind in ("content_block_delta", "content_block_stop"):
            index = obj.get("index")
            if not is_int(index) or index not in self._slots:
                return self._bad(event, f"{kind} for a block that did not start: {data[:120]!r}")
            return self._block_event(event, obj, kind, self._slots[index])
        if kind == "message_delta":
            self._message_delta(obj)
            return None
        if kind == "message_stop":
            self.done = True
            return None
        # ping, and event types this proxy does not know: untouched, unless they name one of our blocks
        index = obj.get("index")
        if kind != "ping" and is_int(index) and index in self._slots:
            return self._block_event(event, obj, kind or "", self._slots[index])
        return event + END

    def _bad(self, event: bytes, problem: str) -> bytes:
        self.malformed = self.malformed or problem
        return event + END

    def _message_start(self, event: bytes, obj: dict[str, Any]) -> bytes | None:
        self.message_start = obj
        message = obj.get("message")
        if not isinstance(message, dict):
            return self._bad(event, "message_start without a message object")
        if isinstance(message.get("usage"), dict):
            self.usage = copy.deepcopy(message["usage"])
        return event + END if self.round_no == 0 else None  # one message_start per client stream

    def _block_start(self, event: bytes, obj: dict[str, Any]) -> bytes | None:
        index, block = obj.get("index"), obj.get("content_block")
        if not is_int(index) or not isinstance(block, dict) or not isinstance(block.get("type"), str):
            return self._bad(event, f"content_block_start without an index and a typed block: {obj!r:.120}")
        if index in self._slots:
            return self._bad(event, f"content_block_start for index {index} twice")
        slot = _Slot(block=copy.deepcopy(block), index=None)
        self._slots[index] = slot
        if block["type"] in HELD_TYPES:
            slot.events.append(obj)
            return None
        slot.index = self.blocks_sent_after
        self._relayed += 1
        return _renumbered(event, obj, slot.index)

    def _block_event(self, event: bytes, obj: dict[str, Any], kind: str, slot: _Slot) -> bytes | None:
        if kind == "content_block_delta":
            problem = _apply(slot, obj.get("delta"))
            if problem:
                self.malformed = self.malformed or problem
        elif kind == "content_block_stop" and not slot.stopped:
            slot.stopped = True
            problem = _assemble(slot)
            if problem:
                self.malformed = self.malformed or problem
        if slot.index is None:
            slot.events.append(obj)
            return None
        return _renumbered(event, obj, slot.index)

    def _message_delta(self, obj: dict[str, Any]) -> None:
        self.delta_template = obj
        delta = obj.get("delta")
        if isinstance(delta, dict) and isinstance(delta.get("stop_reason"), str):
            self.stop_reason = delta["stop_reason"]
        usage = obj.get("usage")
        if isinstance(usage, dict):  # cumulative counts: they replace; a null leaves message_start's
            self.usage = (self.usage or {}) | {k: copy.deepcopy(v) for k, v in usage.items() if v is not None}

    # -- after the round ---------------------------------------------------------------------------

    def release(self, client_call_ids: list[str], blocks_sent: int) -> list[bytes]:
        """The held tool_use blocks whose id is in `client_call_ids`, in the round's order, re-emitted
        as their content_block_start / _delta / _stop events numbered from `blocks_sent`."""
        wanted = set(client_call_ids)
        out: list[bytes] = []
        index = blocks_sent
        for slot in self._slots.values():
            if slot.index is not None or slot.block.get("id") not in wanted:
                continue
            events = list(slot.events)
            if not slot.stopped:
                events.append({"type": "content_block_stop"})
            out.extend(sse({**obj, "index": index}) for obj in events)
            index += 1
        return out


def is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def event_name(event: bytes) -> str | None:
    for line in event.splitlines():
        if line.startswith(b"event:"):
            return line[6:].strip().decode("utf-8", "replace")
    return None


def sse(obj: dict[str, Any]) -> bytes:
    """One named event: `event: <type>` then the payload as one `data:` line."""
    return b"event: " + str(obj.get("type")).encode() + b"\ndata: " + orjson.dumps(obj) + END


def _renumbered(event: bytes, obj: dict[str, Any], index: int) -> bytes:
    """The event for the client under `index`: its own bytes when the index is already that."""
    if obj.get("index") == index:
        return event + END
    obj["index"] = index
    return sse(obj)


def _apply(slot: _Slot, delta: Any) -> str | None:
    """Fold one content_block_delta's delta into the slot's block; a problem is named, not raised."""
    if not isinstance(delta, dict):
        return f"a content_block_delta whose delta is {type(delta).__name__}, not an object"
    block, kind = slot.block, delta.get("type")
    if kind == "text_delta" and isinstance(delta.get("text"), str):
        slot.pieces.setdefault("text", []).append(delta["text"])
    elif kind == "thinking_delta" and isinstance(delta.get("thinking"), str):
        slot.pieces.setdefault("thinking", []).append(delta["thinking"])
    elif kind == "signature_delta" and isinstance(delta.get("signature"), str):
        block["signature"] = delta["signature"]  # the whole signature, not a piece
    elif kind == "input_json_delta" and isinstance(delta.get("partial_json"), str):
        slot.json.append(delta["partial_json"])
    elif kind == "citations_delta" and "citation" in delta:
        block["citations"] = [*(block.get("citations") or []), delta["citation"]]
    return None  # other delta types are relayed (or held) without being understood


def _join_pieces(slot: _Slot) -> None:
    """The text and thinking deltas so far onto the block (after what its start or an earlier join
    put there; a start's text that is not a string counts as none)."""
    for key, pieces in slot.pieces.items():
        before = slot.block.get(key)
        slot.block[key] = (before if isinstance(before, str) else "") + "".join(pieces)
    slot.pieces.clear()


def _assemble(slot: _Slot) -> str | None:
    """Set the block's text and thinking from their deltas, and its `input` from its input_json_delta
    pieces (a tool_use without any keeps the start's input, or {}); name a problem when the pieces are
    not a JSON object."""
    block = slot.block
    if slot.pieces:
        _join_pieces(slot)
    raw = "".join(slot.json)
    if not raw.strip():
        if block.get("type") == "tool_use" and not isinstance(block.get("input"), dict):
            block["input"] = {}
        return None
    try:
        parsed = orjson.loads(raw)
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict):
        block["input"] = parsed
        return None
    if not isinstance(block.get("input"), dict):
        block["input"] = {}
    return f"{block.get('type')} {block.get('id')} input is not a JSON object: {raw[:120]!r}"


def final_events(stop_reason: str | None, usage: dict[str, Any] | None,
                 delta_template: dict[str, Any] | None) -> list[bytes]:
    """The end of the client's stream: one message_delta (the last round's, as `delta_template`, with
    `stop_reason` and the whole answer's `usage`) then message_stop."""
    obj = copy.deepcopy(delta_template) if isinstance(delta_template, dict) else {}
    obj["type"] = "message_delta"
    delta: dict[str, Any] = obj["delta"] if isinstance(obj.get("delta"), dict) else {}
    if delta.get("stop_reason") != stop_reason and stop_reason != "stop_sequence":
        delta["stop_sequence"] = None  # the template's stop sequence belongs to its own stop reason
    delta["stop_reason"] = stop_reason
    delta.setdefault("stop_sequence", None)
    obj["delta"] = delta
    if usage is not None:
        obj["usage"] = usage
    elif not isinstance(obj.get("usage"), dict):
        obj["usage"] = {"output_tokens": 0}  # the SDKs read usage.output_tokens
    return [sse(obj), sse({"type": "message_stop"})]


def error_event(message: str, error_type: str = "api_error") -> bytes:
    """The last event of a failed stream: an SDK raises on `event: error`."""
    payload = {"type": "error", "error": {"type": error_type, "message": message}}
    return b"event: error\ndata: " + orjson.dumps(payload) + END


def add_usage(total: dict[str, Any] | None, usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """Sum token counts over rounds (into `total`, which is returned): integers add up, nested objects
    are summed alike, a field `total` lacks (or has as null) is taken from `usage`."""
    if not isinstance(usage, dict) or not usage:
        return total
    if total is None:
        return copy.deepcopy(usage)
    for key, value in usage.items():
        have = total.get(key)
        if is_int(value) and is_int(have):
            total[key] = have + value
        elif isinstance(value, dict) and isinstance(have, dict):
            add_usage(have, value)
        elif have is None and value is not None:
            total[key] = copy.deepcopy(value)
    return total


def is_whole(round: MessagesRound) -> bool:
    """Whether the round got to its end: message_stop, or a message_delta with a stop_reason."""
    return round.done or round.stop_reason is not None
