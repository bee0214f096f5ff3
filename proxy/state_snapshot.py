"""The sticky state of a session that is no decision row, as the ledger carries it between replicas:
what the provider may have cached, what the injected blocks took, when each message first arrived
(headlines show it), and the previous request as sent and as forwarded (accounting's cache estimates)."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

import orjson

from proxy.accounting import unmarked

if TYPE_CHECKING:
    from proxy.session_state import SessionState


class MessageDigest:
    """A message known by its digest (the last one of a request, in a snapshot): equal to any message
    with the same content, which is all the accounting's prefix check asks of it."""

    __hash__ = None  # type: ignore[assignment]

    def __init__(self, hex_digest: str) -> None:
        self.hex = hex_digest

    def __eq__(self, other: object) -> bool:
        return other is self or (not isinstance(other, MessageDigest) and digest(other) == self.hex)

    @staticmethod
    def of(message: Any) -> str:
        return message.hex if isinstance(message, MessageDigest) else digest(message)


def digest(message: Any) -> str:
    return hashlib.sha256(orjson.dumps(message, option=orjson.OPT_SORT_KEYS)).hexdigest()


def snapshot(state: SessionState) -> dict[str, Any]:
    """The sticky state that is no decision row, for the ledger: what the provider may have cached,
    what the blocks took, when each message first arrived (headlines show it; run-length coded), and
    the previous request as sent and as forwarded (accounting's cache estimates; the last message by
    its digest)."""
    runs: list[list[float]] = []
    for at in state.window.first_seen:
        if runs and runs[-1][0] == at:
            runs[-1][1] += 1
        else:
            runs.append([at, 1])
    previous = {name: [prefix[0], MessageDigest.of(unmarked(prefix[1])), prefix[2]] if prefix else None
                for name, prefix in (("last_client", state.last_client),
                                     ("last_forwarded", state.last_forwarded))}
    return {"history_len": state.history_len, "injected_tokens": state.injected_tokens, "first_seen": runs,
            **previous}


def restore(state: SessionState, data: dict[str, Any] | None) -> None:
    if not data:
        return
    state.history_len = int(data.get("history_len", state.history_len))
    state.injected_tokens = int(data.get("injected_tokens", 0))
    for name in ("last_client", "last_forwarded"):
        saved = data.get(name)
        setattr(state, name, (saved[0], MessageDigest(saved[1]), saved[2]) if saved else None)
    runs = data.get("first_seen", [])
    state.window.first_seen = [float(at) for at, count in runs for _ in range(int(count))]
