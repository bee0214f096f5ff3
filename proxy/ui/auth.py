"""Who may see the dashboard. It shows the whole archive, so it is safe by default:

- loopback clients only, unless `admin.allow_remote` — and a remote client always needs the admin token
  (allow_remote without a token would publish every conversation);
- with an admin token configured (`admin.token_env`), every page needs it: `Authorization: Bearer <token>`,
  or the cookie the login form sets. The cookie holds an expiry and an HMAC of it keyed by the token, never
  the token, so it stops working when the token changes; it is HttpOnly and SameSite=Strict (no other site
  can make a browser send it, so the read-only pages need no CSRF token).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from proxy.routes import LOOPBACK
from proxy.ui.page import PREFIX, Page, esc, problem, respond

if TYPE_CHECKING:
    from proxy.app import ProxyState

COOKIE = "ctxproxy_ui"
LIFETIME_S = 12 * 3600
MAX_FORM_BYTES = 4096


def signature(token: str, expires: int) -> str:
    return hmac.new(token.encode(), f"ctxproxy-ui|{expires}".encode(), hashlib.sha256).hexdigest()


def cookie_value(token: str, now: float | None = None) -> str:
    expires = int(now if now is not None else time.time()) + LIFETIME_S
    return f"{expires}.{signature(token, expires)}"


def cookie_valid(token: str, value: str | None, now: float | None = None) -> bool:
    expires, _, mac = (value or "").partition(".")
    if not expires.isdigit() or int(expires) < (now if now is not None else time.time()):
        return False
    return hmac.compare_digest(mac.encode(), signature(token, int(expires)).encode())


def bearer_valid(token: str, request: Request) -> bool:
    scheme, _, offered = request.headers.get("authorization", "").strip().partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(offered.strip().encode(), token.encode())


def access(request: Request) -> tuple[Response | None, bool]:
    """(a refusal, or None to serve the page; whether a login cookie is in use, to offer signing out)."""
    state: ProxyState = request.app.state.proxy
    token = state.config.admin_token()
    client = request.client.host if request.client else ""
    if client not in LOOPBACK:
        if not state.config.admin.allow_remote:
            return respond(problem(403, "Forbidden", "The dashboard answers loopback clients only "
                                   "(admin.allow_remote is off).")), False
        if token is None:
            return respond(problem(403, "Forbidden", "Remote clients need the admin token, and none is set "
                                   "(admin.token_env).")), False
    if token is None:
        return None, False
    if bearer_valid(token, request):
        return None, False
    if cookie_valid(token, request.cookies.get(COOKIE)):
        return None, True
    return login_page(request.url.path + (f"?{request.url.query}" if request.url.query else "")), False


def login_page(next_url: str, failed: bool = False) -> Response:
    message = '<p class="problem">Wrong token.</p>' if failed else ""
    body = (f'{message}<form class="login" method="post" action="{PREFIX}/login">'
            '<label>Admin token <input type="password" name="token" autocomplete="current-password" '
            "autofocus>"
            f'</label><input type="hidden" name="next" value="{esc(safe_next(next_url))}">'
            '<button type="submit">Sign in</button></form>'
            '<p class="note">The token is the value of the environment variable named by admin.token_env. '
            "API clients may send it as <code>Authorization: Bearer &lt;token&gt;</code> instead.</p>")
    return respond(Page("Sign in", body, status=401, headers={"www-authenticate": "Bearer"}))


def safe_next(value: str) -> str:
    """Only a dashboard path: never another host (`//evil`) nor a scheme."""
    if value.startswith(PREFIX) and not value.startswith("//") and "\\" not in value \
            and value[len(PREFIX):len(PREFIX) + 1] in ("", "/", "?"):
        return value
    return PREFIX


async def login(request: Request) -> Response:
    """POST the token: a signed cookie and back to the page asked for, or the form again (401)."""
    state: ProxyState = request.app.state.proxy
    token = state.config.admin_token()
    client = request.client.host if request.client else ""
    if client not in LOOPBACK and not (state.config.admin.allow_remote and token is not None):
        return respond(problem(403, "Forbidden", "The dashboard answers loopback clients only."))
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            return respond(problem(413, "Too large", "The login form is larger than it can be."))
    form = parse_qs(body.decode("utf-8", "replace"))
    offered, next_url = form.get("token", [""])[0], safe_next(form.get("next", [PREFIX])[0])
    if token is None:
        return RedirectResponse(next_url, status_code=303)
    if not hmac.compare_digest(offered.encode(), token.encode()):
        return login_page(next_url, failed=True)
    response = RedirectResponse(next_url, status_code=303)
    response.set_cookie(COOKIE, cookie_value(token), max_age=LIFETIME_S, path=PREFIX, httponly=True,
                        samesite="strict", secure=request.url.scheme == "https")
    return response


async def logout(request: Request) -> Response:
    response = RedirectResponse(PREFIX, status_code=303)
    response.delete_cookie(COOKIE, path=PREFIX, httponly=True, samesite="strict")
    return response
