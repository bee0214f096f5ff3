"""Every dashboard answer is an HTML page with strict security headers; unknown or malformed ids are 404
pages (never a 500), a bad filter a 400 page, and no page accepts a method that could change state."""

from __future__ import annotations

import base64
import hashlib

import httpx
import pytest

from proxy.ui.style import CSS, SCRIPT
from tests.conftest import BOTH_BACKENDS
from tests.ui.seed import SESSION


def sha(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


@BOTH_BACKENDS
@pytest.mark.parametrize("path", [
    "/sessions/no-such-session", "/sessions/bad%20id%3Cscript%3E", "/exchanges/0123456789abcdef",
    "/exchanges/bad%2F..%2Fid", "/results/call_nope?session=build-1", "/results/call_big",
    "/results/call_big?session=no-such-session", "/results/bad%20handle?session=build-1", "/no/such/page",
])
def test_unknown_ids_are_404_pages(seeded, path):
    response = httpx.get(f"{seeded.proxy.url}/ctxproxy/ui{path}")
    assert response.status_code == 404
    assert response.headers["content-type"].startswith("text/html") and "Not found" in response.text
    assert "<script>" not in response.text.split("<main>")[1].split("</main>")[0]


def test_every_page_carries_a_strict_content_security_policy(seeded):
    for path in ("", "/sessions", f"/sessions/{SESSION}", f"/exchanges/{seeded.summarized}", "/search?q=key",
                 "/pins", "/policies", "/nope"):
        headers = httpx.get(f"{seeded.proxy.url}/ctxproxy/ui{path}").headers
        policy = headers["content-security-policy"]
        assert "default-src 'none'" in policy and "frame-ancestors 'none'" in policy
        assert f"style-src {sha(CSS)};" in policy and f"script-src {sha(SCRIPT)};" in policy  # no 'unsafe-*'
        assert "unsafe" not in policy
        assert headers["x-content-type-options"] == "nosniff" and headers["cache-control"] == "no-store"


def test_a_bad_filter_is_a_400_page(seeded):
    response = httpx.get(f"{seeded.proxy.url}/ctxproxy/ui", params={"since": "last tuesday"})
    assert response.status_code == 400 and "--since" in response.text


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
def test_pages_change_nothing(seeded, method):
    for path in ("", "/sessions", f"/sessions/{SESSION}", "/pins", "/policies"):
        response = httpx.request(method, f"{seeded.proxy.url}/ctxproxy/ui{path}")
        assert response.status_code == 405, (method, path)
