"""Archive search (the admin search API's query, as a page) and one archived original by its handle."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from proxy.archive_traffic import HANDLE
from proxy.session import SESSION_ID
from proxy.ui.messages import result_url
from proxy.ui.page import NONE, NotFoundPage, Page, esc, link, pairs, pre, seg, url

if TYPE_CHECKING:
    from proxy.app import ProxyState

LIMIT = 50


def _hit(hit: dict[str, Any]) -> str:
    session = str(hit.get("session_id") or "")
    lines = "\n".join(f"{number:>6}  {text}" for number, text in hit.get("lines") or [])
    where = [link(url(f"/sessions/{seg(session)}"), session)] if session else []
    if hit.get("handle") and session:
        where.append(link(result_url(str(hit["handle"]), session), f"open {hit['handle']}"))
    size = f" · {hit['line_count']:,} lines" if hit.get("line_count") else ""
    return (f'<div class="hit"><div class="meta"><b>{esc(hit.get("role"))}</b> · {esc(hit.get("created_at"))}'
            f"{esc(size)} · {' · '.join(where)}</div>{pre(lines or hit.get('snippet') or '')}</div>")


def build(state: ProxyState, path: Mapping[str, str], query: Mapping[str, str]) -> Page:
    text = query.get("q", "").strip()
    session = query.get("session", "").strip()
    form = (f'<form class="filters" method="get" action="{url("/search")}">'
            f'<label>Words<input name="q" value="{esc(text)}" size="40" autofocus></label>'
            f'<label>Session (optional)<input name="session" value="{esc(session)}" size="30"></label>'
            '<button type="submit">Search</button></form>')
    if not text:
        return Page("Search the archive", form + '<p class="muted">Every message clients sent and every '
                    "answer is searchable (the proxy's own texts are not).</p>", section="Search")
    hits = state.reader.search(text, session_id=session or None, limit=LIMIT)
    for hit in hits:
        hit.pop("body", None)  # as the admin API: the lines that match, not whole bodies
    found = "".join(_hit(h) for h in hits) or '<p class="muted">no matches</p>'
    note = '<p class="note">The search ran out of time: there may be more (or better) matches.</p>' \
        if hits.truncated else ""
    return Page("Search the archive", form + f'<p class="muted" id="count">{len(hits)} match(es)</p>{note}'
                f'<div id="hits">{found}</div>', section="Search")


def _original(state: ProxyState, session_id: str, handle: str) -> dict[str, Any] | None:
    """The verbatim text under `handle` in the session: the state store's record (summarized, masked,
    evicted results), else the archived message (read_tool_result answers the same way)."""
    reader = state.reader
    tenants = [r["tenant"] for r in reader.rows(
        "select tenant, max(created_at) as last from exchanges where session_id = ? group by tenant "
        "order by last desc", [session_id])]
    for tenant in tenants:
        stored = reader.rows("select handle, call_id, tool_name, kind, content, replacement, created_at "
                             "from tool_results where tenant = ? and session_id = ? and handle = ?",
                             [tenant, session_id, handle])
        if stored:
            return stored[0]
    for tenant in tenants:
        found = reader.archived_result(tenant, session_id, handle)
        if found is not None:
            return found
    return None


def result(state: ProxyState, path: Mapping[str, str], query: Mapping[str, str]) -> Page:
    handle, session_id = path["handle"], query.get("session", "")
    if not HANDLE.match(handle) or not SESSION_ID.match(session_id):
        raise NotFoundPage("A result is named by its handle and its session (?session=...).")
    found = _original(state, session_id, handle)
    if found is None:
        raise NotFoundPage(f"No archived result {handle!r} in session {session_id!r}.")
    content = str(found.get("content") or "")
    about = pairs([("Session", link(url(f"/sessions/{seg(session_id)}"), session_id)),
                   ("Handle", esc(handle)), ("Call id", esc(found.get("call_id"))),
                   ("Tool", esc(found.get("tool_name") or NONE)),
                   ("Replaced by (latest)", esc(found.get("kind") or "not replaced: an archived message")),
                   ("Size", esc(f"{len(content):,} characters, {content.count(chr(10)) + 1:,} lines"))])
    replacement = found.get("replacement")
    shown = f"<h2>What the model saw instead</h2>{pre(replacement, ident='replacement')}" \
        if replacement else ""
    return Page(f"Original of {handle}", about + "<h2>Original, byte for byte</h2>"
                + pre(content, ident="original") + shown, section="Search")
