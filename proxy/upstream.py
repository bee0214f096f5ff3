"""The provider side: one shared httpx client, header hygiene, error mapping. Never rewrites messages."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping
from typing import TypeVar

import httpx

from proxy.config import UpstreamConfig
from proxy.errors import UpstreamTimeout, UpstreamUnreachable

T = TypeVar("T")

# RFC 9110 hop-by-hop headers plus the ones httpx/uvicorn recompute for the new hop.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te",
    "trailer", "trailers", "transfer-encoding", "upgrade", "host", "content-length",
})


class ClientDisconnected(Exception):
    """The client went away before the upstream answered; the upstream call was cancelled."""


class Upstream:
    def __init__(self, config: UpstreamConfig, fallback_api_key: str | None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.base_url = config.base_url.rstrip("/")
        self.fallback_api_key = fallback_api_key
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
        """Client headers minus hop-by-hop and our own; the client's key goes upstream unchanged."""
        headers = {k: v for k, v in client_headers.items()
                   if k not in HOP_BY_HOP and not k.startswith("x-ctxproxy-")}
        if self.fallback_api_key and "authorization" not in headers and "api-key" not in headers:
            headers["authorization"] = f"Bearer {self.fallback_api_key}"
        if identity:
            # We read chat responses (archive, internal tools) and relay SSE as it comes: no gzip.
            headers["accept-encoding"] = "identity"
        return headers

    async def open(self, method: str, path: str, query: bytes, headers: dict[str, str],
                   content: bytes | None) -> httpx.Response:
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
    """Upstream response headers safe to relay to the client."""
    drop = HOP_BY_HOP if not keep_length else HOP_BY_HOP - {"content-length"}
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
