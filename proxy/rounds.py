"""Internal tool rounds: when the model calls a proxy tool, answer it and ask the model again.

The client sees one response: no internal call, no internal result, one response id, one [DONE].
Every upstream call (round) is archived as its own exchange, internal messages included.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import orjson

from proxy import faults, telemetry
from proxy.archive import ExchangeRecord
from proxy.budget import GateResult, padded
from proxy.errors import CtxProxyError
from proxy.internal_tools import ToolContext, execute, is_internal_call, tool_name
from proxy.layers import splices
from proxy.offload import off_loop_if_large
from proxy.state import StateStore
from proxy.upstream import Upstream
from proxy.wire import Decoded, Turn, WireFormat

CHARS_PER_TOKEN = 3  # conservative: a page must fit the room left in the window


@dataclass
class RoundsContext:
    upstream: Upstream
    wire: WireFormat
    decoded: Decoded  # the client's request (its params are reused every round)
    path: str
    query: bytes
    headers: dict[str, str]
    original: list[dict[str, Any]]  # client messages
    forwarded: list[dict[str, Any]]  # after the pipeline
    tools: list[Any] | None
    first_content: bytes  # the exact bytes of round 1
    tool_context: ToolContext
    max_rounds: int
    window: int
    pad_pct: float
    gate: Callable[[list[dict[str, Any]], list[dict[str, Any]], frozenset[str]], GateResult]
    count: Callable[[list[dict[str, Any]], list[Any] | None], int]
    new_record: Callable[[list[dict[str, Any]], GateResult | None], ExchangeRecord]
    records: list[ExchangeRecord] = field(default_factory=list)
    calls: Counter[str] = field(default_factory=Counter)  # internal calls answered, by tool name
    first_headers_ms: float = 0.0  # a stream opened before the rounds began: time to its headers


class Conversation:
    """The growing forwarded conversation of one client request across internal rounds."""

    def __init__(self, rc: RoundsContext) -> None:
        self.rc = rc
        self.original = list(rc.original)
        self.forwarded = list(rc.forwarded)
        self.internal_ids: set[str] = set()
        self.round = 0

    def content(self) -> bytes:
        if self.round == 0:
            return self.rc.first_content
        return self.rc.decoded.encode(self.forwarded, self.original, self.rc.tools)

    async def execute(self, calls: list[dict[str, Any]],
                      before: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The result messages of internal calls; each page fits the room `before` and earlier pages leave.
        Token counts, archive searches and lookups are input-sized: a worker thread does them."""
        return await anyio.to_thread.run_sync(self._execute, calls, before)

    def _execute(self, calls: list[dict[str, Any]], before: list[dict[str, Any]]) -> list[dict[str, Any]]:
        messages, results = list(before), []
        for call in calls:
            room = self.rc.window - padded(self.rc.count(messages, self.rc.tools), self.rc.pad_pct)
            page = min(self.rc.tool_context.page_chars, int(room * 0.8) * CHARS_PER_TOKEN)
            if page < 400:
                text = "error: no room left in the context window for more retrieved text"
            else:
                with telemetry.tool_call(call):
                    text = execute(call, dataclasses.replace(self.rc.tool_context, page_chars=page))
            self.rc.calls[tool_name(call) or "?"] += 1
            result = {"role": "tool", "tool_call_id": call.get("id"), "content": text}
            messages.append(result)
            results.append(result)
        return results

    async def answer(self, turn: Turn) -> GateResult:
        """Append the model's turn (internal calls only) and their results, then gate the next round."""
        assistant, calls = turn.assistant, turn.calls
        self.original.append(assistant)
        self.forwarded.append(assistant)
        results = await self.execute(calls, self.forwarded)
        self.original.extend(results)
        self.forwarded.extend(results)
        self.internal_ids.update(str(call.get("id")) for call in calls)
        gated = await anyio.to_thread.run_sync(self.rc.gate, self.original, self.forwarded,
                                               frozenset(self.internal_ids))
        self.forwarded = gated.messages
        self.round += 1
        return gated

    async def splice(self, content: str | None, calls: list[dict[str, Any]]) -> None:
        """A turn that called client tools too: answer our calls now (the model waits for the client's
        results before it goes on) and keep them, so the turn's next request puts them back."""
        positions = [index for index, call in enumerate(calls) if is_internal_call(call)]
        assistant: dict[str, Any] = {"role": "assistant", "content": content or None, "tool_calls": calls}
        results = await self.execute([calls[i] for i in positions], [*self.forwarded, assistant])
        made = splices.make(calls, positions, results)
        if made is not None:
            context = self.rc.tool_context
            await anyio.to_thread.run_sync(_remember, context.store, context.tenant, context.session_id, made)


def _remember(store: StateStore, tenant: str, session_id: str, splice: splices.Splice) -> None:
    splices.remember(store, tenant, session_id, splice)


def split_calls(calls: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    internal = [c for c in calls if is_internal_call(c)]
    return internal, [c for c in calls if not is_internal_call(c)]


def add_usage(total: dict[str, Any] | None, usage: Any) -> dict[str, Any] | None:
    """Sum token usage over rounds, so the client sees what the whole answer cost."""
    if not usage or not isinstance(usage, dict):
        return total
    if total is None:
        return copy.deepcopy(usage)
    for key, value in usage.items():
        if isinstance(value, int) and isinstance(total.get(key), int):
            total[key] += value
        elif isinstance(value, dict) and isinstance(total.get(key), dict):
            add_usage(total[key], value)
    return total


def same_messages(these: list[dict[str, Any]], those: list[dict[str, Any]]) -> bool:
    """The same message objects in the same order (no walk over their contents)."""
    if these is those:
        return True
    return len(these) == len(those) and all(a is b for a, b in zip(these, those, strict=True))


def new_round(rc: RoundsContext, conversation: Conversation) -> ExchangeRecord:
    record = rc.new_record(list(conversation.forwarded), None)  # a snapshot: later rounds append
    rc.records.append(record)
    return record


async def begin_round(rc: RoundsContext, conversation: Conversation) -> tuple[ExchangeRecord, bytes]:
    """A round's record and request bytes. After the first round both count and serialize the whole
    history, so they are made in a worker thread."""
    if conversation.round == 0:
        return new_round(rc, conversation), conversation.content()
    return await anyio.to_thread.run_sync(lambda: (new_round(rc, conversation), conversation.content()))


async def complete(rc: RoundsContext) -> faults.Answer:
    """Non-streaming: loop until the model answers without internal calls (or rounds run out).

    An answer the proxy cannot read (or an error status) goes to the client as the upstream sent it;
    the round's record says why it was not taken further.
    """
    conversation = Conversation(rc)
    usage: dict[str, Any] | None = None
    rewrite = False
    earlier: list[dict[str, Any]] = []  # answers of the rounds we answered ourselves
    while True:
        record, content = await begin_round(rc, conversation)
        started = time.perf_counter()
        try:
            response = await telemetry.upstream_call(
                rc, rc.upstream.open("POST", rc.path, rc.query, rc.headers, content))
            record.status = response.status_code
            payload, rest = await faults.read_answer(response, rc.upstream.base_url,
                                                     rc.upstream.max_response_bytes)
        finally:
            record.upstream_ms = (time.perf_counter() - started) * 1000
        record.response_body = payload
        if rest is not None:  # too big to read as an answer: relayed untouched, unbuffered
            record.response_truncated = True
            record.error = "upstream answer over upstream.max_response_bytes; relayed untouched"
            return response, payload, rest
        if response.status_code != 200:
            if conversation.round:
                record.error = f"upstream answered HTTP {response.status_code} to internal round " \
                               f"{conversation.round}; relayed"
            return response, payload, None
        data, problem = await off_loop_if_large(len(payload), rc.wire.read_answer, payload)
        if data is None:
            record.error = f"upstream answer is not a {rc.wire.answer_kind} ({problem}); relayed untouched"
            return response, payload, None
        turn = rc.wire.turn(data, rc.decoded)
        usage = add_usage(usage, rc.wire.usage(data))
        internal, client_calls = split_calls(turn.calls)
        if not internal:
            break
        rewrite = True
        if client_calls:
            await conversation.splice(turn.text, turn.calls)
            rc.wire.keep_calls(data, client_calls, None)
            break
        if conversation.round >= rc.max_rounds:
            rc.wire.keep_calls(data, client_calls, stopped_note(rc.max_rounds))
            break
        earlier.append(data)
        try:
            await conversation.answer(turn)
        except CtxProxyError:
            new_round(rc, conversation)  # the refused round is the one that failed (the app marks it)
            raise
    if rewrite or conversation.round:
        if usage is not None:
            rc.wire.set_usage(data, usage)
        rc.wire.merge_rounds(data, earlier)
        payload = await off_loop_if_large(len(payload), orjson.dumps, data)
    return response, payload, None


def stopped_note(limit: int) -> str:
    return f"(ctxproxy: stopped after {limit} read_tool_result rounds without an answer)"
