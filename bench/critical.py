"""What an agent acts on in a tool output, found by content alone (never by the summarizer's own rules).

Shared by the retention and summary benchmarks (and their tests) so every figure uses one definition:

- **ids**: tokens that mix letters and digits (`HAT169`, `ivan_rossi_8555`, `call_3f2a`, UUIDs, git
  hashes of 7+ hex digits with a digit and a letter);
- **paths**: tokens with a `/` between name characters (`src/app.py`, `/tmp/x`, `a/django/db.py`), and
  file names with a known extension (`setup.py`);
- **error lines**: lines that name an error, exception, failure or traceback, and test-run summary lines
  (`2 failed, 72 passed`);
- **numbers**: numbers with a decimal point or of three or more digits (prices, counts, line numbers);
  reported apart from the critical three.

A token is *kept* by a text if it occurs in it literally; a path also counts as kept when its file name and
its directory both occur (a listing grouped by directory); an error line when its first 80 characters occur
(a kept line may be cut with an explicit marker).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_ID = re.compile(r"(?<![\w/-])(?<!\w\.)(?=[\w-]*\d)(?=[\w-]*[A-Za-z])[A-Za-z0-9][\w-]{3,63}(?![\w/])")
_PATH = re.compile(r"(?<![\w.])(?:\.{0,2}/)?(?:[\w.@+-]+/)+[\w.@+-]+"
                   r"|(?<![\w./-])[\w-]+\.(?:py|js|ts|tsx|jsx|go|rs|java|c|h|cc|cpp|hpp|rb|php|cs|kt|swift|sh|yaml|yml|json|toml|cfg|ini|txt|md|rst|html"
                   r"|css|sql|lock|xml|csv|log)\b")
_ERROR_LINE = re.compile(r"(?i)\b(?:error|exception|traceback|failed|failure|fatal|panic)\b|\w+Error\b"
                         r"|^=+ .*\b(?:passed|failed)\b")
_NUMBER = re.compile(r"(?<![\w.])\d+\.\d+(?![\w.])|(?<![\w.])\d{3,}(?![\w.])")
_URLISH = re.compile(r"^[a-z]+://")
ERROR_PREFIX = 80


@dataclass
class Critical:
    ids: set[str] = field(default_factory=set)
    paths: set[str] = field(default_factory=set)
    error_lines: set[str] = field(default_factory=set)
    numbers: set[str] = field(default_factory=set)

    @property
    def total(self) -> int:
        return len(self.ids) + len(self.paths) + len(self.error_lines)


def critical_tokens(text: str) -> Critical:
    found = Critical()
    for match in _PATH.finditer(text):
        path = match.group(0).rstrip(".")
        if match.start() and text[match.start() - 1] in ":/":
            continue  # the tail of a URL
        if "/" in path and (path.count("/") == len(path) or _URLISH.match(path)):
            continue
        if len(path) >= 3:
            found.paths.add(path)
    for match in _ID.finditer(text):
        token = match.group(0)
        if token not in found.paths and not token.isdigit():
            found.ids.add(token)
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and _ERROR_LINE.search(stripped):
            found.error_lines.add(stripped)
    found.numbers.update(_NUMBER.findall(text))
    return found


def path_kept(path: str, text: str) -> bool:
    if path in text:
        return True
    head, _, name = path.rstrip("/").rpartition("/")
    return bool(head) and name in text and head.lstrip("./") in text


def error_kept(line: str, text: str) -> bool:
    return line[:ERROR_PREFIX] in text


@dataclass
class Kept:
    """Counts of critical tokens of originals and how many their replacements keep."""

    total: int = 0
    kept: int = 0
    numbers_total: int = 0
    numbers_kept: int = 0
    by_kind: dict[str, list[int]] = field(default_factory=lambda: {"ids": [0, 0], "paths": [0, 0],
                                                                  "error_lines": [0, 0]})

    def add(self, original: str, replacement: str) -> float:
        """Count one replacement; returns its own kept share (1.0 when the original has none)."""
        found = critical_tokens(original)
        kept_here = 0
        for kind, tokens, kept in (("ids", found.ids, lambda t: t in replacement),
                                   ("paths", found.paths, lambda t: path_kept(t, replacement)),
                                   ("error_lines", found.error_lines, lambda t: error_kept(t, replacement))):
            hits = sum(1 for token in tokens if kept(token))
            self.by_kind[kind][0] += len(tokens)
            self.by_kind[kind][1] += hits
            kept_here += hits
        self.total += found.total
        self.kept += kept_here
        self.numbers_total += len(found.numbers)
        self.numbers_kept += sum(1 for n in found.numbers if n in replacement)
        return kept_here / found.total if found.total else 1.0

    def share(self) -> float:
        return round(self.kept / self.total, 4) if self.total else 1.0

    def numbers_share(self) -> float:
        return round(self.numbers_kept / self.numbers_total, 4) if self.numbers_total else 1.0
