"""OpenAI Responses requests: decode into the neutral conversation, apply decisions back.

Decoding: `instructions` become the neutral system prompt (never changed). Input items map to neutral
messages: a message item to a message (developer and system roles to system); each run of the model's
own items — `reasoning`, assistant `message`, `function_call`, `custom_tool_call` and other `*_call`
items — to one neutral assistant message (text joined, calls as chat tool calls by `call_id`), so a call
is never separated from the reasoning before it; each `*_output` item to a neutral tool message. A string
`input` is one user message. What precedes the latest `compaction` item is the provider's (kept as sent).

Encoding: the pipeline's output beside its aligned originals; items the client sent go back as sent (a
replaced output gets only its `output` swapped); blocks the pipeline injected become developer message
items where it put them; the proxy's calls put back (splices) become `function_call` items and their
results `function_call_output` items. Unknown item types and fields pass untouched.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.wire import Decoded, Message
from proxy.wire.decoded_prefix import DecodedPrefix, decoded_prefix, earlier_prefix
from proxy.wire.neutral_cache import NEUTRAL, NeutralCache
from proxy.wire.resent import MIN_BYTES
from proxy.wire.responses_check import validate_responses_request
from proxy.wire.splice import Spans, spliced_body

INSTRUCTIONS = -1
USER_SIDE_MESSAGE_ROLES = ("user", "system", "developer")


@dataclass(frozen=True, slots=True)
class Origin:
    k: int  # the first item's index (INSTRUCTIONS for the instructions)
    items: tuple[int, ...]
    registered: tuple[dict[str, Any], ...] = ()  # items an internal round added (not in the body)


def is_model_item(item: dict[str, Any]) -> bool:
    """An item the model produced: reasoning, its messages, its calls (function, custom, server-side)."""
    kind = item.get("type") or "message"
    if kind == "message":
        return item.get("role") == "assistant"
    return kind == "reasoning" or (kind.endswith("_call") and not kind.endswith("_output"))


def text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))


def neutral_call(item: dict[str, Any]) -> dict[str, Any] | None:
    kind = item.get("type")
    if kind == "function_call":
        name, arguments = item.get("name"), item.get("arguments") or "{}"
    elif kind == "custom_tool_call":
        name, arguments = item.get("name"), orjson.dumps({"input": item.get("input", "")}).decode()
    elif kind == "local_shell_call":
        name, arguments = "local_shell", orjson.dumps(item.get("action") or {}).decode()
    else:
        return None
    return {"id": item.get("call_id"), "type": "function", "function": {"name": name, "arguments": arguments}}


def native_call(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function") or {}
    return {"type": "function_call", "call_id": call.get("id"), "name": function.get("name"),
            "arguments": function.get("arguments") or "{}"}


def native_tool(spec: dict[str, Any]) -> dict[str, Any]:
    function = spec.get("function") or {}
    return {"type": "function", "name": function.get("name"), "description": function.get("description", ""),
            "parameters": function.get("parameters") or {"type": "object"}}


def developer(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": text}]}


def decode(raw: bytes) -> Decoded:
    body, spans = validate_responses_request(raw)
    encoder = Encoder(body, raw, spans)
    metadata: dict[str, Any] = body["metadata"] if isinstance(body.get("metadata"), dict) else {}
    if "session_id" not in metadata and isinstance(body.get("prompt_cache_key"), str):
        metadata = {**metadata, "session_id": body["prompt_cache_key"]}  # Codex: one per conversation
    chained = bool(body.get("previous_response_id") or body.get("conversation"))
    return Decoded(body=body, model=str(body.get("model") or ""), stream=body.get("stream") is True,
                   messages=encoder.neutral, tools=body.get("tools"),
                   session_body={"metadata": metadata, "messages": encoder.neutral,
                                 "user": body.get("user") or body.get("safety_identifier")},
                   encode=encoder.encode, register=encoder.register,
                   params={k: v for k, v in body.items() if k not in ("input", "instructions")},
                   native_state=chained, raw=raw)


class Encoder:
    def __init__(self, body: dict[str, Any], raw: bytes, spans: Spans | None = None) -> None:
        self.body, self.raw, self.spans = body, raw, spans  # (spans: where body["input"] lies in raw)
        source = body.get("input")
        self.items: list[dict[str, Any]] = [{"role": "user", "content": source}] if isinstance(source, str) \
            else list(source or [])
        # A resent history whose earlier body was decoded from the same start: only the new part is walked.
        earlier = earlier_prefix(spans)
        found = next((k for k in range(len(self.items) - 1, earlier[1] - 1 if earlier else -1, -1)
                      if self.items[k].get("type") == "compaction"), -1)
        if found >= 0:
            earlier = None  # (a compaction among the new items: decoding starts there)
        self.start = max(found, 0) if earlier is None else earlier[0].start  # before: the provider's
        self.origins: dict[int, Origin] = {}
        self.keep: list[Message] = []
        self.neutral = self._decode(earlier)

    def _note(self, neutral: Message, origin: Origin) -> Message:
        self.origins[id(neutral)] = origin
        self.keep.append(neutral)
        return neutral

    def _decode(self, earlier: tuple[DecodedPrefix, int] | None) -> list[Message]:
        out: list[Message] = []
        cache = NEUTRAL if len(self.raw) >= MIN_BYTES else None  # (a smaller body is parsed anew)
        instructions = self.body.get("instructions")
        if isinstance(instructions, str) and instructions:
            made = cache.get(instructions, INSTRUCTIONS) if cache is not None else None
            system = made[0][0] if made else {"role": "system", "content": instructions}
            out.append(self._note(system, Origin(INSTRUCTIONS, ())))
            if cache is not None and not made:
                cache.put(instructions, INSTRUCTIONS, [(system, None)])
        natives_from = len(out)  # (after the instructions')
        first, ends, resume, origins = self.start, [0] * self.start, [self.start] * self.start, list[Origin]()
        if earlier is not None:  # the items a resent history shares with the earlier body: taken whole
            first, neutral, origins, ends, taken_resume = earlier[0].taken(earlier[1])
            resume = taken_resume or []
            self.origins.update(zip(map(id, neutral), origins, strict=True))
            self.keep.extend(neutral)
            out.extend(neutral)
        made_from = len(out)
        run: list[int] = []
        for k in range(first, len(self.items)):
            item = self.items[k]
            if is_model_item(item):  # (a run of the model's items: one message, closed by the next item)
                run.append(k)
                ends.append(ends[-1] if ends else 0)
                resume.append(resume[-1] if resume else first)
                continue
            if run:
                out.append(self._decoded(run, cache))
                run = []
            out.append(self._decoded([k], cache))
            ends.append(len(out) - natives_from)
            resume.append(k + 1)
        if run:
            out.append(self._decoded(run, cache))
        if self.spans is not None:  # for the next body that resends these items
            kept = [*origins, *(self.origins[id(m)] for m in out[made_from:])]
            prefix = decoded_prefix(self.start, out[natives_from:], kept, ends, resume, earlier,
                                    self.items[first:])
            self.spans.derive(prefix, prefix.held_bytes)
        return out

    def _decoded(self, indexes: list[int], cache: NeutralCache | None) -> Message:
        """The neutral message of these items: the same object as last time they were these objects here
        (a resent history, wire/neutral_cache.py)."""
        items = tuple(self.items[k] for k in indexes)
        made = cache.get(items[0], indexes[0]) if cache is not None else None
        if made and len(made[0][1][1]) == len(items) and all(map(operator.is_, made[0][1][1], items)):
            message, (origin, _) = made[0]
            return self._note(message, origin)
        message = self._assistant(indexes) if is_model_item(items[0]) else self._other(indexes[0], items[0])
        if cache is not None:
            cache.put(items[0], indexes[0], [(message, (self.origins[id(message)], items))])
        return message

    def _assistant(self, indexes: list[int]) -> Message:
        items = [self.items[k] for k in indexes]
        calls = [c for c in (neutral_call(i) for i in items) if c is not None]
        parts = [{"type": "reasoning", "thinking": text_of(i.get("summary"))} for i in items
                 if i.get("type") == "reasoning"]  # counted, never rewritten
        text = "\n".join(text_of(i.get("content")) for i in items
                         if (i.get("type") or "message") == "message")
        content: Any = text or None
        if parts:
            content = [*([{"type": "text", "text": text}] if text else []), *parts]
        message: Message = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        return self._note(message, Origin(indexes[0], tuple(indexes)))

    def _other(self, k: int, item: dict[str, Any]) -> Message:
        kind = item.get("type") or "message"
        origin = Origin(k, (k,))
        if kind == "compaction":  # the provider's summary of what precedes: protected like the system
            return self._note({"role": "system", "content": "(compacted earlier conversation)"}, origin)
        if kind.endswith("_output") and "call_id" in item:
            neutral = {"role": "tool", "tool_call_id": str(item["call_id"]), "content": output_content(item)}
            return self._note(neutral, origin)
        if kind == "message":
            role = "user" if item.get("role") == "user" else "system"
            return self._note({"role": role, "content": message_content(item.get("content"))}, origin)
        # item_reference, approvals...: counted, kept as sent
        return self._note({"role": "user", "content": [as_text(item)]}, origin)

    @functools.cached_property
    def call_owner(self) -> dict[str, Origin]:
        """call_id -> the origin of the neutral message holding the call: found when an internal round
        needs it."""
        return {str(call["id"]): self.origins[id(message)] for message in self.neutral
                for call in message.get("tool_calls") or ()}

    def register(self, neutral: Message, native: Any) -> None:
        """An internal round's answer: its output items go upstream in the next round."""
        items = tuple(i for i in native if isinstance(i, dict))
        self._note(neutral, Origin(len(self.items) + len(self.keep), (), items))

    def encode(self, forwarded: list[Message], original: list[Message], tools: list[Any] | None) -> bytes:
        if self.raw and forwarded is self.neutral and tools is self.body.get("tools"):
            return self.raw
        items: list[dict[str, Any]] = list(self.items[:self.start])
        for sent, client in zip(forwarded, original, strict=True):
            origin = self.origins.get(id(client))
            if origin is not None and origin.k == INSTRUCTIONS:
                continue
            if origin is None:
                items.extend(self._made(sent, client))
            elif origin.registered:
                items.extend(origin.registered)
            else:
                natives = [self.items[k] for k in origin.items]
                if sent is not client and isinstance(sent.get("content"), str) \
                        and sent.get("content") != client.get("content"):
                    key = "output" if client.get("role") == "tool" else "content"
                    natives = [{**natives[0], key: sent["content"]}]
                items.extend(natives)
        out = dict(self.body)
        out["input"] = drop_dangling_reasoning(items)
        if tools is not None and tools is not self.body.get("tools"):
            client_tools = list(self.body.get("tools") or [])
            out["tools"] = [*client_tools, *(native_tool(t) for t in tools[len(client_tools):])]
        if isinstance(self.body.get("input"), list):  # the client's unchanged items copied as sent
            return spliced_body(out, "input", out["input"], self.spans, self.body["input"])
        return orjson.dumps(out)

    def _made(self, sent: Message, client: Message) -> list[dict[str, Any]]:
        """Items for a neutral message the pipeline made: an injected block, a turn with our calls put
        back (the client's items, then ours: the same bytes on every request), their results."""
        role = client.get("role")
        if role == "tool":
            return [{"type": "function_call_output", "call_id": sent.get("tool_call_id"),
                     "output": str(sent.get("content") or "")}]
        if role != "assistant":
            return [developer(str(sent.get("content") or ""))]
        calls = sent.get("tool_calls") or []
        owner = next((self.call_owner[c.get("id")] for c in calls if c.get("id") in self.call_owner), None)
        if owner is None:
            return [native_call(c) for c in calls]
        natives = list(owner.registered) or [self.items[k] for k in owner.items]
        known = {i.get("call_id") for i in natives}
        return [*natives, *(native_call(c) for c in calls if c.get("id") not in known)]


def as_text(value: Any) -> dict[str, Any]:
    return {"type": "text", "text": orjson.dumps(value).decode()}


def output_content(item: dict[str, Any]) -> Any:
    """A call's output: a string when it is text (layer 1 may summarize it), else parts to count."""
    output = item.get("output")
    if isinstance(output, str):
        return output
    if isinstance(output, list) and all(isinstance(p, dict) and isinstance(p.get("text"), str)
                                        for p in output):
        return text_of(output)
    return [as_text(output)]


def message_content(content: Any) -> Any:
    if isinstance(content, str):
        return content
    parts = [p for p in content or [] if isinstance(p, dict)]
    if len(parts) == 1 and isinstance(parts[0].get("text"), str):
        return parts[0]["text"]
    return [{"type": "image"} if "image" in str(p.get("type"))
            else {"type": "text", "text": p.get("text", "")} for p in parts]


def drop_dangling_reasoning(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The API rejects a reasoning item without the item it led to; one can be left so only by taking the
    proxy's own calls out of a turn. Such a reasoning item goes (it reasoned about our call)."""
    out: list[dict[str, Any]] = []
    for item in reversed(items):  # backwards: a reasoning item is judged by the item kept after it
        if item.get("type") == "reasoning" and not (out and is_model_item(out[-1])):
            continue
        out.append(item)
    return out[::-1]
