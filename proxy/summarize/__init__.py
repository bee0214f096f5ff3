"""Deterministic summaries of large tool results.

The proxy swaps a big tool result for this summary and the model fetches the original on demand, so the
summary must answer "do I need the original?". It keeps ids, paths, numbers and error lines verbatim and
never rewrites a kept line: a line is kept whole, dropped, or cut with an explicit "…[+N chars]" marker.
Line numbers (``L12``) follow ``str.splitlines()``, the numbering read_tool_result uses for ranges.
"""

from __future__ import annotations

import ast

from .code_summary import _code_summary, _module_level, _python_summary
from .common import BREAK_RE, CRITICAL_MAX, LINE_W, SAMPLE, Unfit, _clip, _distinct, _plural, budgets
from .detect import FUNCS, _Analysis, _analyze, _is_def
from .diff_summary import diff_summary, is_diff
from .envelope import unwrap
from .html_summary import html_summary, is_html
from .json_summary import _json_summary, _json_title
from .listing_summary import grep_summary, listing_kind, listing_summary
from .log_summary import is_test_run, test_summary
from .pointed import pointed_sec
from .text_summary import _flagged, _lines_summary

__all__ = ["detect_kind", "gist", "summarize"]


def detect_kind(text: str) -> str:
    """'json' | 'python' | 'code' | 'log' | 'text'."""
    try:
        return _analyze(text).kind
    except Exception:
        return "text"


def summarize(text: str, *, tool_name: str | None = None, max_chars: int | None = None,
              arguments: str | None = None) -> str:
    """Deterministic summary body of a tool result (no header; the caller adds the labelled header).

    max_chars: a hard cap; by default the size grows with the input (see common.budgets): context gets a
    share of it, and what an agent acts on (ids, paths, error lines, diff and test headers, the lines the
    call's `arguments` point at) is kept in full. When that alone is as large as the input, the body is the
    input itself, so layer 1 (which applies only summaries at most half the original) leaves it alone.
    """
    if max_chars is not None and max_chars <= 0:
        return ""
    budget, cap = budgets(len(text), max_chars)
    try:
        try:
            body = _summarize(text, tool_name, budget, cap, arguments)
        except Unfit:
            if len(text) <= CRITICAL_MAX:
                return text  # no smaller text keeps what matters: the "summary" is the original itself
            body = _summarize(text, tool_name, cap, cap, arguments)  # huge: cut, with counts, to the cap
    except Exception:  # a summary must never break the proxy: fall back to the plain line treatment
        try:
            body = _lines_summary(_Analysis("text", text.splitlines()), text, budget, cap)
        except Exception:
            body = f"text, {len(text)} chars"
    if len(body) > cap:  # hard cap for tiny budgets: whole lines if possible
        cut = body.rfind("\n", 0, cap + 1)
        body = body[:cut] if cut > 0 else body[:cap]
    return body


def _summarize(text: str, tool_name: str | None, budget: int, cap: int, arguments: str | None) -> str:
    lines = text.splitlines()
    env = unwrap(lines)
    inner = text if (env.start, env.end) == (0, len(lines)) else "\n".join(lines[env.start:env.end])
    notes = "; ".join(env.notes)
    if notes:  # the harness's facts (return code, open file, directory) lead the summary, verbatim
        notes = _clip(f"observation: {notes}", 4 * LINE_W)
        budget, cap = max(budget - len(notes) - 1, 0), max(cap - len(notes) - 1, 0)
    an = _analyze(inner, tool_name)
    an.base = env.start
    body = ""
    if isinstance(an.doc, dict | list):
        body = _json_summary(an.doc, inner, budget, cap)
    else:
        pointed = pointed_sec(arguments, an.lines, an.base)
        extra = [pointed] if pointed else []
        special = _special_kind(an, inner)
        if special == "html":
            body = html_summary(an, inner, budget, cap, extra)
        elif special == "diff":
            body = diff_summary(an, inner, budget, cap, extra)
        elif special == "test":
            body = test_summary(an, inner, budget, cap, extra)
        elif special == "grep":
            body = grep_summary(an, inner, budget, cap, extra)
        elif special == "listing":
            body = listing_summary(an, inner, budget, cap, extra)
        elif an.kind == "python":
            body = _python_summary(an, budget, cap, extra, inner)
        elif an.kind == "code":
            body = _code_summary(an, inner, budget, cap, extra)
        else:
            body = _lines_summary(an, inner, budget, cap, front=extra)
    return f"{notes}\n{body}" if notes else body


def _special_kind(an: _Analysis, text: str) -> str:
    """Kinds recognised by their shape, checked before the generic code/log/text classes."""
    if is_html(text):
        return "html"
    if is_diff(an.lines):
        return "diff"
    if is_test_run(an.lines):
        return "test"
    if an.kind not in ("python", "log"):  # timestamped lines are a log, whatever else they look like
        return listing_kind(an.lines) or ""
    return ""


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
