"""The plain (no internal tools) upstream leg of a chat request: read a whole answer, or relay a stream
chunk by chunk, keeping what the archive needs either way."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio

from proxy import faults, rounds, telemetry
from proxy.archive import ExchangeRecord
from proxy.upstream import Upstream
from proxy.upstream_response import TransportError, UpstreamResponse

log = logging.getLogger("ctxproxy")

DONE_EVENT = b"data: [DONE]"
ERROR_EVENT = b'data: {"error"'  # as faults.error_event writes it (and providers do)
CHAT_ENDS = (DONE_EVENT, ERROR_EVENT)
ErrorEvent = Callable[..., bytes]  # (message, code, kind=...)


async def open_and_read(upstream: Upstream, headers: dict[str, str], content: bytes, query: bytes,
                        rc: rounds.RoundsContext) -> faults.Answer:
    """A non-streamed answer: (response, body, None), or, over upstream.max_response_bytes, (response,
    its first bytes, the rest to relay unbuffered) with the record marked as holding a prefix."""
    record = rc.new_record(rc.forwarded, None)
    rc.records.append(record)
    upstream_started = time.perf_counter()
    try:
        response = await telemetry.upstream_call(rc, upstream.open("POST", rc.path, query, headers, content))
        record.status = response.status_code
        body, rest = await faults.read_answer(response, upstream.base_url, upstream.max_response_bytes)
    finally:
        record.upstream_ms = (time.perf_counter() - upstream_started) * 1000
    record.response_body, record.response_truncated = body, rest is not None
    return response, body, rest


Done = Callable[[], Awaitable[None] | None]  # a stream's end: what is left to await, if anything


async def _ended(on_done: Done) -> None:
    """Call a stream's `on_done`; what it leaves to await is shielded from cancellation (the end of a
    stream that is done at once, most, never suspends: nothing to shield)."""
    rest = on_done()
    if rest is not None:
        with anyio.CancelScope(shield=True):
            await rest


async def relay_rest(first: bytes, rest: AsyncIterator[bytes], record: ExchangeRecord,
                     on_done: Done) -> AsyncIterator[bytes]:
    """An answer over the size cap: its first bytes, then the rest as it comes (never held in memory).
    A break mid-way aborts the response, so the client's HTTP library sees a cut body, not a clean end."""
    started = time.perf_counter()
    try:
        yield first
        async for chunk in rest:
            yield chunk
    except TransportError as exc:
        record.error = f"upstream broke off past upstream.max_response_bytes: {faults.describe(exc)}"
        raise
    finally:
        record.upstream_ms += (time.perf_counter() - started) * 1000
        await _ended(on_done)


async def relay_stream(response: UpstreamResponse, record: ExchangeRecord, cap: int,
                       watch: faults.StreamWatch | None = None,
                       error_event: ErrorEvent = faults.error_event) -> AsyncIterator[bytes]:
    """Relay upstream bytes as they arrive and keep a copy for the archive. Never ends silently.

    An event stream goes out event by event, byte for byte. If it breaks off (reset, closed mid-body,
    read timeout) or stops before a finish_reason or `[DONE]`, the client's stream ends with an
    OpenAI-shaped error event and no `[DONE]`, and the record names the cause. Anything else (an
    error status, a JSON answer) is relayed chunk by chunk untouched. The archive keeps at most `cap`
    bytes (upstream.max_response_bytes), marked when cut.
    """
    watch = (watch or faults.StreamWatch()) if faults.is_event_stream(response) else None
    broke: TransportError | None = None
    try:
        async for chunk in response.aiter_raw():
            record.keep_chunk(chunk, cap)  # the archive keeps a marked prefix of a huge answer
            out = watch.feed(chunk) if watch is not None else chunk
            if out:
                yield out
    except TransportError as exc:
        broke = exc
    finally:
        await faults.close_timed(response, record)
    if watch is None:
        if broke is not None:
            record.error = faults.stream_failure(broke)[1]
        return
    tail = watch.flush()  # an event the upstream left without its blank line
    if tail:
        yield tail
    for event in stream_end(watch, broke, record, error_event):
        yield event


def stream_end(watch: faults.StreamWatch, broke: TransportError | None, record: ExchangeRecord,
               error_event: ErrorEvent = faults.error_event) -> list[bytes]:
    """What ends a relayed event stream besides its own events: nothing, or one error event."""
    if watch.upstream_error is not None:  # relayed as sent: the client's SDK raises on it
        record.error = f"upstream sent an error in the stream: {faults.error_message(watch.upstream_error)}"
        return []
    if broke is not None:
        code, message = faults.stream_failure(broke)
        if watch.done:  # the answer was whole; only the connection's end went wrong
            record.error = f"{message} (after [DONE])"
            return []
    elif watch.whole:
        return []
    else:
        code, message = faults.STREAM_BROKEN, faults.CUT_SHORT
    if watch.cut_tail:
        message += " (mid-event)"
    record.error = message
    return [error_event(message, code)]


def _event_start(data: bytes, at: int) -> int:
    """Where the server-sent event holding data[at] begins: after the last blank line before it."""
    lf, crlf = data.rfind(b"\n\n", 0, at), data.rfind(b"\r\n\r\n", 0, at)
    return max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)


async def archived(events: AsyncIterator[bytes], records: list[ExchangeRecord],
                   on_done: Done, ends: tuple[bytes, ...] = CHAT_ENDS,
                   error_event: ErrorEvent = faults.error_event) -> AsyncIterator[bytes]:
    """Wrap a stream so its exchanges are archived however it ends (done, failed, client gone).

    The event carrying `[DONE]` (or an error event, which ends a failed stream) is held back until
    the archive has the exchange: a client that saw the end of its answer can rely on it being
    recorded, even if the proxy dies right after. Only that event: the events that arrived in the same
    read (a fast upstream's whole answer may) go out at once.
    """
    held: bytes | None = None
    try:
        async for event in events:
            if held is not None:  # "[DONE]" inside a content string, not the terminator
                yield held
                held = None
            at = max((event.rfind(end) for end in ends), default=-1)
            if at >= 0:  # the end, or an error that ends it (the last event that may be one)
                start = _event_start(event, at)
                if start:
                    yield event[:start]
                held = event[start:]
                continue
            yield event
    except Exception as exc:  # a proxy bug, not the client leaving: the client still learns of it
        log.exception("chat stream failed")
        message = f"ctxproxy failed during the stream: {faults.describe(exc)}"
        if records and not records[-1].error:
            records[-1].error = message
        held = error_event(message, "internal_error", "server_error")
    except BaseException:
        if records and not records[-1].error:
            records[-1].error = "client disconnected during the stream"
        raise
    finally:
        await _ended(on_done)
    if held is not None:
        yield held
