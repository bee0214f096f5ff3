"""The upstream answer's wrapper: errors named by what happened, headers read as one line would say them.
(The real socket cases — reset, closed mid-body, a silent upstream — are in tests/test_stream_faults.py.)"""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp.http_exceptions import ContentLengthError, TransferEncodingError
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.faults import describe
from proxy.upstream import connection_listed, response_headers
from proxy.upstream_response import (
    Headers,
    ReadError,
    ReadTimeout,
    RemoteProtocolError,
    UpstreamResponse,
    transport_error,
)


def payload_error(cause: BaseException) -> aiohttp.ClientPayloadError:
    error = aiohttp.ClientPayloadError(f"Response payload is not completed: {cause!r}")
    error.__cause__ = cause
    return error


@pytest.mark.parametrize(("raised", "expected"), [
    (aiohttp.SocketTimeoutError("Timeout on reading data from socket"), ReadTimeout),
    (TimeoutError(), ReadTimeout),
    (payload_error(TransferEncodingError("Not enough data to satisfy transfer length header.")),
     RemoteProtocolError),
    (payload_error(ContentLengthError("Not enough data to satisfy content length header.")),
     RemoteProtocolError),
    (payload_error(ConnectionResetError(104, "Connection reset by peer")), ReadError),
    (aiohttp.ServerDisconnectedError(), RemoteProtocolError),
    (aiohttp.ClientOSError(32, "Broken pipe"), ReadError),
    (ConnectionResetError(104, "Connection reset by peer"), ReadError),
])
def test_a_broken_body_is_named_by_what_happened(raised, expected):
    error = transport_error(raised, 7.5)
    assert type(error) is expected
    assert describe(error).startswith(expected.__name__)
    if expected is ReadTimeout:
        assert "no data for 7.5 s (upstream.timeout_s)" in describe(error)


@pytest.mark.parametrize("raised", [ValueError("a bug"), KeyError("x")])
def test_anything_else_is_not_a_transport_error(raised):
    assert transport_error(raised, 1.0) is None


def test_headers_read_case_insensitively_with_repeats_joined():
    raw = CIMultiDict([("Content-Type", "text/event-stream"), ("Set-Cookie", "a=1"), ("set-cookie", "b=2"),
                       ("Connection", "keep-alive, X-Hop"), ("X-Hop", "secret"), ("Date", "today"),
                       ("x-request-id", "req_1")])
    headers = Headers(CIMultiDictProxy(raw))
    assert headers["content-type"] == headers.get("CONTENT-TYPE") == "text/event-stream"
    assert headers["set-cookie"] == "a=1, b=2" and headers.get_list("Set-Cookie") == ["a=1", "b=2"]
    assert list(headers) == ["content-type", "set-cookie", "connection", "x-hop", "date", "x-request-id"]
    assert len(headers) == 6 and "missing" not in headers and headers.get("missing") is None
    assert connection_listed(headers) == {"keep-alive", "x-hop"}
    # relayed: minus hop-by-hop, minus what the Connection header names, minus Date (our server sets it)
    assert response_headers(headers, keep_length=False) == {
        "content-type": "text/event-stream", "set-cookie": "a=1, b=2", "x-request-id": "req_1"}


class _Raw:
    """What closing touches of aiohttp's response."""

    status = 200
    headers = CIMultiDictProxy(CIMultiDict())

    def __init__(self, read_whole: bool) -> None:
        self.content = type("Content", (), {"at_eof": staticmethod(lambda: read_whole)})()
        self.released = self.closed = 0

    def release(self) -> None:
        self.released += 1

    def close(self) -> None:
        self.closed += 1


@pytest.mark.parametrize("read_whole", [True, False])
def test_closing_never_suspends_so_no_cancellation_can_cut_it_short(read_whole):
    """Relays close their upstream response in `finally` without a cancel scope around it (one cost
    ~5 µs a response): that holds while closing runs to its end in one step."""
    raw = _Raw(read_whole)
    closing = UpstreamResponse(raw, 0.0, None).aclose()  # type: ignore[arg-type]
    with pytest.raises(StopIteration):
        closing.send(None)
    assert (raw.released, raw.closed) == ((1, 0) if read_whole else (0, 1))
