"""Kind detection: parse a tool result once and classify it as json, python, code, log or text."""

from __future__ import annotations

import ast
import itertools
import json
import re
from dataclasses import dataclass

from proxy import shallow_json

from .common import ERR_WORDS, has_error_word, joined, lines_with

SCAN_LINES = 2000  # kind detection reads the start only: enough to classify, bounded cost

TS_RE = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d|\b\d\d:\d\d:\d\d\b")
LEVEL_RE = re.compile(r"\b(?:TRACE|DEBUG|INFO|NOTICE|WARN|WARNING|ERROR|ERR|FATAL|CRITICAL|PANIC)\b"
                      r"|\blevel[\"']?\s*[=:]")
GUTTER_RE = re.compile(r"\s*(\d{1,9})(?:\t|→|│|\| |: )")  # "    12\tcode", "12→code" from file-read tools
CODE_LINE_RE = re.compile(r"[{};:]\s*$|^\s*(?://|/\*|\*/|#include|#define|import\s|from\s\S+\simport|package\s"
                          r"|use\s|return\b|\}|@\w|if\s*\(|for\s*\(|while\s*\(|self\.)")
DEF_RE = re.compile(
    r"\s*(?:(?:export\s+(?:default\s+)?)?(?:async\s+)?function\b|(?:export\s+(?:default\s+)?)?"
    r"(?:abstract\s+)?class\s+\w|(?:export\s+)?(?:declare\s+)?(?:interface|enum|namespace)\s+\w"
    r"|(?:export\s+)?type\s+\w+(?:<[^>]*>)?\s*=|type\s+\w+\s+(?:struct|interface)\b|impl\b|func\s"
    r"|(?:pub(?:\([\w:]+\))?\s+)?(?:(?:async|unsafe|const|extern\s+\"\w+\")\s+)*fn\s+\w"
    r"|(?:pub(?:\([\w:]+\))?\s+)?(?:struct|enum|trait|mod|union)\s+\w|export\s|module\s+\w"
    r"|(?:export\s+)?(?:const|let|var)\s+\w+(?:\s*:[^=]+)?\s*=\s*(?:async\s+)?"
    r"(?:function\b|\([^)]*\)\s*(?::[^=]+)?=>|\w+\s*=>)"
    r"|(?:(?:public|private|protected|internal|static|final|abstract|override|virtual|sealed)\s+)+"
    r"(?:[\w<>\[\],.?]+\s+)*\w+\s*\(|(?:(?:public|private|protected|static|final|abstract|sealed)\s+)*"
    r"(?:class|interface|enum|record)\s+\w|(?:typedef\s+)?(?:struct|union|enum)\s+\w+\s*\{?\s*$"
    r"|(?:async\s+)?def\s+\w)")
DEF_WORDS_RE = re.compile(
    r"\s*(?:export|default|async|function|abstract|class|declare|interface|enum|namespace|type|impl|func|pub"
    r"|unsafe|const|extern|fn|struct|trait|mod|union|module|let|var|public|private|protected|internal"
    r"|static|final|override|virtual|sealed|record|typedef|def)\b")
# C-like "type name(args) {" at column 0 (input cut to 300 chars first, so backtracking stays cheap).
C_FN_RE = re.compile(r"(?!(?:if|for|while|switch|return|else|do|case)\b)[A-Za-z_][\w*&:<>, ]*[ *&]"
                     r"[A-Za-z_~][\w:~]*\s*\([^;]*\)\s*(?:const\s*)?\{?\s*$")
# DEF_WORDS_RE opens (after blanks) with one of its words: their first two letters, told with a set lookup.
_DEF_OPENINGS = frozenset(word[:2] for word in DEF_WORDS_RE.pattern.split("(?:", 1)[1].split(")", 1)[0]
                          .split("|"))
# CODE_LINE_RE's second branch after the blanks it opens with (none of its words opens with a blank).
_CODE_START_RE = re.compile(CODE_LINE_RE.pattern.split(r"|^\s*", 1)[1])
# A C-like signature ends so (C_FN_RE's tail, blanks stripped).
_C_FN_ENDS = (")", "{", "const")
_C_FN_OPENS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")
# Every line LEVEL_RE finds holds one of these.
_LEVEL_HINTS = ("TRACE", "DEBUG", "INFO", "NOTICE", "WARN", "ERR", "FATAL", "CRITICAL", "PANIC", "level")
PY_HINT_RE = re.compile(r"^[ \t]*(?:(?:async[ \t]+)?def|class|import|from)[ \t]", re.M)
SHELL_RE = re.compile(r"(?<![a-z])(?:bash|shell|exec|run|command|terminal|cmd)(?![a-z])", re.I)
FUNCS = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass
class _Analysis:
    kind: str
    lines: list[str]
    doc: object = None  # parsed JSON
    tree: ast.Module | None = None
    content: list[str] | None = None  # lines without a file-read gutter
    offset: int = 0  # first gutter number - 1, so a digest shows the file's own line numbers
    json_error: str = ""
    base: int = 0  # lines before this text in the tool result (a harness wrapper): L numbers add it


def _strip_gutter(lines: list[str]) -> tuple[list[str], int]:
    first = next((line for line in lines if line.strip()), "")
    if not GUTTER_RE.match(first):  # every line but blank ones needs its gutter: most outputs fail here
        return lines, 0
    matches = [GUTTER_RE.match(line) for line in lines]
    nums = [int(m[1]) for m in matches if m]
    if len(nums) < 2 or any(not m and line.strip() for m, line in zip(matches, lines, strict=True)) \
            or any(b != a + 1 for a, b in itertools.pairwise(nums)):
        return lines, 0
    return [line[m.end():] if m else line for m, line in zip(matches, lines, strict=True)], nums[0] - 1


def _is_def(line: str) -> bool:
    head = line[:300]
    # Cheap necessary conditions first: every DEF_RE branch opens with one of DEF_WORDS (an alternation of
    # 37 words is slow to fail even where anchored: their first two letters are looked up first), and a C-like
    # signature opens with a letter and ends with its parenthesis (a regex that backtracks over the line
    # is tried only then).
    return bool((head.lstrip()[:2] in _DEF_OPENINGS and DEF_WORDS_RE.match(head) and DEF_RE.match(head))
                or (head[:1] in _C_FN_OPENS and head.rstrip().endswith(_C_FN_ENDS) and "(" in head
                    and C_FN_RE.match(head)))


def _looks_like_code(sample: list[str]) -> bool:
    """At least six tenths of the lines code-like, or four tenths and a definition among them; read only
    until that is settled either way (most text settles as not code well before its end)."""
    n, code, defs, left = len(sample), 0, 0, len(sample)
    for line in sample:
        left -= 1
        is_def = _is_def(line)
        if is_def or _code_line(line[:300]):
            code, defs = code + 1, defs + is_def
            if code * 10 >= n * 6 or (defs and code * 10 >= n * 4):
                return True
        elif (code + left) * 10 < n * 4:
            return False
    return False


def _code_line(head: str) -> bool:
    """`CODE_LINE_RE.search(head)` without a search from every position: its first branch is a line whose
    last non-blank is one of `{};:`, its second is anchored (str.strip and the regex's \\s agree on what a
    blank is, and `head` holds no line break)."""
    last = head.rstrip()[-1:]
    return (last != "" and last in "{};:") or _CODE_START_RE.match(head.lstrip()) is not None


def _log_lines(sample: list[str]) -> int:
    """How many lines of `sample` are log lines: a time in the first 40 characters (TS_RE) or a level in the
    first 80 (LEVEL_RE). A level is looked for only in the lines that hold one of its words, a time only in
    those with a colon in the right place."""
    heads = [line[:80] for line in sample]
    text, starts = joined(heads)
    levels = {i for i in lines_with(text, _LEVEL_HINTS, starts) if LEVEL_RE.search(heads[i])}
    times = {i for i in lines_with(text, (":",), starts) if i not in levels and _has_time(heads[i][:40])}
    return len(levels) + len(times)


def _has_time(head: str) -> bool:
    """`TS_RE.search(head)`, tried only where a colon has two digits on each side (both branches hold that:
    the regex alone tries every position)."""
    colon = head.find(":", 2)
    while colon != -1:
        if head[colon - 2:colon].isdigit() and head[colon + 1:colon + 3].isdigit():
            return TS_RE.search(head) is not None
        colon = head.find(":", colon + 1)
    return False


def _error_lines(sample: list[str]) -> int:
    """How many lines of `sample` hold an error word (has_error_word)."""
    text, starts = joined(sample)
    if text.isascii():  # (as has_error_word: there, the lower-cased text holds the words themselves)
        return len(lines_with(text.lower(), ERR_WORDS, starts))
    return sum(map(has_error_word, sample))


def _analyze(text: str, tool_name: str | None = None) -> _Analysis:
    lines, stripped, json_error = text.splitlines(), text.strip(), ""
    if stripped[:1] in ("{", "["):
        try:
            doc = shallow_json.loads(stripped)  # (text nested past its limit is read as text)
            if isinstance(doc, dict | list):
                return _Analysis("json", lines, doc=doc)
        except json.JSONDecodeError as e:
            json_error = f"{e.msg}, char {e.pos}"
        except ValueError:  # nested too deeply, or an int over the str-conversion limit
            json_error = "unparseable"
    content, offset = _strip_gutter(lines)
    source = "\n".join(content)
    try:  # the cheap pre-check spares ast.parse a megabyte of "a+a+a…" that happens to be valid Python
        tree = ast.parse(source) if PY_HINT_RE.search(source) else None
        if tree and any(isinstance(n, FUNCS | ast.ClassDef | ast.Import | ast.ImportFrom)
                        for n in ast.walk(tree)):
            return _Analysis("python", lines, tree=tree, content=content, offset=offset)
    except Exception:  # SyntaxError, ValueError (NUL), RecursionError: simply not Python
        pass
    sample = [c for c in content[:SCAN_LINES] if c.strip()]
    kind = "text"
    if sample and _log_lines(sample) * 10 >= len(sample) * 3:
        kind = "log"
    elif len(sample) >= 3 and not (tool_name and SHELL_RE.search(tool_name)):
        # Shell output is a log even with braces in it; a .py read through a shell already hit "python".
        kind = "code" if _looks_like_code(sample) else kind
    if kind == "text" and sample and _error_lines(sample) * 10 >= len(sample) * 2:
        kind = "log"
    return _Analysis(kind, lines, content=content, offset=offset, json_error=json_error)
