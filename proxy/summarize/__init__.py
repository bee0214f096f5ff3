"""Deterministic summaries of large tool results.

The proxy swaps a big tool result for this summary and the model fetches the original on demand, so the
summary must answer "do I need the original?". It keeps ids, paths, numbers and error lines verbatim and
never rewrites a kept line: a line is kept whole, dropped, or cut with an explicit "…[+N chars]" marker.
Line numbers (``L12``) follow ``str.splitlines()``, the numbering read_tool_result uses for ranges.
"""

from __future__ import annotations

import ast

from .code_summary import _code_summary, _module_level, _python_summary
from .common import BREAK_RE, SAMPLE, _clip, _distinct, _plural
from .detect import FUNCS, _Analysis, _analyze, _is_def
from .json_summary import _json_summary, _json_title
from .text_summary import _flagged, _lines_summary

__all__ = ["detect_kind", "gist", "summarize"]


def detect_kind(text: str) -> str:
    """'json' | 'python' | 'code' | 'log' | 'text'."""
    try:
        return _analyze(text).kind
    except Exception:
        return "text"


def summarize(text: str, *, tool_name: str | None = None, max_chars: int = 2400,
              arguments: str | None = None) -> str:
    """Deterministic summary body of a tool result (no header; the caller adds the labelled header)."""
    if max_chars <= 0:
        return ""
    try:
        an = _analyze(text, tool_name)
        if isinstance(an.doc, dict | list):
            body = _json_summary(an.doc, text, max_chars)
        elif an.kind == "python":
            body = _python_summary(an, max_chars)
        else:
            body = (_code_summary if an.kind == "code" else _lines_summary)(an, text, max_chars)
    except Exception:  # a summary must never break the proxy: fall back to the plain line treatment
        try:
            body = _lines_summary(_Analysis("text", text.splitlines()), text, max_chars)
        except Exception:
            body = f"text, {len(text)} chars"
    if len(body) > max_chars:  # hard cap for tiny budgets: whole lines if possible
        cut = body.rfind("\n", 0, max_chars + 1)
        body = body[:cut] if cut > 0 else body[:max_chars]
    return body


def gist(text: str) -> str:
    """One short line (<= 120 chars), e.g. 'JSON array of 240 objects (keys: id, name, status)'."""
    try:
        an = _analyze(text)
        doc = an.doc
        if isinstance(doc, dict | list):
            keys = _distinct([k for v in doc[:SAMPLE] if isinstance(v, dict) for k in v]) \
                if isinstance(doc, list) else list(doc)
            more = ", …" if len(keys) > 8 else ""
            g = _json_title(doc) + (f" ({'keys: ' * isinstance(doc, list)}{', '.join(keys[:8])}{more})"
                                    if keys else "")
        elif an.kind == "python" and an.tree:
            nodes = _module_level(an.tree.body)
            funcs, classes = (sum(isinstance(n, t) for n in nodes) for t in (FUNCS, ast.ClassDef))
            g = (f"Python module, {len(an.lines)} lines, {_plural(funcs, 'function')}, "
                 f"{_plural(classes, 'class', 'classes')}")
        elif an.kind == "code":
            defs = sum(map(_is_def, an.content or an.lines))
            g = f"code, {_plural(len(an.lines), 'line')}, {_plural(defs, 'definition')}"
        else:
            errors = len(_flagged(an.lines))
            size = f" ({len(text)} chars)" if len(text) > 500 * max(len(an.lines), 1) else ""
            g = (f"{an.kind}, {_plural(len(an.lines), 'line')}{size}"
                 + (f", {_plural(errors, 'error line')}" if errors else "") if text else "text, empty")
    except Exception:
        g = f"text, {len(text)} chars"
    return _clip(BREAK_RE.sub(" ", g), 120)
