"""Refusal checkpoints: a redacted snapshot of the conversation for audit and decomposition."""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from proxy import secrets

CHECKPOINT_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# What a redacted checkpoint leaves out: tool bodies and tool-call arguments whole, and secret-looking
# values (API keys, tokens, passwords, private keys; see proxy/secrets.py) in every other text.
REDACTION_POLICY = ["tool.content", "assistant.tool_calls.function.arguments", secrets.POLICY_ENTRY]


def _size(value: Any) -> int:
    return len(value) if isinstance(value, str) else len(orjson.dumps(value))


def redact(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool bodies and tool-call arguments become `[redacted: N chars]`; the structure stays.

    Every other string of a message (system, user and assistant content, text parts, names, refusals)
    keeps its text minus secret-looking values, which become `[redacted secret]`.
    """
    out = []
    for message in messages:
        copy = dict(message)
        if copy.get("role") == "tool" and copy.get("content") is not None:
            copy["content"] = f"[redacted: {_size(copy['content'])} chars]"
        if copy.get("tool_calls"):
            calls = []
            for call in copy["tool_calls"]:
                call = dict(call) if isinstance(call, dict) else call
                if isinstance(call, dict) and isinstance(call.get("function"), dict):
                    function = dict(call["function"])
                    function["arguments"] = f"[redacted: {_size(function.get('arguments') or '')} chars]"
                    call["function"] = function
                calls.append(call)
            copy["tool_calls"] = calls
        out.append(secrets.scrub_value(copy))
    return out


def write_checkpoint(folder: Path, checkpoint_id: str, *, model: str, estimated_tokens: int,
                     max_input_tokens: int, messages: list[dict[str, Any]], redact_secrets: bool) -> Path:
    if not CHECKPOINT_ID.match(checkpoint_id):
        raise ValueError(f"invalid checkpoint id {checkpoint_id!r}")
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    document = {
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "call_id": checkpoint_id,
        "model": model,
        "estimated_tokens": estimated_tokens,
        "max_input_tokens": max_input_tokens,
        "redaction_policy": REDACTION_POLICY if redact_secrets else [],
        "redacted": redact_secrets,
        "messages": redact(messages) if redact_secrets else messages,
    }
    path = folder / f"{checkpoint_id}.json"
    # O_CREAT with 0600 covers a new file; the chmod repairs the mode of one that already existed.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(orjson.dumps(document, option=orjson.OPT_INDENT_2))
    os.chmod(path, 0o600)
    return path
