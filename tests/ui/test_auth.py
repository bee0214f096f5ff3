"""Who may open the dashboard: loopback clients only unless admin.allow_remote (and then only with the
admin token); with a token configured every page needs it, as a bearer header or the login cookie,
which carries an HMAC of an expiry keyed by the token and never the token."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from proxy.ui import auth

TOKEN = "s3cret-admin-token"
REMOTE = "203.0.113.9"


def as_client(proxy, host: str, path: str, headers: dict[str, str] | None = None) -> httpx.Response:
    """A request that reaches the app from `host` (a real remote socket is not available in tests)."""
    app = proxy.server.server.config.app

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, client=(host, 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
            return await client.get(path, headers=headers)

    return asyncio.run(go())


@pytest.fixture
def guarded(make_proxy, fake_upstream, monkeypatch):
    monkeypatch.setenv("CTXPROXY_ADMIN", TOKEN)
    return make_proxy({"admin": {"token_env": "CTXPROXY_ADMIN"}})


def test_loopback_only_without_allow_remote(proxy):
    assert httpx.get(f"{proxy.url}/ctxproxy/ui").status_code == 200  # no token: loopback may look
    refused = as_client(proxy, REMOTE, "/ctxproxy/ui/sessions")
    assert refused.status_code == 403 and "loopback" in refused.text
    assert as_client(proxy, "127.0.0.1", "/ctxproxy/ui/sessions").status_code == 200


def test_remote_clients_need_allow_remote_and_the_token(make_proxy, fake_upstream, monkeypatch):
    open_to_all = make_proxy({"admin": {"allow_remote": True}})
    assert as_client(open_to_all, REMOTE, "/ctxproxy/ui").status_code == 403  # no token: never remote
    monkeypatch.setenv("CTXPROXY_ADMIN", TOKEN)
    remote = make_proxy({"admin": {"token_env": "CTXPROXY_ADMIN", "allow_remote": True}, "data_dir": "data2"})
    assert as_client(remote, REMOTE, "/ctxproxy/ui").status_code == 401
    ok = as_client(remote, REMOTE, "/ctxproxy/ui", {"authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200 and "Overview" in ok.text


def test_token_login_sets_a_signed_cookie_never_the_token(guarded):
    ui = f"{guarded.url}/ctxproxy/ui"
    asked = httpx.get(f"{ui}/sessions?policy=w16k")
    assert asked.status_code == 401 and 'name="token"' in asked.text and "<table" not in asked.text
    assert 'value="/ctxproxy/ui/sessions?policy=w16k"' in asked.text  # back where the user was going
    wrong = httpx.post(f"{ui}/login", data={"token": "nope", "next": "/ctxproxy/ui/sessions"})
    assert wrong.status_code == 401 and "Wrong token" in wrong.text and not wrong.cookies
    signed = httpx.post(f"{ui}/login", data={"token": TOKEN, "next": "/ctxproxy/ui/sessions?policy=w16k"})
    assert signed.status_code == 303 and signed.headers["location"] == "/ctxproxy/ui/sessions?policy=w16k"
    cookie = signed.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    assert "Path=/ctxproxy/ui" in cookie and TOKEN not in cookie
    value = signed.cookies[auth.COOKIE]
    assert auth.cookie_valid(TOKEN, value) and not auth.cookie_valid("another-token", value)
    page = httpx.get(f"{ui}/sessions", cookies={auth.COOKIE: value})
    assert page.status_code == 200 and "Sign out" in page.text
    out = httpx.post(f"{ui}/logout", cookies={auth.COOKIE: value})
    assert out.status_code == 303 and f'{auth.COOKIE}=""' in out.headers["set-cookie"]


def test_forged_expired_and_foreign_cookies_are_refused(guarded):
    ui = f"{guarded.url}/ctxproxy/ui"
    now = time.time()
    expiry = int(now) + 3600
    for value in (f"{expiry}.{'0' * 64}", auth.cookie_value(TOKEN, now - 2 * auth.LIFETIME_S),
                  auth.cookie_value("other-token"), TOKEN, "", "..", f"{expiry}"):
        assert httpx.get(ui, cookies={auth.COOKIE: value}).status_code == 401, value
    assert httpx.get(ui, cookies={auth.COOKIE: auth.cookie_value(TOKEN)}).status_code == 200
    assert httpx.get(ui, headers={"authorization": f"Bearer {TOKEN}"}).status_code == 200
    assert httpx.get(ui, headers={"authorization": "Bearer wrong"}).status_code == 401


@pytest.mark.parametrize("target", ["//evil.example/x", "https://evil.example/", "/ctxproxy/uix",
                                    "/elsewhere", "/ctxproxy/ui\\\\evil"])
def test_login_goes_back_only_into_the_dashboard(guarded, target):
    signed = httpx.post(f"{guarded.url}/ctxproxy/ui/login", data={"token": TOKEN, "next": target})
    assert signed.status_code == 303 and signed.headers["location"] == "/ctxproxy/ui"
