"""The floor for the overhead benchmark: a bare Starlette + httpx forwarder (issue 14).

Run: `python bench/bare_forwarder.py --upstream http://127.0.0.1:<n> [--port 0]`. It binds 127.0.0.1, prints
`PORT <n>` once bound, and forwards POST /v1/chat/completions, /v1/messages and /v1/responses to the
upstream with one shared httpx.AsyncClient, streaming the body back (`aiter_raw`) with the upstream's
status and content-type. Nothing else: no parsing, no archive, no metrics.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import sys
from collections.abc import AsyncIterator

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import PlainTextResponse, StreamingResponse
from starlette.routing import Route

FORWARDED = ("authorization", "content-type", "x-api-key", "anthropic-version")


def build(upstream: str) -> Starlette:
    client = httpx.AsyncClient(base_url=upstream, timeout=httpx.Timeout(60.0, connect=5.0),
                               limits=httpx.Limits(max_connections=100, max_keepalive_connections=100))

    async def forward(request: Request) -> StreamingResponse:
        headers = {k: v for k, v in request.headers.items() if k in FORWARDED}
        body = await request.body()
        outgoing = client.build_request("POST", request.url.path, content=body, headers=headers)
        response = await client.send(outgoing, stream=True)
        return StreamingResponse(response.aiter_raw(), status_code=response.status_code,
                                 media_type=response.headers.get("content-type"),
                                 background=BackgroundTask(response.aclose))

    async def healthz(_: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        yield
        await client.aclose()

    paths = ("/v1/chat/completions", "/v1/messages", "/v1/responses")
    routes = [Route(p, forward, methods=["POST"]) for p in paths] + [Route("/healthz", healthz)]
    return Starlette(routes=routes, lifespan=lifespan)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--upstream", required=True, help="base URL, e.g. http://127.0.0.1:8001")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (printed on stdout)")
    args = parser.parse_args()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    config = uvicorn.Config(build(args.upstream), loop="uvloop", http="httptools", lifespan="on",
                            log_level="warning", access_log=False, backlog=1024)
    print(f"PORT {sock.getsockname()[1]}", flush=True)  # the parent waits for /healthz before use
    uvicorn.Server(config).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
