"""Routing: each page is a plain function (state, path params, query params) -> Page, run in a worker
thread (archive queries and escaping big texts never hold the event loop), behind the access check."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from proxy.errors import CtxProxyError
from proxy.ui import auth
from proxy.ui.exchange import build as exchange_page
from proxy.ui.overview import build as overview_page
from proxy.ui.page import PREFIX, NotFoundPage, Page, problem, respond
from proxy.ui.search import build as search_page
from proxy.ui.search import result as result_page
from proxy.ui.sessions import listing as sessions_page
from proxy.ui.sessions import one as session_page
from proxy.ui.settings import pins as pins_page
from proxy.ui.settings import policies as policies_page

if TYPE_CHECKING:
    from proxy.app import ProxyState

log = logging.getLogger("ctxproxy.ui")
Builder = Callable[["ProxyState", Mapping[str, str], Mapping[str, str]], Page]


def view(build: Builder) -> Callable[[Request], object]:
    async def endpoint(request: Request) -> Response:
        refused, signed_in = auth.access(request)
        if refused is not None:
            return refused
        state: ProxyState = request.app.state.proxy
        try:
            page = await anyio.to_thread.run_sync(build, state, dict(request.path_params),
                                                  dict(request.query_params))
        except NotFoundPage as exc:
            page = problem(404, "Not found", exc.message)
        except CtxProxyError as exc:  # a bad filter (--since), an unknown policy...
            page = problem(exc.status if exc.status < 500 else 500, "Cannot show this", exc.message)
        except Exception:
            log.exception("dashboard page %s failed", request.url.path)
            page = problem(500, "Internal error", "This page failed; the proxy's log says why.")
        return respond(page, signed_in=signed_in)

    return endpoint


def unknown(state: ProxyState, path: Mapping[str, str], query: Mapping[str, str]) -> Page:
    raise NotFoundPage("There is no such dashboard page.")


def routes() -> list[Route]:
    """The dashboard's routes, for build_app's list (GET only: no page changes anything)."""
    get = ["GET"]
    pages: list[tuple[str, Builder]] = [
        ("", overview_page),
        ("/", overview_page),
        ("/sessions", sessions_page),
        ("/sessions/{session_id}", session_page),
        ("/exchanges/{exchange_id}", exchange_page),
        ("/results/{handle}", result_page),
        ("/search", search_page),
        ("/pins", pins_page),
        ("/policies", policies_page),
    ]
    return [
        *(Route(PREFIX + path, view(build), methods=get) for path, build in pages),
        Route(PREFIX + "/login", auth.login, methods=["POST"]),
        Route(PREFIX + "/logout", auth.logout, methods=["POST"]),
        Route(PREFIX + "/{rest:path}", view(unknown), methods=get),
    ]
