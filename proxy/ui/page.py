"""The dashboard's HTML: one layout, escaping and number formatting, tables, and the security headers.

Everything archived is untrusted (tool output, whatever a client sent): every string that reaches a page
goes through `esc`. The only style and script are the two constants below, allowed by their hashes in the
Content-Security-Policy, so an injected `<script>` or `style=` attribute would not run even if one slipped
through; nothing is loaded from anywhere.
"""

from __future__ import annotations

import base64
import hashlib
import html
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

from starlette.responses import HTMLResponse

from proxy.ui.style import CSS, SCRIPT

PREFIX = "/ctxproxy/ui"
NAV = (("Overview", ""), ("Sessions", "/sessions"), ("Search", "/search"), ("Pins", "/pins"),
       ("Policies", "/policies"))


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


CSP = ("default-src 'none'; "
       f"style-src {_csp_hash(CSS)}; script-src {_csp_hash(SCRIPT)}; img-src 'self' data:; "
       "form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
HEADERS = {"content-security-policy": CSP, "x-content-type-options": "nosniff",
           "referrer-policy": "no-referrer", "x-frame-options": "DENY", "cache-control": "no-store"}
NONE = "\N{EN DASH}"  # a figure that is not known (no usage, not priced, no calls)


def esc(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def url(path: str = "", **query: Any) -> str:
    """A dashboard URL; query values that are None or "" are left out."""
    params = {k: v for k, v in query.items() if v not in (None, "")}
    return PREFIX + path + ("?" + urlencode(params) if params else "")


def seg(value: str) -> str:
    """One path segment (ids may hold `#` or `:`)."""
    return quote(value, safe="")


def attr(name: str, value: Any) -> str:
    """` name="value"`, or nothing for an empty value."""
    return f' {name}="{esc(value)}"' if value else ""


def link(href: str, text: Any, cls: str = "") -> str:
    return f'<a href="{esc(href)}"{attr("class", cls)}>{esc(text)}</a>'


# ----------------------------------------------------------------------------------------- numbers

def usd(value: Any) -> str:
    if value is None:
        return NONE
    shown = f"{abs(float(value)):,.4f}"
    return ("-" if float(value) < 0 and shown.strip("0.,") else "") + "$" + shown  # never "$-0.0000"


def count(value: Any) -> str:
    return NONE if value is None else f"{int(value):,}"


def pct(value: Any) -> str:
    return NONE if value is None else f"{float(value):.2f}%"


def ms(value: Any) -> str:
    return NONE if value is None else f"{float(value):,.1f} ms"


FORMATS = {"usd": usd, "count": count, "pct": pct, "ms": ms, "text": lambda v: NONE if v is None else str(v)}


def figure(key: str, value: Any, kind: str) -> str:
    """A number as shown, with the exact value in data-value (what the tests compare with the CLI)."""
    raw = "" if value is None else repr(value)
    return (f'<span class="fig" data-key="{esc(key)}" data-value="{esc(raw)}">'
            f"{esc(FORMATS[kind](value))}</span>")


def cards(row: dict[str, Any], items: Sequence[tuple[str, str, str]], ident: str = "totals") -> str:
    """Big figures: (label, key of `row`, format)."""
    cells = "".join(f'<div class="card"><div class="label">{esc(label)}</div>'
                    f'<div class="value">{figure(key, row.get(key), kind)}</div></div>'
                    for label, key, kind in items)
    return f'<div class="cards" id="{esc(ident)}">{cells}</div>'


# ------------------------------------------------------------------------------------------ tables

@dataclass
class Column:
    title: str
    key: str
    kind: str = "text"  # usd | count | pct | ms | text | html (the cell is already markup)
    href: Callable[[dict[str, Any]], str] | None = None  # row -> URL, for a link cell

    def cell(self, row: dict[str, Any]) -> str:
        value = row.get(self.key)
        if self.kind == "html":
            return f"<td>{value or ''}</td>"
        if self.href is not None and value is not None:
            return f'<td data-key="{esc(self.key)}">{link(self.href(row), value)}</td>'
        if self.kind == "text":
            return f'<td data-key="{esc(self.key)}">{esc(NONE if value is None else value)}</td>'
        return f'<td class="num">{figure(self.key, value, self.kind)}</td>'


def table(columns: Sequence[Column], rows: Iterable[dict[str, Any]], ident: str = "",
          empty: str = "nothing yet") -> str:
    head = "".join(f"<th{attr('class', 'num' if c.kind not in ('text', 'html') else '')}>{esc(c.title)}</th>"
                   for c in columns)
    body = ["<tr>" + "".join(c.cell(row) for c in columns) + "</tr>" for row in rows]
    if not body:
        body.append(f'<tr class="empty"><td colspan="{len(columns)}">{esc(empty)}</td></tr>')
    return (f'<div class="scroll"><table{attr("id", ident)}><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


def pairs(items: Sequence[tuple[str, str]], ident: str = "") -> str:
    """A definition list; values are markup (escape them before)."""
    rows = "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in items)
    return f'<dl class="pairs"{attr("id", ident)}>{rows}</dl>'


def pre(text: Any, cls: str = "", ident: str = "") -> str:
    """Text exactly: the parser drops one newline right after <pre> (so one is always there) and turns
    CR LF into LF unless the CR is a character reference."""
    body = esc(text).replace("\r", "&#13;")
    return f"<pre{attr('class', cls)}{attr('id', ident)}>\n{body}</pre>"


def badge(text: str, kind: str) -> str:
    return f'<span class="badge {esc(kind)}">{esc(text)}</span>'


# -------------------------------------------------------------------------------------------- pages

@dataclass
class Page:
    title: str
    body: str
    status: int = 200
    section: str = ""  # the NAV entry to highlight
    headers: dict[str, str] = field(default_factory=dict)


def document(page: Page, *, signed_in: bool = False) -> str:
    nav = "".join(f'<a href="{PREFIX}{path}"{" class=on" if name == page.section else ""}>{name}</a>'
                  for name, path in NAV)
    logout = (f'<form method="post" action="{PREFIX}/logout" class="logout">'
              '<button type="submit">Sign out</button></form>') if signed_in else ""
    return ("<!doctype html><html lang=en><head><meta charset=utf-8>"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<title>{esc(page.title)} · ctxproxy</title><link rel="icon" href="data:,"><style>{CSS}</style>'
            "</head><body>"
            f'<header><span class="brand">ctxproxy</span><nav>{nav}</nav>{logout}</header>'
            f"<main><h1>{esc(page.title)}</h1>{page.body}</main>"
            f"<script>{SCRIPT}</script></body></html>")


def respond(page: Page, *, signed_in: bool = False) -> HTMLResponse:
    return HTMLResponse(document(page, signed_in=signed_in), status_code=page.status,
                        headers=HEADERS | page.headers)


def problem(status: int, title: str, message: str) -> Page:
    return Page(title, f'<p class="problem">{esc(message)}</p><p>{link(PREFIX, "Back to the overview")}</p>',
                status=status)


class NotFoundPage(Exception):
    """Raised by a page builder for an unknown or malformed id: answered as a 404 page."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
