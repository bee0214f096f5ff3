"""Anthropic Messages requests: decode into the neutral conversation, apply decisions back.

Decoding (`decode`): the `system` prompt becomes one neutral system message; each native message one or
more neutral ones — a user message's `tool_result` blocks each a neutral tool message, its other blocks
one neutral user message; an assistant message one neutral assistant message (text joined, `tool_use`
blocks as chat tool calls; thinking and server-tool blocks stay native only). Every neutral message
remembers the native message and blocks it came from.

Encoding (`Encoder.encode`): walk the pipeline's output beside its aligned originals. A neutral message
that came from native blocks puts those blocks back as the client sent them (a replaced tool result gets
only its `content` swapped); neutral messages the pipeline made become blocks (internal calls and their
results, injected memory blocks). A native message whose blocks all come back unchanged is the client's
own dict (so its bytes, thinking signatures and cache_control breakpoints are kept). Blocks injected
before the conversation go into `system` after the client's own (pinned knowledge: slow-changing); the
others become `<system-reminder>` text blocks in the user turn where the pipeline put them. When
eviction removes a block that carried a cache_control breakpoint, one breakpoint is re-anchored on the
last block before the gap (never more than 4 in all).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.wire import Decoded, Message
from proxy.wire.decoded_prefix import DecodedPrefix, decoded_prefix, earlier_prefix
from proxy.wire.messages_blocks import (
    UNCACHEABLE,
    block_text,
    compaction_at,
    count_breakpoints,
    native_call,
    native_tool,
    neutral_call,
    neutral_part,
    reminder,
    tool_content,
)
from proxy.wire.messages_check import validate_messages_request
from proxy.wire.messages_rules import problems
from proxy.wire.neutral_cache import NEUTRAL, NeutralCache
from proxy.wire.resent import MIN_BYTES
from proxy.wire.splice import Spans, spliced_body

log = logging.getLogger("ctxproxy")

MAX_BREAKPOINTS = 4
SYSTEM = -1  # the `k` of the system prompt's neutral message


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a neutral message lives: native message `native` (number `k` in order), these blocks
    (None: the message's whole string content)."""

    k: int
    native: dict[str, Any]
    blocks: tuple[int, ...] | None


def decode(raw: bytes) -> Decoded:
    body, spans = validate_messages_request(raw)
    encoder = Encoder(body, raw, spans)
    management = body.get("context_management")
    return Decoded(body=body, model=str(body.get("model") or ""), stream=body.get("stream") is True,
                   messages=encoder.neutral, tools=body.get("tools"),
                   session_body={"metadata": body.get("metadata"), "messages": encoder.neutral},
                   encode=encoder.encode, register=encoder.register,
                   params={k: v for k, v in body.items() if k not in ("messages", "system")},
                   native_context=isinstance(management, dict) and bool(management.get("edits")), raw=raw,
                   take_over_context=encoder.take_over_context)


class Encoder:
    def __init__(self, body: dict[str, Any], raw: bytes = b"", spans: Spans | None = None) -> None:
        self.body, self.raw, self.spans = body, raw, spans  # (spans: where body["messages"] lie in raw)
        messages = body["messages"]
        # A resent history whose earlier body was decoded from the same start: only the new part is walked.
        earlier = earlier_prefix(spans)
        found = compaction_at(messages, earlier[1] if earlier is not None else 0)
        if found >= 0:
            earlier = None  # (a compaction among the new messages: decoding starts there)
        # what precedes `start` is the provider's to manage (compacted)
        self.start = max(found, 0) if earlier is None else earlier[0].start
        self.origins: dict[int, Origin] = {}
        self.keep: list[Message] = []  # neutral messages whose ids are in `origins` stay alive
        self.neutral: list[Message] = self._decode(earlier)
        self.extra = 0  # natives registered by internal rounds

    # ------------------------------------------------------------------------------------------ decode

    def _note(self, neutral: Message, origin: Origin) -> Message:
        self.origins[id(neutral)] = origin
        self.keep.append(neutral)
        return neutral

    def _decode(self, earlier: tuple[DecodedPrefix, int] | None) -> list[Message]:
        out: list[Message] = []
        cache = NEUTRAL if len(self.raw) >= MIN_BYTES else None  # (a smaller body is parsed anew)
        system = self.body.get("system")
        if system:
            out.extend(self._decoded(SYSTEM, system, cache))
        natives_from = len(out)  # (after the system prompt's)
        first, ends, origins = self.start, [0] * self.start, list[Origin]()  # (ends: see DecodedPrefix)
        if earlier is not None:  # the messages a resent history shares with the earlier body: taken whole
            first, neutral, origins, ends, _ = earlier[0].taken(earlier[1])
            self.origins.update(zip(map(id, neutral), origins, strict=True))
            self.keep.extend(neutral)
            out.extend(neutral)
        made_from = len(out)
        messages = self.body["messages"]
        for k in range(first, len(messages)):
            out.extend(self._decoded(k, messages[k], cache) if k != self.start or not self.start
                       else self.decode_message(k, messages[k]))  # (a compaction: decoded afresh)
            ends.append(len(out) - natives_from)
        if self.spans is not None:  # for the next body that resends these messages
            made = [*origins, *(self.origins[id(m)] for m in out[made_from:])]
            prefix = decoded_prefix(self.start, out[natives_from:], made, ends, None, earlier,
                                    messages[first:])
            self.spans.derive(prefix, prefix.held_bytes)
        return out

    def _decoded(self, k: int, native: Any, cache: NeutralCache | None) -> list[Message]:
        """What `native` decodes to: the same neutral objects as last time it was this object here."""
        made = cache.get(native, k) if cache is not None else None
        if made is None:
            if k == SYSTEM:
                text = native if isinstance(native, str) else block_text(native)
                neutral = [self._note({"role": "system", "content": text}, Origin(SYSTEM, {}, None))]
            else:
                neutral = self.decode_message(k, native)
            if cache is not None:
                cache.put(native, k, [(n, self.origins[id(n)]) for n in neutral])
            return neutral
        for message, origin in made:
            self._note(message, origin)
        return [message for message, _ in made]

    def take_over_context(self) -> None:
        """The proxy manages context: the request's `context_management` does not go upstream."""
        self.body = {k: v for k, v in self.body.items() if k != "context_management"}
        self.raw = b""

    def decode_message(self, k: int, native: dict[str, Any]) -> list[Message]:
        role, content = native["role"], native["content"]
        if isinstance(content, str):
            return [self._note({"role": role, "content": content}, Origin(k, native, None))]
        if role == "assistant" and k == self.start and self.start:
            # The provider's compaction summary stands for everything before it: like the system
            # prompt, never evicted (the rest of the turn is an assistant message like any other).
            kept = [i for i, b in enumerate(content) if b.get("type") == "compaction"]
            rest = [i for i in range(len(content)) if i not in kept]
            summary = "\n".join(str(content[i].get("content") or "") for i in kept)
            head = self._note({"role": "system", "content": summary}, Origin(k, native, tuple(kept)))
            return [head, *self._assistant(k, native, rest)]
        if role == "assistant":
            return self._assistant(k, native, list(range(len(content))))
        out: list[Message] = []
        run: list[int] = []

        def flush() -> None:
            if not run:
                return
            blocks = [content[i] for i in run]
            single = len(blocks) == 1 and blocks[0].get("type") == "text"
            value: Any = blocks[0].get("text", "") if single else [neutral_part(b) for b in blocks]
            out.append(self._note({"role": role, "content": value}, Origin(k, native, tuple(run))))
            run.clear()

        for index, block in enumerate(content):
            if block.get("type") == "tool_result":
                flush()
                out.append(self._note({"role": "tool", "tool_call_id": str(block.get("tool_use_id")),
                                       "content": tool_content(block.get("content"))},
                                      Origin(k, native, (index,))))
            else:
                run.append(index)
        flush()
        return out

    def _assistant(self, k: int, native: dict[str, Any], indexes: list[int]) -> list[Message]:
        content = [native["content"][i] for i in indexes]
        texts = [b for b in content if b.get("type") == "text"]
        calls = [b for b in content if b.get("type") == "tool_use"]
        # Thinking counts in a tool loop, and server tools' calls and results always: kept as parts
        # the token counter reads (never rewritten; headlines read text parts only).
        other = [neutral_part(b) for b in content if b.get("type") not in ("text", "tool_use")]
        message: Message = {"role": "assistant", "content": block_text(texts) or None}
        if other:
            message["content"] = [*([{"type": "text", "text": message["content"]}]
                                    if message["content"] else []), *other]
        if calls:
            message["tool_calls"] = [neutral_call(b) for b in calls]
        return [self._note(message, Origin(k, native, tuple(indexes)))]

    @functools.cached_property
    def call_owner(self) -> dict[str, tuple[int, dict[str, Any]]]:
        """tool_use id -> (k, the native message holding it): found when an internal round needs it."""
        messages = self.body["messages"]
        return {str(block.get("id")): (k, messages[k]) for k in range(self.start, len(messages))
                if messages[k]["role"] == "assistant" and isinstance(messages[k]["content"], list)
                for block in messages[k]["content"] if block.get("type") == "tool_use"}

    def register(self, neutral: Message, native: Any) -> None:
        """A message an internal round added (the model's answer): its native form goes upstream."""
        self.extra += 1
        self._note(neutral, Origin(len(self.body["messages"]) + self.extra, native, None
                                   if isinstance(native.get("content"), str)
                                   else tuple(range(len(native["content"])))))

    # ------------------------------------------------------------------------------------------ encode

    def encode(self, forwarded: list[Message], original: list[Message], tools: list[Any] | None) -> bytes:
        if self.raw and forwarded is self.neutral and tools is self.body.get("tools"):
            return self.raw  # unchanged: byte for byte
        system_extra: list[dict[str, Any]] = []
        turns: list[tuple[str, list[dict[str, Any]], dict[str, Any] | None]] = []  # role, blocks, native
        dropped: list[dict[str, Any]] = []  # cache_control values of blocks that left the prompt
        anchor: tuple[int, int] | None = None  # (turn, block) where a dropped breakpoint goes
        last_k = self.start - 1
        seen_conversation = False
        injected: set[int] = set()  # the blocks made from the pipeline's injected messages
        for sent, client in zip(forwarded, original, strict=True):
            origin = self.origins.get(id(client))
            if origin is not None and origin.k == SYSTEM:
                continue
            if origin is None and client.get("role") == "system":
                if not seen_conversation:
                    system_extra.append({"type": "text", "text": str(client.get("content") or "")})
                else:
                    block = reminder(str(client.get("content") or ""))
                    injected.add(id(block))
                    self._add(turns, "user", [block], None)
                continue
            seen_conversation = seen_conversation or client.get("role") != "system"
            if origin is not None and origin.k > last_k + 1 and origin.k < len(self.body["messages"]):
                gone = self._breakpoints_between(last_k + 1, origin.k)
                if gone and anchor is None and turns:
                    dropped.extend(gone)
                    anchor = (len(turns) - 1, len(turns[-1][1]) - 1)
            if origin is not None:
                last_k = max(last_k, origin.k)
            role, blocks, native = self._blocks(sent, client, origin)
            self._add(turns, role, blocks, native)
        prefill_last(turns, injected)
        out = dict(self.body)
        if system_extra:
            system = self.body.get("system")
            base = [{"type": "text", "text": system}] if isinstance(system, str) and system else \
                list(system or [])
            out["system"] = [*base, *system_extra]
        messages = [*self.body["messages"][:self.start],
                    *(self._message(role, blocks, native) for role, blocks, native in turns)]
        if dropped and anchor is not None:
            self._reanchor(messages, out, (anchor[0] + self.start, anchor[1]), dropped[0])
        out["messages"] = messages
        if tools is not None and tools is not self.body.get("tools"):
            client_tools = list(self.body.get("tools") or [])
            out["tools"] = [*client_tools, *(native_tool(t) for t in tools[len(client_tools):])]
        broken = problems(out)
        if broken and not self.extra and not problems(self.body):
            # A rewrite the provider would reject is our bug: the client's request goes instead.
            log.error("Messages rewrite broke the request (%s); forwarding it unchanged", "; ".join(broken))
            return self.raw or orjson.dumps(self.body)  # (the app sees the raw bytes: a fallback)
        return spliced_body(out, "messages", messages, self.spans, self.body["messages"])  # (kept: as sent)

    def _blocks(self, sent: Message, client: Message,
                origin: Origin | None) -> tuple[str, list[dict[str, Any]], dict[str, Any] | None]:
        role = client.get("role")
        if origin is None:  # made by the proxy: internal calls put back, their results
            if role == "assistant":
                return "assistant", self._restored_assistant(sent), None
            if role == "tool":
                return "user", [{"type": "tool_result", "tool_use_id": sent.get("tool_call_id"),
                                 "content": str(sent.get("content") or "")}], None
            return "user", [{"type": "text", "text": str(sent.get("content") or "")}], None
        native = origin.native
        if origin.blocks is None:
            if sent is client or sent.get("content") == client.get("content"):
                return native["role"], [{"type": "text", "text": native["content"]}], native
            return native["role"], [{"type": "text", "text": str(sent.get("content") or "")}], None
        blocks = [native["content"][i] for i in origin.blocks]
        if sent is not client and sent.get("content") != client.get("content") and isinstance(
                sent.get("content"), str):
            if role == "tool":
                blocks = [{**blocks[0], "content": sent["content"]}]
            else:  # an observation sent as user text, replaced (its one text block)
                blocks = [{**blocks[0], "text": sent["content"]}]
            return native["role"], blocks, None
        return native["role"], blocks, native

    def _restored_assistant(self, sent: Message) -> list[dict[str, Any]]:
        """An assistant turn with the proxy's calls put back (splices): the client's native blocks,
        with the tool_use run in the order of the neutral calls."""
        calls = sent.get("tool_calls") or []
        owner = next((self.call_owner[c.get("id")] for c in calls if c.get("id") in self.call_owner), None)
        if owner is None:
            text = sent.get("content")
            return [*([{"type": "text", "text": text}] if isinstance(text, str) and text else []),
                    *(native_call(c) for c in calls)]
        native_blocks = owner[1]["content"]
        by_id = {b.get("id"): b for b in native_blocks if b.get("type") == "tool_use"}
        uses = [by_id.get(c.get("id")) or native_call(c) for c in calls]
        out = [b for b in native_blocks if b.get("type") != "tool_use"]
        first = next((i for i, b in enumerate(native_blocks) if b.get("type") == "tool_use"), len(out))
        return [*out[:first], *uses, *out[first:]]

    @staticmethod
    def _add(turns: list[tuple[str, list[dict[str, Any]], dict[str, Any] | None]], role: str,
             blocks: list[dict[str, Any]], native: dict[str, Any] | None) -> None:
        """Consecutive neutral messages of one role are one native turn (a user turn's tool results
        and text, an injected block beside them)."""
        if turns and turns[-1][0] == role:
            _, prev_blocks, prev_native = turns[-1]
            turns[-1] = (role, [*prev_blocks, *blocks], prev_native if prev_native is native else None)
            return
        turns.append((role, list(blocks), native))

    @staticmethod
    def _message(role: str, blocks: list[dict[str, Any]], native: dict[str, Any] | None) -> dict[str, Any]:
        if native is not None:
            content = native["content"]
            if isinstance(content, str) and len(blocks) == 1:
                return native
            if isinstance(content, list) and len(blocks) == len(content) and all(
                    a is b for a, b in zip(blocks, content, strict=True)):
                return native
        if role == "user":  # tool results lead a user turn (the API rejects text before them)
            blocks = [*(b for b in blocks if b.get("type") == "tool_result"),
                      *(b for b in blocks if b.get("type") != "tool_result")]
        base = {k: v for k, v in (native or {}).items() if k != "content"}
        return {**base, "role": role, "content": blocks}

    def _breakpoints_between(self, start: int, stop: int) -> list[Any]:
        found = []
        for native in self.body["messages"][start:stop]:
            content = native.get("content")
            for block in content if isinstance(content, list) else ():
                if isinstance(block, dict) and block.get("cache_control"):
                    found.append(block["cache_control"])
        return found

    @staticmethod
    def _reanchor(messages: list[dict[str, Any]], body: dict[str, Any], anchor: tuple[int, int],
                  value: Any) -> None:
        """Put one breakpoint that left with evicted messages on the block before the gap, so the prefix
        the provider cached up to there is still marked (within the limit of 4)."""
        turn, index = anchor
        if turn >= len(messages) or count_breakpoints(body, messages) >= MAX_BREAKPOINTS:
            return
        content = messages[turn]["content"]
        if not isinstance(content, list) or not content or index >= len(content):
            return
        index = next((i for i in range(index, -1, -1) if content[i].get("type") not in UNCACHEABLE), -1)
        if index < 0 or content[index].get("cache_control"):
            return
        content = list(content)
        content[index] = {**content[index], "cache_control": value}
        messages[turn] = {**messages[turn], "content": content}


def prefill_last(turns: list[tuple[str, list[dict[str, Any]], dict[str, Any] | None]],
                 injected: set[int]) -> None:
    """A request that ends in an assistant turn (a prefill the model continues) keeps it last: blocks the
    pipeline injected after it join the user turn before it."""
    if len(turns) < 2 or turns[-1][0] != "user" or turns[-2][0] != "assistant" \
            or not all(id(block) in injected for block in turns[-1][1]):
        return
    _, blocks, _ = turns.pop()
    if len(turns) >= 2 and turns[-2][0] == "user":
        role, before, _ = turns[-2]
        turns[-2] = (role, [*before, *blocks], None)
    else:
        turns.insert(len(turns) - 1, ("user", blocks, None))
