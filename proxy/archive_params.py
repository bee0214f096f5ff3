"""What the archive keeps of a request besides its messages: `request_params`, the body minus every field,
at any depth, whose name says it could carry a credential (api_key, extra_headers.Authorization, ...)."""

from __future__ import annotations

import functools
import re
import threading
from collections import OrderedDict
from typing import Any

import orjson

from proxy.archive_codec import loads

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_SECRET_KEY = re.compile(
    r"(?:^|_)(?:api_?key|apikey|x_api_key|authorization|auth|bearer|password|passwd|passphrase|"
    r"secrets?|cookies?|token|credentials?|private_?key|signature)$")
SECRET_FIELDS = frozenset({"api_key", "apikey", "authorization", "api-key", "x-api-key"})  # (compat)


@functools.lru_cache(maxsize=8192)
def _secret_name(key: str) -> bool:
    normalized = _CAMEL.sub("_", key).lower().replace("-", "_").replace(".", "_").strip("_")
    return bool(_SECRET_KEY.search(normalized))


def is_secret_key(key: Any) -> bool:
    """Does a field name look like it holds a credential (api_key, extra_headers.Authorization, ...)?

    Plural counts such as max_tokens are not secrets; token, access_token and X-Api-Key are.
    """
    return isinstance(key, str) and _secret_name(key)


_SCHEMA_NAMES = frozenset({"properties", "patternProperties", "$defs", "definitions"})


def _without_secrets(value: Any, names: bool = False) -> Any:
    """`value` minus secret-named fields at any depth; parts without any are shared, not copied. Under a
    JSON schema's `properties` (tools, response_format) keys are parameter names, not credentials."""
    if isinstance(value, dict):
        cleaned, changed = {}, False
        for k, v in value.items():
            if not names and is_secret_key(k):
                changed = True
                continue
            kept = _without_secrets(v, not names and k in _SCHEMA_NAMES) if isinstance(v, dict | list) else v
            cleaned[k] = kept
            changed = changed or kept is not v
        return cleaned if changed else value
    if isinstance(value, list):
        items = [_without_secrets(v) if isinstance(v, dict | list) else v for v in value]
        return items if any(a is not b for a, b in zip(items, value, strict=True)) else value
    return value


_CACHE_JSON_BYTES = 256 * 1024


@functools.lru_cache(maxsize=128)
def _holds_secrets(dumped: bytes) -> bool:
    value = loads(dumped)
    return _without_secrets(value) is not value


class _ByIdentity:
    """What values were cleaned to, by identity (each value held, so its id stays its own), within a budget
    of their serialized bytes (their parse holds 1-4 times that), the oldest leaving first."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes, self.size = budget_bytes, 0
        self._entries: OrderedDict[int, tuple[Any, Any, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, value: Any) -> Any | None:
        found = self._entries.get(id(value))
        return found[1] if found is not None and found[0] is value else None

    def put(self, value: Any, cleaned: Any, size: int) -> None:
        with self._lock:
            gone = self._entries.pop(id(value), None)
            self._entries[id(value)] = (value, cleaned, size)
            self.size += size - (gone[2] if gone is not None else 0)
            while self.size > self.budget_bytes:
                self.size -= self._entries.popitem(last=False)[1][2]


# A resent body's large values (Claude Code's tools: ~15 KB a turn) are the earlier parse's very objects
# (wire/resent.py): what they were cleaned to is remembered by identity, sparing their serialization.
_SAME_OBJECT_BYTES = 4096  # values serializing to at least this many bytes (up to _CACHE_JSON_BYTES)
_CLEANED = _ByIdentity(2 * 1024 * 1024)


def _clean(value: Any) -> Any:
    # Agents resend the same tools every turn: the verdict for identical JSON is remembered.
    known = _CLEANED.get(value)
    if known is not None:
        return known
    try:
        dumped = orjson.dumps(value)
    except TypeError:
        return _without_secrets(value)
    size = len(dumped)
    cleaned = value if size <= _CACHE_JSON_BYTES and not _holds_secrets(dumped) else _without_secrets(value)
    if _SAME_OBJECT_BYTES <= size <= _CACHE_JSON_BYTES:
        _CLEANED.put(value, cleaned, size)
    return cleaned


def same_params(one: dict[str, Any] | None, other: dict[str, Any]) -> bool:
    """Whether two params dicts hold the very same values under the same keys, in order (nothing edits
    parsed values in place: the same objects are the same JSON)."""
    return one is not None and len(one) == len(other) and all(
        a == b and one[a] is other[b] for a, b in zip(one, other, strict=True))


def request_params(body: dict[str, Any]) -> dict[str, Any]:
    """Everything of a request but its messages, minus any field at any depth that could carry a
    credential. A new dict; the body is never changed (nested parts without secrets are shared)."""
    return {k: _clean(v) if isinstance(v, dict | list) else v
            for k, v in body.items() if k != "messages" and not is_secret_key(k)}
