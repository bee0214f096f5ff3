"""An upstream answer as the rest of the proxy reads it, over aiohttp: status, headers, the raw body in
chunks as they come, close — and the one tree of errors a body can end with.

The error names are those the archive and the logs have always shown (ReadError, RemoteProtocolError,
ReadTimeout): what a broken answer is called does not depend on the HTTP library underneath.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import TYPE_CHECKING

import aiohttp

if TYPE_CHECKING:
    from multidict import CIMultiDictProxy


class TransportError(Exception):
    """The connection broke while the upstream's answer was being read."""


class ReadError(TransportError):
    """The connection failed (reset, or any other socket error) mid-answer."""


class RemoteProtocolError(TransportError):
    """The upstream closed the connection before its answer was complete."""


class ReadTimeout(TransportError):
    """The upstream sent nothing for `timeout_s` (upstream.timeout_s)."""

    def __init__(self, message: str, timeout_s: float | None) -> None:
        super().__init__(message)
        self.timeout_s = timeout_s


def transport_error(exc: BaseException, read_timeout_s: float | None) -> TransportError | None:
    """Our error for what aiohttp raised while reading a body; None for anything else (a bug, a cancel)."""
    if isinstance(exc, TransportError):
        return exc
    if isinstance(exc, TimeoutError):  # (aiohttp's socket and connection timeouts are TimeoutErrors)
        return ReadTimeout(str(exc) or "no data from the upstream", read_timeout_s)
    if isinstance(exc, aiohttp.ClientPayloadError):
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, ConnectionError | OSError) or "reset" in str(exc).lower():
            return ReadError(str(cause or exc))
        return RemoteProtocolError("peer closed connection without sending complete message body")
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return RemoteProtocolError("peer closed connection without sending complete message body")
    if isinstance(exc, aiohttp.ClientError | OSError):
        return ReadError(str(exc))
    return None


class Headers(Mapping[str, str]):
    """Response headers, case-insensitive; a name sent more than once reads as its values joined by ", "
    (as one header line would say it); `get_list` gives them apart."""

    def __init__(self, raw: CIMultiDictProxy[str]) -> None:
        self._raw = raw

    def __getitem__(self, name: str) -> str:
        values = self._raw.getall(name)  # KeyError when absent
        return values[0] if len(values) == 1 else ", ".join(values)

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys(key.lower() for key in self._raw))

    def __len__(self) -> int:
        return len(set(key.lower() for key in self._raw))

    def get_list(self, name: str) -> list[str]:
        return list(self._raw.getall(name, []))


class UpstreamResponse:
    """An answer whose headers have arrived and whose body has not been read yet."""

    def __init__(self, raw: aiohttp.ClientResponse, sent_at: float, read_timeout_s: float | None) -> None:
        self._raw = raw
        self.status_code = raw.status
        self.headers = Headers(raw.headers)
        self._sent_at = sent_at
        self._headers_at = time.perf_counter()  # (made as the headers arrive)
        self._read_timeout_s = read_timeout_s
        self._closed_at: float | None = None
        self._on_close: list[Callable[[], None]] = []

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        """The body as it arrives (transfer coding undone, content coding kept); a break raises a
        TransportError."""
        try:
            async for chunk in self._raw.content.iter_any():
                yield chunk
        except Exception as exc:
            error = transport_error(exc, self._read_timeout_s)
            if error is None or error is exc:
                raise
            raise error from None

    async def aread(self) -> bytes:
        parts = [chunk async for chunk in self.aiter_raw()]
        return b"".join(parts)

    async def aclose(self) -> None:
        """Give the connection back (to the pool when the body was read whole, else closed). Idempotent.
        Never suspends (no await in it): a relay's `finally` needs no cancel scope around it."""
        if self._closed_at is not None:
            return
        self._closed_at = time.perf_counter()
        if self._raw.content.at_eof():
            self._raw.release()
        else:  # left mid-body (a client gone, a cap): that connection cannot carry another call
            self._raw.close()
        for callback in self._on_close:
            callback()

    def on_close(self, callback: Callable[[], None]) -> None:
        self._on_close.append(callback)

    @property
    def headers_ms(self) -> float:
        """From sending the request to its response's headers (the same start as `elapsed_ms`)."""
        return (self._headers_at - self._sent_at) * 1000

    @property
    def elapsed_ms(self) -> float:
        """From sending the request to the close of its response (to now while it is open)."""
        return ((self._closed_at or time.perf_counter()) - self._sent_at) * 1000
