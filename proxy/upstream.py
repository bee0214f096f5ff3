"""The provider side: one shared httpx client, header hygiene, error mapping. Never rewrites messages."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Awaitable, Mapping
from typing import TypeVar

import httpx

from proxy.config import UpstreamConfig
from proxy.errors import UpstreamTimeout, UpstreamUnreachable

T = TypeVar("T")

# RFC 9110 hop-by-hop headers plus the ones httpx/uvicorn recompute for the new hop. Every header named
# in a Connection header is hop-by-hop too (RFC 9110 section 7.6.1); see `connection_listed`.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te",
    "trailer", "trailers", "transfer-encoding", "upgrade", "host", "content-length",
})
# Client-side details the provider has no need of: cookies for the proxy's own origin and the client's
# network address. Sent upstream only when named in upstream.forward_headers.
PRIVATE_REQUEST_HEADERS = frozenset({
    "cookie", "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto", "x-forwarded-port",
    "x-forwarded-prefix", "forwarded", "x-real-ip",
})
# Set by the server that answers the client (uvicorn adds its own), so never relayed from the upstream.
SERVER_RESPONSE_HEADERS = frozenset({"date", "server"})


def connection_listed(headers: Mapping[str, str]) -> set[str]:
    """Lower-cased header names listed in the Connection header(s) of `headers`."""
    getlist = getattr(headers, "getlist", None) or getattr(headers, "get_list", None)  # starlette, httpx
    values = getlist("connection") if getlist else [v for k, v in headers.items()
                                                    if k.lower() == "connection"]
    return {name.strip().lower() for value in values for name in value.split(",") if name.strip()}


class ClientDisconnected(Exception):
    """The client went away before the upstream answered; the upstream call was cancelled."""


class Upstream:
    def __init__(self, config: UpstreamConfig, fallback_api_key: str | None,
                 transport: httpx.AsyncBaseTransport | None = None, *, anthropic: bool = False) -> None:
        # Anthropic's upstream takes its key as x-api-key; OpenAI-compatible ones as a bearer token.
        self.base_url = (config.anthropic_base_url if anthropic else config.base_url).rstrip("/")
        self.fallback_api_key = fallback_api_key
        self.anthropic = anthropic
        self.forward_headers = frozenset(name.lower() for name in config.forward_headers)
        self.max_response_bytes = config.max_response_bytes
        self.client = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=httpx.Timeout(config.timeout_s, connect=config.connect_timeout_s),
            limits=httpx.Limits(max_connections=config.max_connections,
                                max_keepalive_connections=config.max_keepalive_connections),
            transport=transport,
            follow_redirects=False,
        )

    async def aclose(self) -> None:
        await self.client.aclose()

    def request_headers(self, client_headers: Mapping[str, str], *, identity: bool) -> dict[str, str]:
        """Client headers minus hop-by-hop (and those the Connection header names), our own, and the
        private ones (cookies, forwarding addresses) unless upstream.forward_headers lets them through.
        The client's key goes upstream unchanged."""
        drop = HOP_BY_HOP | connection_listed(client_headers)
        private = PRIVATE_REQUEST_HEADERS - self.forward_headers
        headers: dict[str, str] = {}
        for key, value in client_headers.items():
            name = key.lower()
            if name not in drop and name not in private and not name.startswith("x-ctxproxy-"):
                headers[name] = value
        if self.fallback_api_key and not {"authorization", "api-key", "x-api-key"} & headers.keys():
            if self.anthropic:
                headers["x-api-key"] = self.fallback_api_key
            else:
                headers["authorization"] = f"Bearer {self.fallback_api_key}"
        if identity:
            # We read chat responses (archive, internal tools) and relay SSE as it comes: no gzip.
            headers["accept-encoding"] = "identity"
        return headers

    async def open(self, method: str, path: str, query: bytes, headers: dict[str, str],
                   content: bytes | AsyncIterable[bytes] | None) -> httpx.Response:
        """Send a request and return the response with its body not yet read."""
        url = path + ("?" + query.decode("latin-1") if query else "")
        request = self.client.build_request(method, url, headers=headers, content=content)
        try:
            return await self.client.send(request, stream=True)
        except httpx.TimeoutException as exc:
            raise UpstreamTimeout(f"upstream {self.base_url} timed out ({type(exc).__name__})") from None
        except httpx.TransportError as exc:
            reason = str(exc) or type(exc).__name__
            raise UpstreamUnreachable(f"upstream {self.base_url} is unreachable: {reason}") from None

    @staticmethod
    async def read(response: httpx.Response, base_url: str) -> bytes:
        try:
            return await response.aread()
        except httpx.TimeoutException:
            raise UpstreamTimeout(f"upstream {base_url} timed out while sending its response") from None
        except httpx.TransportError as exc:
            raise UpstreamUnreachable(f"upstream {base_url} broke off its response: {exc}") from None
        finally:
            await response.aclose()


def response_headers(upstream_headers: httpx.Headers, *, keep_length: bool) -> dict[str, str]:
    """Upstream response headers safe to relay to the client: minus hop-by-hop (and those the upstream's
    Connection header names) and minus Date and Server, which our server sets itself."""
    drop = (HOP_BY_HOP if not keep_length else HOP_BY_HOP - {"content-length"}) | SERVER_RESPONSE_HEADERS
    drop |= connection_listed(upstream_headers)
    return {k: v for k, v in upstream_headers.items() if k.lower() not in drop}


async def unless_disconnected(work: Awaitable[T], receive) -> T:
    """Run `work`, cancelling it if the client disconnects first (also before upstream headers)."""
    task = asyncio.ensure_future(work)

    async def wait_for_disconnect() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(wait_for_disconnect())
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
        watcher.cancel()
    if task.cancelled() or not task.done():
        raise ClientDisconnected()
    return task.result()
