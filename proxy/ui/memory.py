"""A session's memory blocks as they stand in the archive, rendered as the prompt would carry them: the
auto-summary, working memory, folded memory, and the pinned block its policy and pins make."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import orjson

from proxy.errors import CtxProxyError
from proxy.layers.folded import FoldedMemory
from proxy.layers.folded import render as render_folded
from proxy.layers.working_memory import WorkingMemory
from proxy.pins import file_pins
from proxy.pins import render as render_pins
from proxy.ui.page import esc, pre

if TYPE_CHECKING:
    from proxy.app import ProxyState

log = logging.getLogger("ctxproxy.ui")


def _box(title: str, text: str | None, ident: str, note: str = "") -> str:
    shown = pre(text, ident=ident) if text else '<p class="muted">empty</p>'
    noted = f'<p class="note">{esc(note)}</p>' if note else ""
    return f'<div class="box"><h3>{esc(title)}</h3>{shown}{noted}</div>'


def _working(state: ProxyState, tenant: str, session_id: str) -> str | None:
    row = state.reader.session_memory(tenant, session_id, "working")
    if not row:
        return None
    try:
        saved = orjson.loads(row["data"])
        return WorkingMemory.from_dict(saved.get("memory") if isinstance(saved, dict) else None).render()
    except orjson.JSONDecodeError:
        return str(row["data"])


def _pinned(state: ProxyState, tenant: str, session_id: str, policy: str) -> tuple[str | None, str]:
    try:
        loaded = state.policies.get(policy)
        pins = file_pins(loaded, state.tokens) + state.pins.list(loaded.name, tenant, session_id)
    except CtxProxyError as exc:  # a pinned file gone missing, a policy since removed
        return None, exc.message
    return render_pins(pins) or None, ""


def blocks(state: ProxyState, tenant: str, session_id: str, policy: str) -> str:
    reader = state.reader
    window = reader.session_window(tenant, session_id)
    summary = window.get("block") if window else None
    note = f"updated {window['updated_at']}; cut at message {window['cut']}" if window else ""
    folded_row = reader.session_memory(tenant, session_id, "folded")
    folded = render_folded(FoldedMemory.from_json(folded_row["data"])) if folded_row else None
    pinned, problem = _pinned(state, tenant, session_id, policy)
    return ('<div class="boxes" id="memory">'
            + _box("Auto-summary (evicted exchanges)", summary, "auto-summary", note)
            + _box("Working memory", _working(state, tenant, session_id), "working-memory")
            + _box("Folded memory", folded, "folded-memory")
            + _box(f"Pinned (policy {policy})", pinned, "pinned", problem)
            + "</div>")
