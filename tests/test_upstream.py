"""The upstream leg (proxy/upstream.py): what goes to the provider besides the body."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from proxy.upstream import ClientDisconnected, env_proxy, tls_context, unless_disconnected
from tests.servers import FakeUpstream, ServerThread, Step

BODY = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}


def test_a_cookie_the_upstream_sets_never_rides_along_with_a_later_call(make_proxy, upstream_server,
                                                                      fake_upstream):
    # By name: a cookie jar keeps no cookies of a bare IP address, so 127.0.0.1 would prove nothing.
    port = upstream_server[1].url.rsplit(":", 1)[1]
    proxy = make_proxy({"upstream": {"base_url": f"http://localhost:{port}/v1"}})
    fake_upstream.then(Step(content="hello", headers={"set-cookie": "__cf_bm=tenant-a; Path=/; HttpOnly"}))
    with httpx.Client(base_url=proxy.url, timeout=30) as client:
        for key in ("sk-tenant-a", "sk-tenant-b"):
            auth = {"authorization": f"Bearer {key}"}
            answer = client.post("/v1/chat/completions", json=BODY, headers=auth)
            assert answer.status_code == 200
    assert "cookie" not in {name.lower() for name in fake_upstream.chat_requests[-1].headers}


def test_the_proxy_environment_is_read_for_the_upstream_host(monkeypatch):
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY", "https_proxy", "http_proxy",
                 "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert env_proxy("https://api.openai.com/v1") is None
    monkeypatch.setenv("HTTPS_PROXY", "http://corp-proxy:3128")
    monkeypatch.setenv("HTTP_PROXY", "http://plain-proxy:8080")
    assert env_proxy("https://api.openai.com/v1") == "http://corp-proxy:3128"
    assert env_proxy("http://vllm.internal:8000/v1") == "http://plain-proxy:8080"
    monkeypatch.setenv("NO_PROXY", "vllm.internal,localhost")
    assert env_proxy("http://vllm.internal:8000/v1") is None
    assert env_proxy("https://api.openai.com/v1") == "http://corp-proxy:3128"


def test_calls_go_through_the_proxy_the_environment_names(make_proxy, upstream_server, fake_upstream,
                                                          monkeypatch):
    """HTTP_PROXY names the scripted upstream; the configured host does not even resolve: the call can
    only arrive through the proxy (an absolute-form request line to it)."""
    for name in ("NO_PROXY", "no_proxy", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", upstream_server[1].url)
    proxy = make_proxy({"upstream": {"base_url": "http://upstream.invalid/v1"}})
    with httpx.Client(trust_env=False, timeout=30) as client:  # (the test's own client goes direct)
        response = client.post(f"{proxy.url}/v1/chat/completions", json=BODY)
    assert response.status_code == 200 and response.headers["x-ctxproxy-gate"] == "pass"
    assert fake_upstream.chat_requests[-1].headers.get("host") == "upstream.invalid"


def self_signed(folder) -> tuple[str, str]:
    """A certificate for 127.0.0.1 that no CA signed, and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ctxproxy test upstream")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / "upstream.pem", folder / "upstream.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)


@pytest.fixture
def fresh_trust_store():
    tls_context.cache_clear()
    yield
    tls_context.cache_clear()


def test_a_plain_http_upstream_never_loads_the_trust_store(make_proxy, fresh_trust_store):
    # (a local model server: its first request does not wait ~0.1 s for certifi's bundle)
    answer = httpx.post(f"{make_proxy().url}/v1/chat/completions", json=BODY, timeout=30)
    assert answer.status_code == 200 and answer.json()["object"] == "chat.completion"
    assert tls_context.cache_info().currsize == 0


def test_the_provider_certificate_is_verified(make_proxy, tmp_path, monkeypatch, fresh_trust_store):
    cert, key = self_signed(tmp_path)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    with ServerThread(FakeUpstream().app, certfile=cert, keyfile=key) as tls:
        config = {"upstream": {"base_url": f"{tls.url}/v1"}}
        refused = httpx.post(f"{make_proxy(config).url}/v1/chat/completions", json=BODY, timeout=30)
        assert tls_context.cache_info().currsize == 1  # an https upstream: our trust store
        assert refused.status_code == 502
        assert "CERTIFICATE_VERIFY_FAILED" in refused.json()["error"]["message"]
        monkeypatch.setenv("SSL_CERT_FILE", cert)  # the operator trusts it (a corporate CA, a local server)
        tls_context.cache_clear()
        second = make_proxy(config | {"data_dir": str(tmp_path / "second")})
        trusted = httpx.post(f"{second.url}/v1/chat/completions", json=BODY, timeout=30)
        assert trusted.status_code == 200 and trusted.json()["object"] == "chat.completion"


# ----------------------------------------------------------------------- the client leaving meanwhile

class Leaving:
    """An ASGI `receive` that says disconnect once the test lets the client go."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()

    async def receive(self) -> dict[str, str]:
        await self.gone.wait()
        return {"type": "http.disconnect"}


def test_work_done_before_the_client_leaves_is_returned() -> None:
    async def run() -> str:
        client = Leaving()

        async def work() -> str:
            await asyncio.sleep(0)
            return "answer"
        result = await unless_disconnected(work(), client.receive)
        client.gone.set()  # (after the fact: nothing may be cancelled by it now)
        await asyncio.sleep(0)
        assert not asyncio.current_task().cancelling()  # type: ignore[union-attr]
        return result

    assert asyncio.run(run()) == "answer"


def test_the_client_leaving_cancels_the_work_and_says_so() -> None:
    cancelled: list[bool] = []

    async def run() -> None:
        client = Leaving()

        async def work() -> str:
            client.gone.set()  # the client goes while the upstream is still to answer
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append(True)
                raise
            return "never"
        with pytest.raises(ClientDisconnected):
            await asyncio.wait_for(unless_disconnected(work(), client.receive), 30)  # (a guard only)
        assert not asyncio.current_task().cancelling()  # type: ignore[union-attr]

    asyncio.run(run())
    assert cancelled == [True]


def test_a_cancel_from_elsewhere_is_not_taken_for_the_client_leaving() -> None:
    async def run() -> None:
        started = asyncio.Event()

        async def work() -> None:
            started.set()
            await asyncio.Event().wait()
        task = asyncio.ensure_future(unless_disconnected(work(), Leaving().receive))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
