"""How an upstream answer can fail, and how the client is told: no stream ends silently.

A stream that breaks off (reset, closed mid-body, read timeout) or just stops before its answer is
complete ends, for the client, with one OpenAI-shaped error event and no `[DONE]`, so an SDK raises
instead of returning a truncated answer as if it were whole. The archive gets the true cause.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from proxy.archive import ExchangeRecord

from proxy.errors import CtxProxyError, UpstreamTimeout
from proxy.sse import DONE, EventSplitter, event_data
from proxy.upstream_response import ReadTimeout, TransportError, UpstreamResponse

STREAM_BROKEN = "upstream_stream_broken"
TIMEOUT = "upstream_timeout"
CUT_SHORT = "upstream stream ended without a finish_reason or [DONE]"


class UpstreamBroken(CtxProxyError):
    """The upstream answered, then broke off before its answer was whole (no timeout)."""

    status = 502
    type = "upstream_error"
    code = STREAM_BROKEN


def describe(exc: BaseException) -> str:
    """`Type: message`, never empty; a read timeout says how long the upstream was silent."""
    text = str(exc).strip()
    if isinstance(exc, ReadTimeout):
        read = exc.timeout_s
        silence = f"no data for {read:g} s (upstream.timeout_s)" if read is not None else ""
        text = "; ".join(part for part in (text, silence) if part)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def stream_failure(exc: BaseException) -> tuple[str, str]:
    """(error code, message) for an exception that ended an upstream stream."""
    code = TIMEOUT if isinstance(exc, ReadTimeout) else STREAM_BROKEN
    return code, f"upstream stream broke off: {describe(exc)}"


def error_object(message: str, code: str, kind: str = "upstream_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": code, "param": None}}


def error_event(message: str, code: str, kind: str = "upstream_error") -> bytes:
    """The last event of a failed stream (the openai SDK raises APIError on an `error` object)."""
    return b"data: " + orjson.dumps(error_object(message, code, kind)) + b"\n\n"


# A non-streamed answer: the response, its body (or first bytes), and the rest when it is over the cap.
Answer = tuple[UpstreamResponse, bytes, AsyncIterator[bytes] | None]


async def read_answer(response: UpstreamResponse, base_url: str,
                      cap: int) -> tuple[bytes, AsyncIterator[bytes] | None]:
    """A non-streamed answer, read up to `cap` bytes (upstream.max_response_bytes): (the whole body, None),
    or (its first `cap` bytes, the rest) — the rest is to be relayed unbuffered and closes the response
    when done. A break names its cause (type and message) and is a 502/504."""
    parts, size = [], 0
    chunks = response.aiter_raw()
    try:
        async for chunk in chunks:
            if size + len(chunk) > cap:
                parts.append(chunk[:cap - size])
                return b"".join(parts), _rest(response, chunk[cap - size:], chunks)
            parts.append(chunk)
            size += len(chunk)
    except BaseException as exc:
        await response.aclose()  # (never suspends: no cancellation can cut it short)
        if isinstance(exc, ReadTimeout):
            raise UpstreamTimeout(f"upstream {base_url} timed out while sending its response: "
                                  f"{describe(exc)}") from None
        if isinstance(exc, TransportError):
            raise UpstreamBroken(f"upstream {base_url} broke off its response: {describe(exc)}") from None
        raise
    await response.aclose()
    return b"".join(parts), None


async def _rest(response: UpstreamResponse, first: bytes,
                chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    try:
        yield first
        async for chunk in chunks:
            yield chunk
    finally:
        await response.aclose()  # (never suspends: no cancellation can cut it short)


async def close_timed(response: UpstreamResponse, record: ExchangeRecord) -> None:
    """Close an upstream response however its relay ended (its close never suspends, so no cancellation
    cuts it short) and record how long the upstream took, to the end of its body."""
    await response.aclose()  # (never suspends: no cancellation can cut it short)
    record.upstream_ms = response.elapsed_ms  # from sending the request to this close


def is_event_stream(response: UpstreamResponse) -> bool:
    """A 200 answer to read as server-sent events (not a JSON error or a provider ignoring stream)."""
    return response.status_code == 200 and "json" not in response.headers.get("content-type", "").lower()


def terminator(tail: bytes) -> bytes:
    """What completes an event the upstream left without its blank line."""
    if tail.endswith((b"\n\n", b"\r\r", b"\r\n\r\n")):
        return b""
    return b"\n" if tail.endswith((b"\n", b"\r")) else b"\n\n"


def complete_tail(tail: bytes) -> bool:
    """Whether bytes left after the last blank line hold a whole event (`[DONE]`, JSON, a comment)."""
    if not tail.strip():
        return False
    data = event_data(tail)
    if data is None:
        return tail.lstrip().startswith(b":") and tail.rstrip(b"\r").endswith(b"\n")
    if data.strip() == DONE:
        return True
    try:
        orjson.loads(data)
    except orjson.JSONDecodeError:
        return False
    return True


class StreamWatch:
    """Relay an SSE byte stream event by event and notice how it ends.

    Complete events go out as the upstream sent them (same bytes, same order); an event cut across
    network reads goes out once whole, so a break never leaves the client half an event.
    """

    def __init__(self) -> None:
        self.splitter = EventSplitter()
        self.done = False  # [DONE] seen
        self.finished = False  # a finish_reason seen
        self.upstream_error: Any = None  # an `error` object the upstream put in the stream

    @property
    def whole(self) -> bool:
        return self.done or self.finished

    def feed(self, chunk: bytes) -> bytes:
        complete, events = self.splitter.feed_raw(chunk)
        for event in events:
            self._see(event)
        return complete

    def flush(self) -> bytes:
        """The bytes left after the last event: the whole event they hold, terminated, or nothing."""
        tail = self.splitter.rest()
        if not complete_tail(tail):
            return b""
        self._see(tail)
        return tail + terminator(tail)

    @property
    def cut_tail(self) -> bool:
        """Bytes of an unfinished event were left over (dropped by `flush`)."""
        tail = self.splitter.rest()
        return bool(tail.strip()) and not complete_tail(tail)

    def _see(self, event: bytes) -> None:
        data = event_data(event)
        if data is None:
            return
        if data.strip() == DONE:
            self.done = True
            return
        if b"finish_reason" not in data and b"error" not in data:
            return
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        if not isinstance(obj, dict):
            return
        if obj.get("error") and self.upstream_error is None:
            self.upstream_error = obj["error"]
        choices = obj.get("choices")
        if isinstance(choices, list) and any(isinstance(c, dict) and c.get("finish_reason") for c in choices):
            self.finished = True


def answer_object(payload: bytes) -> tuple[dict[str, Any] | None, str]:
    """A whole answer as a JSON object, or why it is not one the proxy can act on (an error object)."""
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        return None, f"not JSON: {exc}"
    if not isinstance(data, dict):
        return None, f"a JSON {type(data).__name__}, not an object"
    if data.get("error"):
        return None, f"an error object: {error_message(data['error'])}"
    return data, ""


def error_message(error: Any) -> str:
    """The message of an upstream `error` value, whatever its shape."""
    if isinstance(error, dict) and isinstance(error.get("message"), str) and error["message"]:
        return error["message"]
    return orjson.dumps(error).decode()[:2000] if not isinstance(error, str) else error[:2000]
