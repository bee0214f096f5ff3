"""The auto-summary block: one headline per evicted exchange, grouped by age, within a token budget.

A headline is an index entry: the user's own words verbatim (`said`), what was done with its key
arguments (a tool call's name and ids/paths/command, or the command a text-protocol agent ran), the ids,
paths and error lines each result produced, and the handle that reads the result back. Rendered only when
a batch is evicted and then repeated byte for byte, so it never breaks the prompt cache between batches.
Deterministic: the same evictions at the same times give the same block.
"""

from __future__ import annotations

import contextlib
import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any

import orjson

from proxy.layers.identifiers import clip, error_lines, id_key, id_values, ids_and_paths, json_strings

Count = Callable[[dict[str, Any]], int]
Observation = Callable[[dict[str, Any]], bool]

SNIPPET = 110  # `asked` and `outcome`
SAID_CHARS = 2_000  # the user's own words, kept whole up to here
DO_CHARS = 160  # one action with its arguments (full detail)
DO_SHORT_CHARS = 70  # the same once the entry has shed its details
VALUE_CHARS = 60  # one argument value
FOUND_PER_STEP = 8
ERRORS_PER_STEP = 2
ERROR_CHARS = 120
MAX_PARSE_CHARS = 200_000
# Arguments that say what a call acted on, shown first (ids come next, by key shape).
KEY_ARGS = ("command", "cmd", "path", "file_path", "filepath", "file", "filename", "paths", "dir",
            "directory", "url", "query", "q", "pattern", "regex", "search", "name", "symbol", "code")
_FENCE = re.compile(r"```[ \t]*[\w+-]*[ \t]*\n(.*?)```", re.DOTALL)
_RETURNCODE = re.compile(r"^\s*<returncode>\s*(-?\d+)\s*</returncode>")
_SWE_TRAILER = re.compile(r"\n*\(Open file: [^\n]*\)\n\(Current directory: [^\n]*\)\n?\S*\$?\s*$")
_OUTPUT_TAGS = re.compile(r"</?(?:output|returncode|warning)>")


@dataclass
class Headline:
    at: float  # when the proxy first saw the exchange (epoch seconds)
    asked: str
    tools: str
    outcome: str
    tokens: int
    model_line: str | None = None  # written later by summary.summarizer_model, used from the next batch
    said: str = ""  # the user's own words (not an observation), verbatim up to SAID_CHARS
    # One step a call or command: {"do": "name(args)", "found": [ids, paths], "errors": [lines],
    # "handle": read-back handle or ""}; plain JSON so the state store saves it with asdict.
    steps: list[dict[str, Any]] = field(default_factory=list)


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and
                         isinstance(p.get("text"), str))
    return content if isinstance(content, str) else ""


def _first_line(text: Any) -> str:
    line = next((ln.strip() for ln in _text(text).splitlines() if ln.strip()), "")
    return clip(line, SNIPPET)


def _value(value: Any) -> str:
    if isinstance(value, str):
        return clip(value, VALUE_CHARS)
    try:
        return clip(orjson.dumps(value).decode(), VALUE_CHARS)
    except TypeError:  # nested deeper than orjson serializes (hostile arguments)
        return "…"


def _arguments(raw: Any) -> str:
    """`key=value` pairs, those that say what was acted on first (command, path, ids), then the rest."""
    if isinstance(raw, str):
        try:
            parsed = orjson.loads(raw) if len(raw) <= MAX_PARSE_CHARS else raw
        except orjson.JSONDecodeError:
            parsed = raw
    else:
        parsed = raw
    if not isinstance(parsed, dict):
        return _value(parsed) if parsed not in (None, "", {}) else ""
    keys = [k for k in parsed if isinstance(k, str)]
    first = [k for k in KEY_ARGS if k in parsed] + [k for k in keys if k not in KEY_ARGS and id_key(k)]
    ordered = first + [k for k in keys if k not in first]
    return ", ".join(f"{k}={_value(parsed[k])}" for k in ordered[:12])


def _command(text: str) -> str | None:
    """The command a text-protocol agent ran: its last fenced block (first line, `+N lines` for more)."""
    blocks = _FENCE.findall(text)
    if not blocks:
        return None
    lines = [ln for ln in blocks[-1].strip().splitlines() if ln.strip()]
    if not lines:
        return None
    more = f" (+{len(lines) - 1} lines)" if len(lines) > 1 else ""
    return "$ " + lines[0].strip() + more


def _result_details(content: str, shown: str) -> tuple[list[str], list[str]]:
    """Ids, paths and error lines in a result, leaving out what the step already names."""
    text = _SWE_TRAILER.sub("", content)
    errors: list[str] = []
    if (code := _RETURNCODE.match(text)) and code.group(1) != "0":
        errors.append(f"returncode {code.group(1)}")
    text = _OUTPUT_TAGS.sub(" ", _RETURNCODE.sub("", text, count=1))
    found: list[str] = []
    stripped, values = text.strip(), text
    if stripped[:1] in ("[", "{") and len(stripped) <= MAX_PARSE_CHARS:
        with contextlib.suppress(orjson.JSONDecodeError):  # ids by key shape: `"item_id": 6117189161`
            parsed = orjson.loads(stripped)
            found, values = id_values(parsed, FOUND_PER_STEP * 2), json_strings(parsed)
    for token in ids_and_paths(values, FOUND_PER_STEP * 2):
        if token not in found:
            found.append(token)
    found = [token for token in found if token not in shown][:FOUND_PER_STEP]
    errors += error_lines(text, ERRORS_PER_STEP, ERROR_CHARS)
    return found, errors[:ERRORS_PER_STEP]


def headline(messages: list[dict[str, Any]], at: float, count: Count, *,
             handles: Mapping[int, str] | None = None, observation: Observation | None = None,
             details: bool = True) -> Headline:
    """What the user said, what was done (with its arguments), what each result produced and the handle
    that reads it back, how it ended, and its size. `handles` maps an index in `messages` to the handle
    `read_tool_result` takes; `observation(message)` says a user message is environment output. Without
    `details`, the ids, paths and error lines of results are left out (an entry that will never be shown
    in full: see render)."""
    handles = handles or {}
    first = messages[0] if messages else {}
    said = ""
    if first.get("role") == "user" and not (observation and observation(first)):
        text = _text(first.get("content")).strip()
        said = text if len(text) <= SAID_CHARS else clip(text, SAID_CHARS)
    calls: Counter[str] = Counter()
    steps: list[dict[str, Any]] = []
    by_call: dict[str, dict[str, Any]] = {}
    open_command: dict[str, Any] | None = None
    outcome = ""
    for index, message in enumerate(messages):
        role = message.get("role")
        if role == "assistant":
            for call in message.get("tool_calls") or ():
                function = (call.get("function") or {}) if isinstance(call, dict) else {}
                name = str(function.get("name") or "?")
                calls[name] += 1
                arguments = _arguments(function.get("arguments"))
                step = {"do": clip(f"{name}({arguments})", DO_CHARS), "found": [], "errors": [], "handle": ""}
                steps.append(step)
                if isinstance(call, dict) and isinstance(call.get("id"), str):
                    by_call[call["id"]] = step
            command = None if message.get("tool_calls") else _command(_text(message.get("content")))
            if command:
                open_command = {"do": clip(command, DO_CHARS), "found": [], "errors": [], "handle": ""}
                steps.append(open_command)
            if not command and (line := _first_line(message.get("content"))):
                outcome = line  # the last reply in words: how the exchange ended
        elif role == "tool" or (role == "user" and observation and observation(message)):
            target = by_call.get(str(message.get("tool_call_id"))) if role == "tool" else open_command
            if target is None or target["handle"] or target["found"] or target["errors"]:
                target = {"do": "(output)" if role == "user" else "(result)", "found": [], "errors": [],
                          "handle": ""}
                steps.append(target)
            if role == "user":
                open_command = None
            if details:
                target["found"], target["errors"] = _result_details(_text(message.get("content")),
                                                                    target["do"])
            target["handle"] = handles.get(index, "")
    asked = _first_line(said) if said else clip(steps[0]["do"], SNIPPET) if steps else "(continued)"
    tools = ", ".join(f"{name} x{n}" if n > 1 else name for name, n in calls.items())
    return Headline(at, asked, tools, outcome, sum(count(m) for m in messages), said=said, steps=steps)


AGE_LABELS = ("Earlier in this session", "Yesterday", "This week", "Older")
FULL, BRIEF, BARE = 2, 1, 0  # detail levels an entry sheds, oldest first, to fit the budget
BARE_HANDLES = 3  # read-back handles a bare line still shows


def _age_label(at: float, now: float) -> str:
    day = datetime.fromtimestamp(now, UTC).date()
    then = datetime.fromtimestamp(at, UTC).date()
    if then >= day:
        return "Earlier in this session"
    if then == day - timedelta(days=1):
        return "Yesterday"
    if then > day - timedelta(days=7):
        return "This week"
    return "Older"


def _step(step: Any, level: int) -> str:
    if not isinstance(step, dict):
        return ""
    text = str(step.get("do") or "")
    text = text if level == FULL else clip(text, DO_SHORT_CHARS)
    if level == FULL:
        found = [str(f) for f in step.get("found") or () if f]
        errors = [str(e) for e in step.get("errors") or () if e]
        if found:
            text += " → " + ", ".join(found)
        if errors:
            text += " ! " + " | ".join(errors)
    if step.get("handle"):
        text += f" [call_id={step['handle']}]"
    return text


@lru_cache(maxsize=1024)
def _time_of_day(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%a %H:%M")


def _line(entry: Headline, level: int) -> str:
    when = _time_of_day(entry.at)
    size = f"~{entry.tokens / 1000:.1f}k tokens" if entry.tokens >= 1000 else f"~{entry.tokens} tokens"
    said = getattr(entry, "said", "") or ""
    parts = [f"user said: {orjson.dumps(said).decode()}" if said else (entry.asked or "(no text)")]
    steps = getattr(entry, "steps", None) or []
    if level >= BRIEF and entry.model_line:
        parts = [*parts[:1 if said else 0], entry.model_line]
        parts += [f"[call_id={s['handle']}]" for s in steps if isinstance(s, dict) and s.get("handle")]
    elif level >= BRIEF and steps:
        shown = [text for step in steps if (text := _step(step, level))]
        first = steps[0].get("do") if isinstance(steps[0], dict) else None
        # without the user's words, `asked` is the first action: the steps say it already
        parts = [*parts, *shown] if said or clip(str(first), SNIPPET) != entry.asked else shown
    elif level >= BRIEF and entry.tools:
        parts.append(f"tools: {entry.tools}")
    elif entry.model_line:  # bare: the model's line, short, still beats the first action
        parts = [*parts[:1 if said else 0], clip(entry.model_line, SNIPPET)]
    if level == BARE:  # its handles stay (one read_tool_result away), in place of the time of day
        handles = [s["handle"] for s in steps if isinstance(s, dict) and s.get("handle")]
        if handles:
            parts.append(" ".join(f"[call_id={h}]" for h in handles[:BARE_HANDLES]))
        return f"- ({size}) " + " · ".join(parts)
    if level == FULL and entry.outcome and not entry.model_line:
        parts.append(f"→ {entry.outcome}")
    return f"- ({when}, {size}) " + " · ".join(parts)


Costs = dict[tuple[int, int], int]  # (id of an entry, level) -> its line's tokens, while the entries live


def render(entries: list[Headline], now: float, max_tokens: int, count_text: Callable[[str], int],
           costs: Costs | None = None) -> str:
    """The block's text. Older entries shed their details first (full → brief → the user's words or what
    was asked, with the handles), then are dropped and counted: entries without the user's words before
    those with them.

    Line costs are measured once; the block is composed once, then checked (and trimmed if the
    estimate was off by a few tokens). `costs`: lines measured before (shown_in_full), filled in here.
    """
    levels, dropped, order = _levels(entries, now, max_tokens, count_text, costs)
    total_tokens = sum(e.tokens for e in entries)
    while True:
        kept = [i for i in range(len(entries)) if i not in dropped]
        text = _compose([entries[i] for i in kept], [levels[i] for i in kept], len(dropped), total_tokens,
                        len(entries), now)
        if not kept or count_text(text) <= max_tokens:
            return text
        dropped.add(next(i for i in order if i not in dropped))


def shown_in_full(entries: list[Headline], now: float, max_tokens: int, count_text: Callable[[str], int],
                  costs: Costs | None = None) -> list[bool]:
    """Which entries the block would show with every detail. Measured on entries built without details
    (whose full lines are then at most as long), it names every entry that may be shown in full once
    they have them: only those need their results searched for ids, paths and errors."""
    levels, dropped, _ = _levels(entries, now, max_tokens, count_text, costs)
    return [level == FULL and index not in dropped for index, level in enumerate(levels)]


def _levels(entries: list[Headline], now: float, max_tokens: int, count_text: Callable[[str], int],
            costs: Costs | None) -> tuple[list[int], set[int], list[int]]:
    """The detail level of each entry, those dropped, and the order in which more would be dropped."""
    total_tokens = sum(e.tokens for e in entries)
    known: Costs = {} if costs is None else costs

    def cost(index: int, level: int) -> int:  # (a level is measured only when an entry reaches it)
        key = (id(entries[index]), level)
        if key not in known:
            known[key] = count_text(_line(entries[index], level)) + 1
        return known[key]

    frame = count_text(_compose([], [], 1, total_tokens, len(entries), now)) + 8 * len(AGE_LABELS)
    levels = [FULL] * len(entries)
    total = frame + sum(cost(i, FULL) for i in range(len(entries)))
    for target in (BRIEF, BARE):
        for index in range(len(entries) - 1):  # the newest keeps its details longest
            if total <= max_tokens:
                break
            if levels[index] > target:
                total -= cost(index, levels[index]) - cost(index, target)
                levels[index] = target
    order = [i for i, e in enumerate(entries) if not e.said] + [i for i, e in enumerate(entries) if e.said]
    dropped: set[int] = set()
    for index in order:
        if total <= max_tokens:
            break
        dropped.add(index)
        total -= cost(index, levels[index])
    return levels, dropped, order


def _compose(entries: list[Headline], levels: list[int], dropped: int, total_tokens: int, total: int,
             now: float) -> str:
    lines = [f"[ctxproxy auto-summary: {total} earlier exchange{'s' if total != 1 else ''} "
             f"(~{total_tokens} tokens) left this conversation to keep it within the context window. "
             "One line each: the user's words, what was done (→ ids and paths it produced, ! errors), "
             "and the call_id that read_tool_result returns it by; recall searches the full text.]"]
    if dropped:
        lines.append(f"- ({dropped} older exchange{'s' if dropped != 1 else ''} not listed)")
    label = None
    for entry, level in zip(entries, levels, strict=True):
        age = _age_label(entry.at, now)
        if age != label:
            lines.append(f"## {age}")
            label = age
        lines.append(_line(entry, level))
    lines.append("Older history is available via recall(query).")
    return "\n".join(lines)
