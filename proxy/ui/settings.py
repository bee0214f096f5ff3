"""Read-only views of the configuration that shapes prompts: pins per project, and each policy's
effective settings (its file merged over the defaults)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import yaml

from proxy.errors import CtxProxyError
from proxy.pins import Pin, file_pins
from proxy.ui.page import Column, Page, esc, pre, table

if TYPE_CHECKING:
    from proxy.app import ProxyState

ORIGINS = {"curated": "project (CLI / admin API / pinned.files)", "chat-project": "/pin, this API key",
           "chat-session": "/pin, one session"}


def pins(state: ProxyState, path: Mapping[str, str], query: Mapping[str, str]) -> Page:
    columns = [Column("Id", "id"), Column("Name", "name"), Column("Origin", "origin"),
               Column("Tokens", "tokens", "count"), Column("Content", "content_html", "html")]
    sections = []
    for name in state.policies.names():
        try:
            loaded = state.policies.get(name)
            found: list[Pin] = file_pins(loaded, state.tokens) + state.pins.list(loaded.name)
            budget = loaded.policy.pinned.max_tokens
        except CtxProxyError as exc:
            sections.append(f'<h2>{esc(name)}</h2><p class="problem">{esc(exc.message)}</p>')
            continue
        rows = [{"id": p.id, "name": p.name, "origin": ORIGINS.get(p.origin, p.origin), "tokens": p.tokens,
                 "content_html": pre(p.content)} for p in found]
        used = sum(p.tokens for p in found)
        sections.append(f'<h2>{esc(name)} <span class="muted">{used:,} of {budget:,} pinned tokens'
                        " (files and project pins; pins /pin made for one key or session count toward "
                        "theirs)</span></h2>"
                        + table(columns, rows, ident=f"pins-{name}", empty="no pins"))
    note = ('<p class="note">Read-only. Pin with <code>ctxproxy pin</code>, the admin API '
            "(<code>POST /ctxproxy/pins</code>) or <code>/pin</code> in a chat when the policy allows "
            "it.</p>")
    return Page("Pins", note + "".join(sections), section="Pins")


def policies(state: ProxyState, path: Mapping[str, str], query: Mapping[str, str]) -> Page:
    sections = []
    for name in state.policies.names():
        try:
            loaded = state.policies.get(name)
        except CtxProxyError as exc:
            sections.append(f'<h2>{esc(name)}</h2><p class="problem">{esc(exc.message)}</p>')
            continue
        settings = yaml.safe_dump(loaded.policy.model_dump(mode="json"), sort_keys=False, allow_unicode=True)
        source = str(loaded.path) if loaded.path else "built in"
        title = f'{esc(name)} <span class="muted">{esc(source)}</span>'
        sections.append(f'<h2 id="policy-{esc(name)}">{title}</h2>' + pre(settings))
    folder = state.policies.folder
    head = (f'<p class="note">Effective settings (defaults filled in) of every policy in {esc(folder)}; '
            "select one with <code>/p/&lt;policy&gt;/v1</code> or the <code>x-ctxproxy-policy</code> "
            "header.</p>")
    return Page("Policies", head + "".join(sections), section="Policies")
