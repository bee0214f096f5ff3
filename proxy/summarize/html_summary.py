"""HTML pages: title, headings, links, forms and a gist of the visible text; paths, ids and error lines of
the markup come from the shared sections."""

from __future__ import annotations

import re
from html.parser import HTMLParser

from .common import LINE_W, VALUE_W, _clip, _plural, _Sec
from .detect import _Analysis
from .text_summary import _lines_summary

HTML_RE = re.compile(r"(?is)^\s*(?:<\?xml[^>]*>\s*)?(?:<!--.*?-->\s*)?(?:<!doctype html|<html\b)")
PARSE_CHARS = 500_000  # html.parser is pure Python: parse the start of a huge page only
MAX_ITEMS = 400
GIST_WORDS = 120


def is_html(text: str) -> bool:
    return bool(HTML_RE.match(text[:2000]))


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.title = ""
        self.headings: list[str] = []
        self.links: list[str] = []
        self.forms: list[str] = []
        self.words: list[str] = []
        self._stack: list[str] = []  # open title/h*/a/script/style tags whose text we route
        self._text: list[str] = []
        self._href = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag in ("title", "h1", "h2", "h3", "h4", "h5", "h6", "a", "script", "style"):
            self._stack.append(tag)
            self._text = []
            self._href = a.get("href", "") if tag == "a" else self._href
        elif tag == "form" and len(self.forms) < MAX_ITEMS:
            self.forms.append(f"form {a.get('method', 'get').upper()} {a.get('action', '')}".rstrip())
        elif tag in ("input", "select", "textarea", "button") and self.forms and len(self.forms) < MAX_ITEMS:
            name = a.get("name") or a.get("id") or ""
            if name:
                self.forms.append(f"  {tag} {name}" + (f" ({a['type']})" if a.get("type") else ""))

    def handle_endtag(self, tag: str) -> None:
        if not self._stack or self._stack[-1] != tag:
            return
        self._stack.pop()
        text = " ".join(" ".join(self._text).split())
        if tag == "title":
            self.title = text
        elif tag.startswith("h") and text and len(self.headings) < MAX_ITEMS:
            self.headings.append(f"{tag}: {text}")
        elif tag == "a" and self._href and len(self.links) < MAX_ITEMS:
            self.links.append(f"{text} -> {self._href}" if text else self._href)

    def handle_data(self, data: str) -> None:
        if self._stack and self._stack[-1] in ("script", "style"):
            return
        if self._stack:
            self._text.append(data)
        if len(self.words) < GIST_WORDS:
            self.words += data.split()[:GIST_WORDS]


def html_summary(an: _Analysis, text: str, max_chars: int, cap: int | None,
                 extra: list[_Sec] | None = None) -> str:
    page = _Page()
    try:
        page.feed(text[:PARSE_CHARS])
        page.close()
    except Exception:  # malformed markup: whatever was gathered so far still helps
        pass
    front = [_Sec([f"title: {_clip(page.title, LINE_W)}"] if page.title else [], weight=20, critical=True),
             _Sec([_clip(h, LINE_W) for h in page.headings], "headings:", "headings", 8, critical=True),
             _Sec([_clip(x, LINE_W) for x in page.forms], "forms:", "form lines", 6, critical=True),
             _Sec([_clip(x, VALUE_W + 80) for x in page.links], "links:", "links", 5, critical=True),
             _Sec([_clip(" ".join(page.words[:GIST_WORDS]), 3 * LINE_W)], "text:", "", 2)]
    label = (f"HTML page, {_plural(len(page.headings), 'heading')}, {_plural(len(page.links), 'link')}"
             + (f", {_plural(sum(not x.startswith(' ') for x in page.forms), 'form')}" if page.forms else ""))
    shown = "\n".join([page.title, *page.headings, *page.links, *page.forms])
    return _lines_summary(an, text, max_chars, cap, label=label, front=front + (extra or []), shown=shown,
                          context=False)
