"""Who is this conversation? A ranked resolver that also says which source decided."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.errors import BadRequest

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


@dataclass(frozen=True)
class Session:
    id: str
    source: str  # header | metadata | agent-header:<name> | user | fingerprint


def tenant_of(headers: Mapping[str, str]) -> str:
    """A stable, non-reversible tenant id from the client's API key ("anonymous" without one)."""
    key = headers.get("authorization") or headers.get("api-key") or headers.get("x-api-key")
    if not key:
        return "anonymous"
    return hashlib.sha256(key.removeprefix("Bearer ").strip().encode()).hexdigest()[:24]


def _clean(value: Any, source: str) -> str:
    text = str(value).strip()
    if SESSION_ID.match(text):
        return text
    # Free-form client ids (spaces, long strings) are hashed rather than rejected.
    return f"{source}-" + hashlib.sha256(text.encode()).hexdigest()[:24]


def resolve_session(headers: Mapping[str, str], body: dict[str, Any], tenant: str) -> Session:
    explicit = headers.get(SESSION_HEADER)
    if explicit is not None:
        if not SESSION_ID.match(explicit):
            raise BadRequest(f"invalid {SESSION_HEADER} header: use 1-128 of A-Z a-z 0-9 _ . : @ -",
                             code="invalid_session", param=SESSION_HEADER)
        return Session(explicit, "header")
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and metadata.get("session_id"):
        return Session(_clean(metadata["session_id"], "meta"), "metadata")
    for name in AGENT_SESSION_HEADERS:
        value = headers.get(name)
        if value:
            return Session(_clean(value, "agent"), f"agent-header:{name}")
    if isinstance(body.get("user"), str) and body["user"].strip():
        return Session(_clean(body["user"], "user"), "user")
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
    digest = hashlib.sha256(tenant.encode() + b"\0" + orjson.dumps(opening, option=orjson.OPT_SORT_KEYS))
    return "fp-" + digest.hexdigest()[:24]
