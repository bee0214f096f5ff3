"""What the client sent beside what went upstream: each forwarded message classified by the text the
proxy writes (summaries, placeholders, injected blocks, its own tool calls), and each client message
marked kept, replaced (by a summary or placeholder) or evicted (absent from what was forwarded)."""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.archive_traffic import HANDLE, content_text, is_internal_call
from proxy.layers.observations import handle_for
from proxy.ui.page import badge, esc, link, pre, seg, url

# Openings the proxy writes (proxy/layers/tool_results.py, auto_summary.py, working_memory.py, folded.py,
# proxy/pins.py); archive_traffic recognizes the same texts.
SUMMARY = re.compile(r"\A\[ctxproxy summary of tool result call_id=(.+?)(?: from [^:\]\s]+)?: "
                     r"original \d+ tokens")
PLACEHOLDER = re.compile(r"\A\[summarized: call_id=(.+?)\] ")
INJECTED = ("[ctxproxy auto-summary", "[WORKING MEMORY]", "[ctxproxy pinned knowledge", "## Folded memory")
SHOWN_CHARS = 6000  # of one message on this page; the rest through the result page
EVICTED_RUN = 3  # this many evicted messages in a row fold into one line


@dataclass
class Mark:
    kind: str  # client side: kept | replaced | evicted | rewritten; forwarded: kept | summary | masked |
    #            injected | internal | rewritten (a message the proxy changed some other way)
    handle: str | None = None  # summaries and placeholders: the handle of the original
    other: int | None = None  # the index of the matching message on the other side


def _key(message: Any) -> bytes:
    return orjson.dumps(message, option=orjson.OPT_SORT_KEYS)


def classify(message: dict[str, Any], internal_ids: set[str]) -> Mark:
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls and all(is_internal_call(c) for c in calls):
        return Mark("internal")
    if message.get("role") == "tool" and str(message.get("tool_call_id")) in internal_ids:
        return Mark("internal")
    text = content_text(message)
    for kind, pattern in (("summary", SUMMARY), ("masked", PLACEHOLDER)):
        found = pattern.match(text)
        if found:
            handle = found.group(1)
            return Mark(kind, handle if HANDLE.match(handle) else None)
    if text.startswith(INJECTED):
        return Mark("injected")
    return Mark("kept")


def _internal_ids(messages: list[dict[str, Any]]) -> set[str]:
    ids = set()
    for message in messages:
        calls = message.get("tool_calls")
        for call in calls if isinstance(calls, list) else ():
            if is_internal_call(call) and isinstance(call, dict):
                ids.add(str(call.get("id")))
    return ids


def _dicts(messages: list[Any]) -> list[dict[str, Any]]:
    """Archived bodies are whatever the client sent: anything not an object is shown as text."""
    return [m if isinstance(m, dict) else {"role": "?", "content": str(m)} for m in messages]


def _replaces(original: dict[str, Any], replacement: dict[str, Any], handle: str | None) -> bool:
    """Whether a summary / placeholder stands where `original` was (same call id, or an observation's
    content handle)."""
    if handle is None or original.get("role") != replacement.get("role"):
        return False
    if handle.startswith("obs-"):
        return handle_for(content_text(original)) == handle
    return str(original.get("tool_call_id")) == handle.partition("#")[0]


def align(sent: list[dict[str, Any]], forwarded: list[dict[str, Any]]) -> tuple[list[Mark], list[Mark]]:
    """Marks for both sides. The forwarded list is the client's in order, with replacements in place,
    evicted spans left out and blocks / internal turns added, so one forward walk pairs them."""
    sent, forwarded = _dicts(sent), _dicts(forwarded)
    internal = _internal_ids(forwarded)
    sent_marks = [Mark("evicted") for _ in sent]
    where: dict[bytes, list[int]] = defaultdict(list)
    for index, message in enumerate(sent):
        where[_key(message)].append(index)
    forwarded_keys = {_key(message) for message in forwarded}
    marks, at = [], 0
    for j, message in enumerate(forwarded):
        mark = classify(message, internal)
        marks.append(mark)
        if mark.kind in ("injected", "internal"):
            continue
        if mark.kind in ("summary", "masked"):
            target = next((i for i in range(at, len(sent)) if _replaces(sent[i], message, mark.handle)), None)
        else:
            target = next((i for i in where.get(_key(message), ()) if i >= at), None)
            if target is None:  # changed some other way: it stands for the next client message of its role
                mark.kind = "rewritten"  # that is not forwarded as sent
                if at < len(sent) and sent[at].get("role") == message.get("role") \
                        and _key(sent[at]) not in forwarded_keys:
                    target = at
        if target is not None:
            kind = {"kept": "kept", "rewritten": "rewritten"}.get(mark.kind, "replaced")
            sent_marks[target] = Mark(kind, mark.handle, j)
            mark.other, at = target, target + 1
    return sent_marks, marks


def result_url(handle: str, session_id: str) -> str:
    return url(f"/results/{seg(handle)}", session=session_id)


def _body(message: dict[str, Any], session_id: str) -> str:
    content = message.get("content")
    text = content_text(message) if isinstance(content, (str, list)) else ""
    if isinstance(content, list) and any(not (isinstance(p, dict) and "text" in p) for p in content):
        text += ("\n" if text else "") + orjson.dumps([p for p in content if not (
            isinstance(p, dict) and "text" in p)]).decode()[:SHOWN_CHARS]
    out = []
    if text:
        more = len(text) - SHOWN_CHARS
        out.append(pre(text[:SHOWN_CHARS]))
        if more > 0:
            call_id = message.get("tool_call_id")
            full = f" ({link(result_url(str(call_id), session_id), 'the whole result')})" if call_id else ""
            out.append(f'<p class="note">… {more:,} more characters{full}</p>')
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            out.append(pre(f"→ {function.get('name')}({str(function.get('arguments', ''))[:SHOWN_CHARS]})",
                           cls="call"))
    return "".join(out) or '<p class="muted">(no content)</p>'


LABELS = {"kept": "unchanged", "replaced": "replaced", "evicted": "evicted", "summary": "summary",
          "masked": "masked placeholder", "injected": "injected block", "internal": "proxy's own tool call",
          "rewritten": "rewritten"}


def _meta(index: int, message: dict[str, Any], mark: Mark, side: str) -> str:
    role = str(message.get("role"))
    extra = f" · {message['tool_call_id']}" if message.get("tool_call_id") else ""
    extra += f" · {message['name']}" if isinstance(message.get("name"), str) else ""
    other = ""
    if mark.other is not None:
        other = f' <a href="#{"fwd" if side == "req" else "req"}-{mark.other}">' \
                f'{"forwarded" if side == "req" else "sent"} #{mark.other}</a>'
    shown = "" if side == "ans" and mark.kind == "kept" else badge(LABELS[mark.kind], mark.kind)
    return f'<div class="meta">#{index} <b>{esc(role)}</b>{esc(extra)} {shown}{other}</div>'


def _message(index: int, message: Any, mark: Mark, side: str, session_id: str) -> str:
    if not isinstance(message, dict):
        message = {"role": "?", "content": str(message)}
    head = _meta(index, message, mark, side)
    if side == "fwd" and mark.kind == "kept":
        body = '<p class="muted">as the client sent it</p>'  # shown once, on the left
    else:
        body = _body(message, session_id)
    if mark.handle and side == "fwd":
        original = link(result_url(mark.handle, session_id), "original", cls="original")
        body += f'<p class="note">{original} (handle {esc(mark.handle)})</p>'
    return f'<div class="msg {esc(mark.kind)}" id="{side}-{index}">{head}{body}</div>'


def column(messages: list[dict[str, Any]], marks: list[Mark], side: str, session_id: str) -> str:
    """The messages of one side; a run of evicted ones folds into one line (open it to read them)."""
    out, index = [], 0
    while index < len(messages):
        end = index
        while end < len(messages) and marks[end].kind == "evicted":
            end += 1
        if end - index >= EVICTED_RUN:
            inner = "".join(_message(i, messages[i], marks[i], side, session_id) for i in range(index, end))
            out.append(f'<details class="evicted-run"><summary>#{index} to #{end - 1}: {end - index} '
                       f"messages not forwarded (evicted)</summary>{inner}</details>")
            index = end
            continue
        out.append(_message(index, messages[index], marks[index], side, session_id))
        index += 1
    return "".join(out) or '<p class="muted">no messages</p>'


def tally(marks: list[Mark]) -> str:
    counts: dict[str, int] = {}
    for mark in marks:
        counts[mark.kind] = counts.get(mark.kind, 0) + 1
    return " ".join(badge(f"{n} {LABELS[k]}", k) for k, n in sorted(counts.items()))


def answer(message: dict[str, Any] | None, session_id: str, ident: str = "answer") -> str:
    if message is None:
        return '<p class="muted">no answer archived (an error, a refusal, or a stream cut short)</p>'
    mark = classify(message, set())  # the model's turn: its own words, or calls the proxy answered
    mark = mark if mark.kind == "internal" else Mark("kept")
    head = _meta(0, message, mark, "ans")
    return f'<div class="msg {mark.kind}" id="{esc(ident)}">{head}{_body(message, session_id)}</div>'
