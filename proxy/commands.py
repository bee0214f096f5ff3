"""Slash commands in the last user message, answered by the proxy without calling the model.

Read-only commands (/recall, /pins) are on while `commands.enabled`. Commands that change state
(/pin, /remember, /unpin) are off unless the policy sets `commands.pins` to `session` or `project`:
while off they are not intercepted at all, and the message reaches the model unchanged, as if the
proxy were not there. Pins made here belong to the API key (tenant) that sent them: to its current
session under `session`, to the whole project under `project`. They never become project-wide for
every key (that is the CLI's and the admin API's job), and /unpin removes only the key's own pins.
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

import orjson

from proxy.internal_tools import format_hits
from proxy.pins import PinStore
from proxy.policy import CommandsPolicy, LoadedPolicy
from proxy.session import is_keyless
from proxy.store.storage import ArchiveQueries

COMMAND = re.compile(r"^\s*/(recall|pin|unpin|remember|pins)(?:\s+(\S.*))?\s*$", re.DOTALL)
READ_ONLY = frozenset({"recall", "pins"})
CHANGES_PINS = frozenset({"pin", "remember", "unpin"})


def active(name: str, settings: CommandsPolicy) -> bool:
    """Whether the policy lets the proxy answer the command `name`."""
    if not settings.enabled:
        return False
    return name in READ_ONLY or (name in CHANGES_PINS and settings.pins != "off")


def parse(body: dict[str, Any], settings: CommandsPolicy) -> tuple[str, str] | None:
    """(command, argument) when the last message is a user message starting with a slash command that
    the policy turns on; None otherwise (the request then goes to the model unchanged)."""
    last = body["messages"][-1]
    if last.get("role") != "user":
        return None
    content = last.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if not isinstance(content, str):
        return None
    match = COMMAND.match(content)
    if not match or not active(match.group(1), settings):
        return None
    return match.group(1), (match.group(2) or "").strip()


def run(name: str, argument: str, reader: ArchiveQueries, pins: PinStore, policy: LoadedPolicy, tenant: str,
        session_id: str) -> str:
    """The text of the answer. Pins made here belong to this tenant, in this session or the project."""
    scope = policy.policy.commands.pins
    pin_session = session_id if scope == "session" else None
    if name == "recall":
        if not argument:
            return "usage: /recall QUERY"
        hits = reader.recall(tenant, session_id, policy.name, argument, policy.policy.window.recall_results)
        return format_hits(argument, hits, session_id, 1 << 20)
    if name in ("pin", "remember"):
        if not argument:
            return f"usage: /{name} TEXT"
        pin = pins.add(policy, argument, name="remembered" if name == "remember" else "pinned",
                       tenant=tenant, session_id=pin_session)
        # A keyless client is a tenant per session, so its project pins stay in this conversation too.
        alone = pin_session or is_keyless(tenant)
        where = "this conversation" if alone else "this project's conversations with this API key"
        return f"Pinned as {pin.id} ({pin.tokens} tokens); it is shown in every request of {where}."
    if name == "unpin":
        pins.remove(policy.name, argument, tenant, pin_session)
        return f"Unpinned {argument}."
    listed = pins.list(policy.name, tenant, session_id)
    return "\n".join(f"{p.id}  {p.name}  {p.tokens} tokens: {p.content[:80]}" for p in listed) or "No pins."


def completion(text: str, model: str) -> bytes:
    """An OpenAI chat.completion carrying `text` as the assistant's answer."""
    return orjson.dumps({
        "id": f"chatcmpl-ctxproxy-{uuid.uuid4().hex[:24]}", "object": "chat.completion",
        "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    })


def completion_chunks(text: str, model: str) -> list[bytes]:
    """The same answer as a stream: role, content, finish, [DONE]."""
    base = {"id": f"chatcmpl-ctxproxy-{uuid.uuid4().hex[:24]}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": model}
    deltas = [({"role": "assistant", "content": ""}, None), ({"content": text}, None), ({}, "stop")]
    chunks = [b"data: " + orjson.dumps(base | {"choices": [{"index": 0, "delta": d, "finish_reason": f}]})
              + b"\n\n" for d, f in deltas]
    return [*chunks, b"data: [DONE]\n\n"]
