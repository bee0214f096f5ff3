"""The ranked session resolver."""

from __future__ import annotations

import hashlib

import httpx
import orjson

from proxy.session import fingerprint, identify, resolve_session, tenant_of

SYSTEM = {"role": "system", "content": "You are a coding agent."}


def body(*messages, **extra):
    return {"model": "gpt-4o", "messages": list(messages), **extra}


def test_ranking_header_then_metadata_then_agent_header_then_user_then_fingerprint():
    full = body(SYSTEM, {"role": "user", "content": "fix"}, metadata={"session_id": "meta-1"}, user="u-7")
    top = resolve_session({"x-ctxproxy-session": "h-1", "x-session-id": "a"}, full, "t")
    assert (top.id, top.source) == ("h-1", "header")
    assert resolve_session({"x-session-id": "agent-9"}, full, "t").id == "meta-1"
    assert resolve_session({"x-session-id": "agent-9"}, full, "t").source == "metadata"
    no_meta = body(SYSTEM, {"role": "user", "content": "fix"}, user="u-7")
    assert resolve_session({"x-session-id": "agent-9"}, no_meta, "t").source == "agent-header:x-session-id"
    assert resolve_session({}, no_meta, "t").source == "user"
    assert resolve_session({}, body(SYSTEM, {"role": "user", "content": "fix"}), "t").source == "fingerprint"


def test_shared_system_prompt_does_not_collide():
    first = resolve_session({}, body(SYSTEM, {"role": "user", "content": "task A"}), "t")
    second = resolve_session({}, body(SYSTEM, {"role": "user", "content": "task B"}), "t")
    assert first.id != second.id


def test_resent_and_extended_history_keeps_its_session():
    opening = [SYSTEM, {"role": "user", "content": "task A"}]
    later = [*opening, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
    assert fingerprint(opening, "t") == fingerprint(later, "t") == fingerprint(list(opening), "t")


def test_a_resent_opening_is_not_hashed_again_and_a_copy_prints_the_same(monkeypatch):
    import proxy.session as session

    opening = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "task C"}]
    first = fingerprint(opening, "t")
    hashed = []
    sha256 = hashlib.sha256
    monkeypatch.setattr(session.hashlib, "sha256", lambda data: hashed.append(data) or sha256(data))
    assert fingerprint([*opening, {"role": "assistant", "content": "ok"}], "t") == first  # the same objects
    assert hashed == []
    copy = orjson.loads(orjson.dumps(opening))  # equal objects decoded anew: hashed, the same print
    assert fingerprint(copy, "t") == first and len(hashed) == 1
    assert fingerprint(opening, "u") != first  # the tenant is part of the key
    opening[1] = {"role": "user", "content": "task D"}  # another object in the same list: another print
    assert fingerprint(opening, "t") != first


def test_tenants_do_not_share_fingerprints():
    messages = [SYSTEM, {"role": "user", "content": "task A"}]
    assert fingerprint(messages, tenant_of({"authorization": "Bearer a"})) != \
        fingerprint(messages, tenant_of({"authorization": "Bearer b"}))


def test_tenant_is_a_hash_not_the_key():
    tenant = tenant_of({"authorization": "Bearer sk-secret"})
    assert "sk-secret" not in tenant and len(tenant) == 24
    assert tenant_of({}) == "anonymous"
    # An empty credential (curl -H "Authorization: Bearer $UNSET") is no key, not one shared tenant.
    for empty in ({"authorization": "Bearer"}, {"authorization": "Bearer "}, {"authorization": ""},
                  {"api-key": " "}):
        assert tenant_of(empty) == "anonymous"
    assert tenant_of({"authorization": "Bearer "}) != tenant_of({"api-key": "k"}) == tenant_of(
        {"authorization": "Bearer k"})


def test_free_form_client_ids_and_odd_session_headers_are_hashed():
    odd = resolve_session({}, body(SYSTEM, metadata={"session_id": "has spaces / slashes"}), "t")
    assert odd.id.startswith("meta-") and "/" not in odd.id
    header = resolve_session({"x-ctxproxy-session": "../../etc"}, body(SYSTEM), "t")
    assert header.source == "header" and header.id.startswith("header-") and "/" not in header.id
    assert header == resolve_session({"x-ctxproxy-session": "../../etc"}, body(SYSTEM), "t")  # stable


def test_keyless_clients_are_a_tenant_per_session():
    first, first_session = identify({"x-ctxproxy-session": "s-1"}, body(SYSTEM))
    second, _ = identify({"x-ctxproxy-session": "s-2"}, body(SYSTEM))
    assert first.startswith("anon-") and second.startswith("anon-") and first != second
    assert identify({"x-ctxproxy-session": "s-1"}, body(SYSTEM)) == (first, first_session)
    keyed, _ = identify({"authorization": "Bearer k", "x-ctxproxy-session": "s-1"}, body(SYSTEM))
    assert keyed == tenant_of({"authorization": "Bearer k"}) and keyed != first
    # Without any id, the fingerprint decides: a different task, a different keyless tenant.
    task_a = identify({}, body(SYSTEM, {"role": "user", "content": "task A"}))
    task_b = identify({}, body(SYSTEM, {"role": "user", "content": "task B"}))
    assert task_a[0] != task_b[0] and task_a[1].source == "fingerprint"


def test_session_header_and_source_through_the_server(proxy, fake_upstream):
    messages = [SYSTEM, {"role": "user", "content": "task A"}]
    first = httpx.post(f"{proxy.url}/v1/chat/completions", json=body(*messages))
    messages += [{"role": "assistant", "content": "echo: task A"}, {"role": "user", "content": "next"}]
    second = httpx.post(f"{proxy.url}/v1/chat/completions", json=body(*messages))
    assert first.headers["x-ctxproxy-session"] == second.headers["x-ctxproxy-session"]
    odd = httpx.post(f"{proxy.url}/v1/chat/completions", json=body(*messages),
                     headers={"x-ctxproxy-session": "bad id!"})
    assert odd.status_code == 200 and odd.headers["x-ctxproxy-session"].startswith("header-")
