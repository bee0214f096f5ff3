"""The provider side: one pooled aiohttp client per upstream, header hygiene, error mapping. Never rewrites
messages. (aiohttp on uvloop costs ~40% less CPU per forwarded request here than httpx over anyio: see
bench/overhead.py.)"""

from __future__ import annotations

import functools
import os
import ssl
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncIterable, Awaitable, Mapping
from typing import TypeVar

import aiohttp
from starlette.types import Receive

from proxy.client_watch import client_watch
from proxy.config import UpstreamConfig
from proxy.errors import UpstreamTimeout, UpstreamUnreachable
from proxy.upstream_response import Headers, ReadTimeout, TransportError, UpstreamResponse, transport_error

T = TypeVar("T")

# RFC 9110 hop-by-hop headers plus the ones aiohttp/uvicorn recompute for the new hop. Every header named
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
    getlist = getattr(headers, "getlist", None) or getattr(headers, "get_list", None)  # starlette, ours
    values = getlist("connection") if getlist else [v for k, v in headers.items()
                                                    if k.lower() == "connection"]
    return {name.strip().lower() for value in values for name in value.split(",") if name.strip()}


class ClientDisconnected(Exception):
    """The client went away before the upstream answered; the upstream call was cancelled."""


class Upstream:
    def __init__(self, config: UpstreamConfig, fallback_api_key: str | None, *,
                 anthropic: bool = False) -> None:
        # Anthropic's upstream takes its key as x-api-key; OpenAI-compatible ones as a bearer token.
        self.base_url = (config.anthropic_base_url if anthropic else config.base_url).rstrip("/")
        self.fallback_api_key = fallback_api_key
        self.anthropic = anthropic
        self.forward_headers = frozenset(name.lower() for name in config.forward_headers)
        self.max_response_bytes = config.max_response_bytes
        self.read_timeout_s = config.timeout_s
        # connect: a pooled connection (or a free pool slot) within timeout_s, a new TCP connection within
        # connect_timeout_s; sock_read: the upstream silent for timeout_s (its headers or between chunks).
        self.timeout = aiohttp.ClientTimeout(total=None, connect=config.timeout_s,
                                             sock_connect=config.connect_timeout_s,
                                             sock_read=config.timeout_s)
        self.max_connections = config.max_connections
        self.keep_alive = config.max_keepalive_connections > 0
        self.proxy = env_proxy(self.base_url)
        self._session: aiohttp.ClientSession | None = None  # made on the event loop, at the first call

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            # Our trust store (certifi's bundle, ~0.1 s to load) only for a TLS hop; a plain-HTTP upstream
            # (a local model server) does without, so its first request does not wait for it.
            hops = (self.base_url, self.proxy or "")
            tls = any(urllib.parse.urlsplit(url).scheme == "https" for url in hops)
            connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=0,
                                             ssl=tls_context() if tls else True,
                                             force_close=not self.keep_alive,
                                             keepalive_timeout=5.0 if self.keep_alive else None)
            # Bodies are relayed as they come: never decompressed here (content-encoding goes along).
            # No cookie jar: a cookie one tenant's answer set must never ride along with another's call.
            # (trust_env stays off: it would look up ~/.netrc and the proxy in a thread on every call.)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self.timeout,
                                                  auto_decompress=False, trust_env=False,
                                                  cookie_jar=aiohttp.DummyCookieJar())
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

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
                   content: bytes | AsyncIterable[bytes] | None) -> UpstreamResponse:
        """Send a request and return the response with its body not yet read."""
        url = self.base_url + path + ("?" + query.decode("latin-1") if query else "")
        sent_at = time.perf_counter()
        try:
            raw = await self.session().request(method, url, headers=headers, data=content,
                                               allow_redirects=False, proxy=self.proxy)
        except TimeoutError as exc:  # (aiohttp's socket and connection timeouts are TimeoutErrors)
            raise UpstreamTimeout(f"upstream {self.base_url} timed out ({type(exc).__name__})") from None
        except (aiohttp.ClientError, OSError) as exc:
            # (closed before answering: "peer closed connection...", as for a body cut short)
            error = transport_error(exc, None) if isinstance(exc, aiohttp.ServerDisconnectedError) else exc
            reason = str(error) or type(error).__name__
            raise UpstreamUnreachable(f"upstream {self.base_url} is unreachable: {reason}") from None
        return UpstreamResponse(raw, sent_at, self.read_timeout_s)

    @staticmethod
    async def read(response: UpstreamResponse, base_url: str) -> bytes:
        try:
            return await response.aread()
        except ReadTimeout:
            raise UpstreamTimeout(f"upstream {base_url} timed out while sending its response") from None
        except TransportError as exc:
            raise UpstreamUnreachable(f"upstream {base_url} broke off its response: {exc}") from None
        finally:
            await response.aclose()


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The CAs a provider's certificate is checked against: SSL_CERT_FILE or SSL_CERT_DIR when set, else
    certifi's bundle — the trust store httpx used, so a machine without system CAs still verifies."""
    if os.environ.get("SSL_CERT_FILE"):
        return ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
    if os.environ.get("SSL_CERT_DIR"):
        return ssl.create_default_context(capath=os.environ["SSL_CERT_DIR"])
    import certifi

    return ssl.create_default_context(cafile=certifi.where())


def env_proxy(base_url: str) -> str | None:
    """The proxy HTTPS_PROXY / HTTP_PROXY (or ALL_PROXY) name for this upstream unless NO_PROXY exempts its
    host, read once at start (as httpx did on every call)."""
    url = urllib.parse.urlsplit(base_url)
    if not url.hostname or urllib.request.proxy_bypass(url.hostname):
        return None
    proxies = urllib.request.getproxies()
    return proxies.get(url.scheme) or proxies.get("all")


def response_headers(upstream_headers: Headers, *, keep_length: bool) -> dict[str, str]:
    """Upstream response headers safe to relay to the client: minus hop-by-hop (and those the upstream's
    Connection header names) and minus Date and Server, which our server sets itself."""
    drop = (HOP_BY_HOP if not keep_length else HOP_BY_HOP - {"content-length"}) | SERVER_RESPONSE_HEADERS
    drop |= connection_listed(upstream_headers)
    return {k: v for k, v in upstream_headers.items() if k.lower() not in drop}


async def unless_disconnected(work: Awaitable[T], receive: Receive) -> T:
    """Await `work`, cancelling it if the client disconnects first (also before upstream headers)."""
    with client_watch(receive) as watch:
        result = await work
    if watch.gone:
        raise ClientDisconnected()
    return result
