"""Text-protocol observations: the command output inside the harness's wrapper.

mini-swe-agent sends `<returncode>0</returncode>`, then `<output>` … `</output>` (or, when the output was
too long, a `<warning>`, `<output_head>`, `<elided_chars>` and `<output_tail>`); SWE-agent sends the raw
output followed by `(Open file: …)`, `(Current directory: …)` and a `bash-$` prompt. The summary describes
the output itself and keeps the wrapper's facts (return code, open file, directory, elided size) verbatim in
its header, while line numbers still count from the message's first line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .common import VALUE_W, _clip

RETURNCODE_RE = re.compile(r"^\s*<returncode>(-?\d+)</returncode>\s*$")
OPEN_RE = re.compile(r"^\s*(?:</warning>)?<(output|output_head)>\s*$")
CLOSE_RE = re.compile(r"^\s*</(output|output_tail)>\s*$")
ELIDED_RE = re.compile(r"^\s*(\d+) characters elided\s*$")
TRAILER_RE = re.compile(r"^\((?:Open file|Current directory): .*\)$|^bash-\$\s*$")
SCAN = 40  # wrapper lines sit at the ends: bounded look at both


@dataclass
class Envelope:
    start: int  # first line of the output (0-based)
    end: int  # one past its last line
    notes: list[str] = field(default_factory=list)  # wrapper facts, for the header


def unwrap(lines: list[str]) -> Envelope:
    env = Envelope(0, len(lines))
    head = next((i for i, line in enumerate(lines[:3]) if RETURNCODE_RE.match(line)), None)
    if head is not None:
        env.notes.append(f"return code {RETURNCODE_RE.match(lines[head])[1]}")  # type: ignore[index]
        env.start = head + 1
        opening = next((i for i in range(head + 1, min(len(lines), head + SCAN)) if OPEN_RE.match(lines[i])),
                       None)
        if opening is not None:
            env.start = opening + 1
            if lines[opening].strip().endswith("<output_head>"):
                elided = next((m[1] for line in lines[env.start:] for m in [ELIDED_RE.match(line)] if m), "?")
                env.notes.append(f"output too long for the harness: head and tail only, {elided} characters "
                                 "elided")
        closing = next((i for i in range(len(lines) - 1, max(env.start, len(lines) - 4) - 1, -1)
                        if CLOSE_RE.match(lines[i])), None)
        env.end = closing if closing is not None else len(lines)
        return env
    end = len(lines)
    while end > max(len(lines) - 4, 0) and (TRAILER_RE.match(lines[end - 1]) or not lines[end - 1].strip()):
        end -= 1
    trailer = [line for line in lines[end:] if line.strip()]
    if any(line.startswith("(") for line in trailer):
        env.end, env.notes = end, [_clip(line, VALUE_W + 80) for line in trailer if line.startswith("(")]
    return env

