"""What an agent acts on in any line-based output: error lines (repeats collapsed with counts), the paths it
names (grouped by directory) and identifier-like tokens. Every summary kind ends with these sections.

All scans are single regex passes whose matches can only start at the beginning of a run of the characters
they consume, so the work stays linear even on a megabyte-long line.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable

from .common import ERR_W, MAX_ERR, VALUE_W, _clip, _Sec, joined, lines_with, matching_lines

# Strong: the line reports a failure. Weak: worth a look, but repeated warnings must not crowd out errors.
# Identifiers ending in error/exception (HTTPError, should_error) are error handling too. `(?<=\w)error`
# rather than `\w+error`: a scan from every word character would be quadratic.
STRONG_RE = re.compile(r"(?i:\b(?:error|errors|exception|traceback|failed|failure|failures|fatal|panic)\b"
                       r"|(?<=\w)(?:error|exception)s?\b)|\bFAIL\b|^=+ [^\n]*\b(?:passed|failed)\b")
WEAK_RE = re.compile(r"(?i)warn|denied|refused|timeout|timed out|\bassert\b")
# Python frames, and pytest's "src/x.py:41: in parse" / "tests/t.py:12: ValueError" (a whole line: a
# warning "x.py:3: DeprecationWarning: …" is not a frame).
FRAME_RE = re.compile(r'^\s*File "[^"]*", line \d+|^[\w./\\-]+\.\w+:\d+: (?:in \S+|\w+)\s*$')
_FRAME_M = re.compile(  # FRAME_RE over many lines at once (common.joined)
    r'\n[^\S\n]*+File "[^"\n]*", line \d+|\n[\w./\\-]+\.\w+:\d+: (?:in \S+|\w+)[^\S\n]*$', re.M)
TB_RE = re.compile(r"Traceback \(most recent call last\):")
_STRONG_M, _WEAK_M = (re.compile(p.pattern, re.M) for p in (STRONG_RE, WEAK_RE))  # over many lines at once
# Every match of STRONG_RE / WEAK_RE contains one of these (lower-cased): the cheap first pass.
STRONG_WORDS = ("error", "exception", "traceback", "fail", "fatal", "panic", "passed")
WEAK_WORDS = ("warn", "denied", "refused", "timeout", "timed out", "assert")
# The lookbehind holds every character a path may contain, so a match starts only at the start of a run.
PATH_RE = re.compile(r"(?<![\w/.@+\\:~-])(?:(?:~|\.\.?)/[\w.@+-]+(?:/[\w.@+-]+)*|/[\w.@+-]+(?:/[\w.@+-]+)+"
                     r"|/[\w@+-][\w.@+-]*\.[A-Za-z]\w{0,7}\b|(?:[\w.@+-]+/)+[\w@+-][\w.@+-]*"
                     r"|[A-Za-z]:\\[^\s\"'<>|*?]+)")
FILE_RE = re.compile(r"(?<![\w./@+-])[\w@+-][\w.@+-]*\.(?:py|pyi|pyx|js|mjs|ts|tsx|jsx|go|rs|java|c|h|cc|cpp"
                     r"|hpp|rb|php|cs|kt|swift|sh|yaml|yml|json|toml|cfg|ini|txt|md|rst|html|css|sql|lock"
                     r"|xml|csv|log|in|tex|svg|png|conf|bat|mk|ipynb|pkl|enc)(?![\w/@+-])")
ID_RE = re.compile(r"(?<![\w/-])(?=[\w-]*\d)(?=[\w-]*[A-Za-z])[A-Za-z0-9][\w-]{3,63}(?![\w/-])")
# Every FILE_RE match ends so: a literal-led pattern, which sre finds without trying every position.
_EXTENSION_RE = re.compile(r"\.(?:" + FILE_RE.pattern.split(r"\.(?:", 1)[1])
URL_RE = re.compile(r"(?<![a-z0-9+.-])[a-z][a-z0-9+.-]{0,30}://[^\s\"'<>()]+")
_DIGIT = re.compile(r"\d").search  # every ID_RE match has one
MAX_TOKENS = 5000  # distinct paths or ids collected; the rest is counted, bounded memory on huge inputs


def flag_lines(lines: list[str]) -> tuple[list[int], list[int]]:
    """(strong, weak) line indices: error lines, traceback frames with their source line and the exception
    line that ends a traceback (e.g. "KeyboardInterrupt", which names no error)."""
    text, starts = joined(lines)  # one regex pass over the text instead of four searches per line
    lowered = text.lower()
    if len(lowered) == len(text):  # (lower() keeps offsets, but for a few characters such as "İ")
        strong_at = {i for i in lines_with(lowered, STRONG_WORDS, starts) if STRONG_RE.search(lines[i])}
        weak_at = {i for i in lines_with(lowered, WEAK_WORDS, starts) if WEAK_RE.search(lines[i])}
    else:
        strong_at = matching_lines(_STRONG_M, text, starts)
        weak_at = matching_lines(_WEAK_M, text, starts)
    traceback_at = matching_lines(TB_RE, text, starts)
    frame_at = matching_lines(_FRAME_M, text, starts)
    if not frame_at and not traceback_at:  # (most outputs: the error and warning lines are all there is)
        return sorted(strong_at), sorted(weak_at - strong_at)
    strong: list[int] = []
    weak: list[int] = []
    in_tb = after_frame = False
    for i, line in enumerate(lines):
        frame = i in frame_at
        hit = frame or i in strong_at or (after_frame and line[:1].isspace() and line.strip())
        if i in traceback_at:
            in_tb = True
        elif in_tb and line.strip() and not line[0].isspace():
            hit, in_tb = True, False
        after_frame = frame
        if hit:
            strong.append(i)
        elif i in weak_at:
            weak.append(i)
    return strong, weak


def collapsed(lines: list[str], indices: list[int], base: int = 0, width: int = ERR_W) -> list[str]:
    """Numbered lines, each distinct text once: 'L12: text', or 'L12 (x37): text' (with a multiplication
    sign) for a repeated line: the number is its first occurrence; traceback frames stay apart."""
    counts: dict[str, int] = {}
    first: dict[str, int] = {}
    for i in indices:
        key = lines[i].strip()
        if FRAME_RE.match(lines[i]) or (lines[i][:1].isspace() and not key[:1].isalpha()):
            key = f"{i}\0{key}"  # frames and their source lines: never merged
        counts[key] = counts.get(key, 0) + 1
        first.setdefault(key, i)
    out = []
    for key, i in first.items():
        n = counts[key]
        out.append(f"L{base + i + 1}{f' (×{n})' if n > 1 else ''}: {_clip(lines[i], width)}")  # noqa: RUF001
    return out


def find_paths(text: str, words: list[str] | None = None) -> list[str]:
    """Paths in order of first appearance (PATH_RE's, then FILE_RE's), URLs left whole. `words`:
    `text.split()`, when the caller has it.

    Only the words that can hold a match are scanned (one a line): no pattern here matches whitespace or
    has it in a lookaround's class, so a word finds the same matches alone as in the text."""
    found: dict[str, None] = {}
    words = text.split() if words is None else words
    slashed = "\n".join([word for word in words if "/" in word or "\\" in word])
    dotted = [word for word in words if "." in word]
    # (FILE_RE tries every position of what it is given: only the words with an extension are)
    joined_dotted, starts = joined(dotted)
    named = "\n".join([dotted[i] for i in sorted(matching_lines(_EXTENSION_RE, joined_dotted, starts))])
    for regex, hay in ((PATH_RE, slashed), (FILE_RE, named)):
        for m in regex.finditer(hay):
            path = m.group().rstrip(".,:;")
            if (m.start() and hay[m.start() - 1] in ":/") or len(path) < 3 or path.count("/") == len(path):
                continue
            found[path] = None
            if len(found) >= MAX_TOKENS:
                break
    if "://" in text:  # a URL's tail looks like a path: keep the URL whole instead
        for m in URL_RE.finditer(text):
            found.pop(m.group().split("://", 1)[1], None)
    return list(found)


def find_ids(text: str, skip: Iterable[str] = (), words: list[str] | None = None) -> list[str]:
    skipped = set(skip)
    found: dict[str, None] = {}
    words = text.split() if words is None else words
    # (words as in find_paths; a word of letters alone, told in C, holds no digit)
    for m in ID_RE.finditer("\n".join(filter(_DIGIT, itertools.filterfalse(str.isalpha, words)))):
        token = m.group()
        if token not in skipped and not token.replace("-", "").isdigit():
            found[token] = None
            if len(found) >= MAX_TOKENS:
                break
    return list(found)


def group_paths(paths: list[str]) -> list[str]:
    """'dir/: name, name' lines in order of first appearance; bare file names under 'files:'."""
    groups: dict[str, dict[str, None]] = {}
    for path in paths:
        head, _, name = path.rstrip("/").rpartition("/")
        if path.endswith("/"):
            name += "/"
        groups.setdefault(f"{head}/" if head else "" if path.startswith("/") else "files", {})[name] = None
    out = []
    for head, names in groups.items():
        out.append(f"{_clip(head, VALUE_W)}: {', '.join(_clip(n, VALUE_W) for n in names)}" if head
                   else ", ".join(f"/{n}" for n in names))
    return out


def salient_secs(lines: list[str], text: str, base: int = 0, shown: str = "", *,
                 skip: set[int] | frozenset[int] = frozenset(), warnings: bool = True,
                 flagged: tuple[list[int], list[int]] | None = None) -> list[_Sec]:
    """Error lines (critical; not those in `skip`, shown elsewhere), warnings (not for source code, where
    `timeout = 5` is no warning), then the paths and ids not already in `shown` (critical). `flagged`:
    what `flag_lines(lines)` gave, when the caller has it already."""
    secs: list[_Sec] = []
    strong, weak = flagged if flagged is not None else flag_lines(lines)
    strong, weak = [i for i in strong if i not in skip], [i for i in weak if i not in skip and warnings]
    err = collapsed(lines, strong[:MAX_ERR], base)
    if err:
        secs.append(_Sec(err, "error lines:", "error lines", 8, critical=True,
                         extra=max(len(strong) - MAX_ERR, 0)))
    if weak:
        secs.append(_Sec(collapsed(lines, weak[:MAX_ERR], base), "warning lines:", "warning lines", 6,
                         extra=max(len(weak) - MAX_ERR, 0)))
    # Tokens already in kept lines are not listed again (sets of tokens: no substring scans per token).
    seen_text = shown + "\n" + "\n".join(err)
    seen = set(find_paths(seen_text))
    words = text.split()
    paths = [p for p in find_paths(text, words) if p not in seen]
    if paths:
        secs.append(_Sec(group_paths(paths), "paths:", "directories", 4, critical=True))
    seen = set(find_ids(seen_text)) | set(find_ids("\n".join(paths)))
    ids = [t for t in find_ids(text, words=words) if t not in seen]
    if ids:
        secs.append(_Sec([_clip(t, VALUE_W) for t in ids], "ids: ", "ids", 3, inline=True, critical=True))
    return secs
