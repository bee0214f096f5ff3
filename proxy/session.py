"""Who is this conversation? A ranked resolver that also says which source decided."""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

SESSION_HEADER = "x-ctxproxy-session"
# Headers that agents already send to name their conversation, in order of trust.
AGENT_SESSION_HEADERS = (
    "x-session-id",
    "session_id",
    "session-id",
    "conversation_id",
    "x-conversation-id",
    "x-claude-code-session-id",
    "x-opencode-session",
)
SESSION_ID = re.compile(r"^[A-Za-z0-9_.:@-]{1,128}$")
CLAUDE_CODE_SESSION = re.compile(r"_session_([0-9a-fA-F-]{8,64})$")


@dataclass(frozen=True)
class Session:
    id: str
    source: str  # header | metadata | agent-header:<name> | user | fingerprint


ANONYMOUS = "anonymous"  # what tenant_of says for a keyless client, before its session is known
KEYLESS_PREFIX = "anon-"


def tenant_of(headers: Mapping[str, str]) -> str:
    """A stable, non-reversible tenant id from the client's API key ("anonymous" without one).

    For a keyless client this is only the input of the fingerprint; its real tenant comes from
    `identify`, once the session is known.
    """
    for name in ("authorization", "api-key", "x-api-key"):
        key = (headers.get(name) or "").removeprefix("Bearer ").strip()
        # An empty credential (`Authorization: Bearer $UNSET_VARIABLE`) is no key: keyless, not shared.
        if key and key.lower() != "bearer":
            return _key_tenant(key)
    return ANONYMOUS


@functools.lru_cache(maxsize=1024)  # a client sends the same key every request: hashed once
def _key_tenant(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:24]


def keyless_tenant(session_id: str) -> str:
    """The tenant of a keyless client: one per session, so keyless clients never share data."""
    return KEYLESS_PREFIX + hashlib.sha256(b"keyless\0" + session_id.encode()).hexdigest()[:24]


def is_keyless(tenant: str) -> bool:
    return tenant.startswith(KEYLESS_PREFIX)


def identify(headers: Mapping[str, str], body: dict[str, Any]) -> tuple[str, Session]:
    """(tenant, session) of a chat request. Everything the proxy stores is scoped by the tenant.

    The rule: a client that sends an API key is the tenant of that key (a hash of it): its sessions
    share stored tool results (`read_tool_result`), recall hits and runtime pins within a project.
    A client without a key is a tenant of its own per session (`anon-` + a hash of the session id):
    keyless clients never read each other's stored results or recall hits, and a keyless session
    shares nothing with any other session. For keyless clients the session id is therefore the only
    thing that tells them apart: two keyless clients that name the same session (the same
    x-ctxproxy-session value, or the same conversation opening when fingerprinted) are one tenant.
    Fingerprints stay distinct per keyed tenant (the key's tenant is hashed into them).
    """
    tenant = tenant_of(headers)
    session = resolve_session(headers, body, tenant)
    return (keyless_tenant(session.id) if tenant == ANONYMOUS else tenant), session


def _clean(value: Any, source: str) -> str:
    text = str(value).strip()
    if SESSION_ID.match(text):
        return text
    # Free-form client ids (spaces, long strings) are hashed rather than rejected.
    return f"{source}-" + hashlib.sha256(text.encode()).hexdigest()[:24]


def resolve_session(headers: Mapping[str, str], body: dict[str, Any], tenant: str) -> Session:
    explicit = headers.get(SESSION_HEADER)
    if explicit is not None and explicit.strip():
        # Any value is accepted; one that is not a plain id is hashed like the other sources.
        return Session(_clean(explicit, "header"), "header")
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and metadata.get("session_id"):
        return Session(_clean(metadata["session_id"], "meta"), "metadata")
    user_id = metadata.get("user_id") if isinstance(metadata, dict) else None
    in_user_id = CLAUDE_CODE_SESSION.search(user_id) if isinstance(user_id, str) else None
    if in_user_id:  # Claude Code: user_<hash>_account_<uuid>_session_<uuid>
        return Session(_clean(in_user_id.group(1), "meta"), "metadata")
    for name in AGENT_SESSION_HEADERS:
        value = headers.get(name)
        if value:
            return Session(_clean(value, "agent"), f"agent-header:{name}")
    if isinstance(body.get("user"), str) and body["user"].strip():
        return Session(_clean(body["user"], "user"), "user")
    if isinstance(user_id, str) and user_id.strip():  # Anthropic's metadata.user_id names the end user
        return Session(_clean(user_id, "user"), "user")
    return Session(fingerprint(body.get("messages") or [], tenant), "fingerprint")


def fingerprint(messages: list[Any], tenant: str) -> str:
    """Hash of the conversation's opening: every leading system message plus the first other message.

    The first user message (the task) is part of it, so two conversations that share a system prompt
    get different sessions, while a resent or extended history keeps the same opening and the same id.
    """
    opening: list[Any] = []
    for message in messages:
        opening.append(message)
        if not (isinstance(message, dict) and message.get("role") in ("system", "developer")):
            break
    # A resent history's opening is the very objects of the earlier body (wire/resent.py): its print is
    # looked up, not serialized and hashed again (the entry holds them, so their ids stay theirs).
    key = (tenant, *map(id, opening))
    known = _prints.get(key)
    if known is not None and all(a is b for a, b in zip(known[0], opening, strict=True)):
        return known[1]
    digest = hashlib.sha256(tenant.encode() + b"\0" + orjson.dumps(opening, option=orjson.OPT_SORT_KEYS))
    found = "fp-" + digest.hexdigest()[:24]
    if len(_prints) >= PRINTS_KEPT:
        _prints.clear()
    _prints[key] = (opening, found)
    return found


# Sessions whose opening's print is remembered. An entry keeps its opening alive (a system prompt and a
# task, ~10 KB for mini-swe-agent) after its session ends: bounded low, a miss only hashes again.
PRINTS_KEPT = 512
_prints: dict[tuple[Any, ...], tuple[list[Any], str]] = {}
