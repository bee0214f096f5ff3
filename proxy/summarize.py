"""Deterministic summaries of large tool results.

The proxy swaps a big tool result for this summary and the model fetches the original on demand, so the
summary must answer "do I need the original?". It keeps ids, paths, numbers and error lines verbatim and
never rewrites a kept line: a line is kept whole, dropped, or cut with an explicit "…[+N chars]" marker.
Line numbers (``L12``) follow ``str.splitlines()``, the numbering read_tool_result uses for ranges.
"""

from __future__ import annotations

import ast
import itertools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["detect_kind", "gist", "summarize"]

HEAD_LINES, TAIL_LINES = 10, 10
LINE_W, ERR_W, ITEM_W, VALUE_W = 200, 320, 240, 120  # widths beyond which a kept line is cut, marked
MAX_ERR, MAX_PATHS, MAX_ID_KEYS, MAX_FIELDS, MAX_DEPTH = 300, 200, 8, 12, 5  # depth: +1 per object or array
SAMPLE = 50  # array items merged into a shape: bounded so huge arrays stay cheap
SCAN_LINES = 2000  # kind detection reads the start only: enough to classify, bounded cost

ERR_RE = re.compile(r"(?i)error|warn|exception|traceback|fail|fatal|panic|denied|refused|timeout|timed out"
                    r"|assert")
FRAME_RE = re.compile(r'^\s*File "[^"]*", line \d+')
TB_RE = re.compile(r"Traceback \(most recent call last\):")
TS_RE = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d|\b\d\d:\d\d:\d\d\b")
LEVEL_RE = re.compile(r"\b(?:TRACE|DEBUG|INFO|NOTICE|WARN|WARNING|ERROR|ERR|FATAL|CRITICAL|PANIC)\b"
                      r"|\blevel[\"']?\s*[=:]")
# Every character a path may contain is in the lookbehind, so a match only starts at the beginning of a
# run: the scan stays linear even on a megabyte-long single line.
PATH_RE = re.compile(r"(?<![\w/.@+\\:~-])(?:(?:~|\.\.?)/[\w.@+-]+(?:/[\w.@+-]+)*|/[\w.@+-]+(?:/[\w.@+-]+)+"
                     r"|/[\w@+-][\w.@+-]*\.[A-Za-z]\w{0,7}\b|(?:[\w.@+-]+/)+[\w@+-][\w.@+-]*\.[A-Za-z]\w{0,7}\b"
                     r"|[A-Za-z]:\\[^\s\"'<>|*?]+)")
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
# C-like "type name(args) {" at column 0 (input cut to 300 chars first, so backtracking stays cheap).
C_FN_RE = re.compile(r"(?!(?:if|for|while|switch|return|else|do|case)\b)[A-Za-z_][\w*&:<>, ]*[ *&]"
                     r"[A-Za-z_~][\w:~]*\s*\([^;]*\)\s*(?:const\s*)?\{?\s*$")
PY_HINT_RE = re.compile(r"^[ \t]*(?:(?:async[ \t]+)?def|class|import|from)[ \t]", re.M)
SHELL_RE = re.compile(r"bash|shell|exec|run|command|terminal|cmd", re.I)
STRONG_ID_KEYS = frozenset({"id", "uuid", "key", "sku", "code", "number"})
ID_KEYS = STRONG_ID_KEYS | {"name", "title", "slug", "filename", "path", "url", "email"}
JSON_ID_RE = re.compile(r'"([A-Za-z_][\w-]{0,40})"\s*:\s*("(?:[^"\\\n]|\\.){0,300}"|-?\d{1,30}\b)')
BREAK_RE = re.compile(r"[\r\n\x0b\x0c\x1c-\x1e\x85\u2028\u2029]")  # everything splitlines() breaks on
FUNCS = ast.FunctionDef | ast.AsyncFunctionDef
NOUNS = {"object": "objects", "str": "strings", "": "items"}  # JSON array element types -> header noun


def _clip(s: str, width: int) -> str:
    """s, or its start plus an explicit '…[+N chars]' marker, so a cut is never silent."""
    if len(s) <= width:
        return s
    keep = max(width - len(f"…[+{len(s)} chars]"), 0)
    return f"{s[:keep]}…[+{len(s) - keep} chars]"


def _plural(n: int, word: str, many: str = "") -> str:
    return f"{n} {word if n == 1 else many or word + 's'}"


def _distinct(values: list[str]) -> list[str]:
    return list(dict.fromkeys(values))  # ordered de-dup: iterating a set would depend on hash seeds


def _numbered(lines: list[str], indices: list[int] | range, width: int) -> list[str]:
    return [f"L{i + 1}: {_clip(lines[i], width)}" for i in indices]


def _size(lines: list[str]) -> int:
    return sum(len(line) + 1 for line in lines)


@dataclass
class _Sec:
    """Output lines that the layout may shorten, always leaving a '(+N more …)' note."""

    items: list[str]
    title: str = ""  # own line for blocks, prefix for inline lists
    what: str = "lines"
    weight: int = 1
    inline: bool = False  # items joined with ", " on one line (ids, paths) instead of one per line
    tail: bool = False  # keep the last items when cutting (end of a log)
    extra: int = 0  # items already dropped by a collection cap

    def _note(self, k: int) -> str:
        rest = len(self.items) - k + self.extra
        return f"(+{rest} more{' ' + self.what if self.what else ''})" if rest else ""

    def _cost(self, k: int, chars: int) -> int:
        note = self._note(k)
        if self.inline:
            return len(self.title) + chars + 2 * max(k - 1, 0) + (len(note) + (k > 0) if note else 0) + 1
        return (len(self.title) + 1 if self.title else 0) + chars + k + (len(note) + 1 if note else 0)

    def render(self, budget: int) -> list[str]:
        """The most items that fit in budget chars (each line costs len + 1), or nothing."""
        items = self.items[::-1] if self.tail else self.items
        k, chars = len(items), sum(map(len, items))
        while k and self._cost(k, chars) > budget:
            k -= 1
            chars -= len(items[k])
        if self._cost(k, chars) > budget:
            return []
        kept, note = (items[:k][::-1] if self.tail else items[:k]), self._note(k)
        if self.inline:
            return [self.title + ", ".join(kept) + (" " if kept and note else "") + note]
        body = [note, *kept] if self.tail else [*kept, note]
        return ([self.title] if self.title else []) + [line for line in body if line]


def _layout(secs: list[_Sec], max_chars: int) -> str:
    """Share max_chars among sections by weight; a section needing less than its share hands it on."""
    secs = [s for s in secs if s.items or s.extra]
    need = [_size(s.render(1 << 60)) for s in secs]
    alloc, left, active = [0] * len(secs), max_chars + 1, list(range(len(secs)))
    while active:
        wsum = sum(secs[i].weight for i in active)
        fits = [i for i in active if need[i] * wsum <= left * secs[i].weight]
        for i in fits or active:
            alloc[i] = need[i] if fits else left * secs[i].weight // wsum
        left -= sum(need[i] for i in fits)
        active = [i for i in active if i not in fits] if fits else []
    out = [s.render(a) for s, a in zip(secs, alloc, strict=True)]
    # Whole-line granularity leaves slack: hand it to cut sections, heaviest first (sorted() is stable).
    spare = max_chars + 1 - sum(map(_size, out))
    for i in sorted(range(len(secs)), key=lambda i: -secs[i].weight):
        if spare > 0 and _size(out[i]) < need[i]:
            new = secs[i].render(_size(out[i]) + spare)
            spare, out[i] = spare - _size(new) + _size(out[i]), new
    return "\n".join(line for lines in out for line in lines)


@dataclass
class _Analysis:
    kind: str
    lines: list[str]
    doc: object = None  # parsed JSON
    tree: ast.Module | None = None
    content: list[str] | None = None  # lines without a file-read gutter
    offset: int = 0  # first gutter number - 1, so a digest shows the file's own line numbers
    json_error: str = ""


def _strip_gutter(lines: list[str]) -> tuple[list[str], int]:
    matches = [GUTTER_RE.match(line) for line in lines]
    nums = [int(m[1]) for m in matches if m]
    if len(nums) < 2 or any(not m and line.strip() for m, line in zip(matches, lines, strict=True)) \
            or any(b != a + 1 for a, b in itertools.pairwise(nums)):
        return lines, 0
    return [line[m.end():] if m else line for m, line in zip(matches, lines, strict=True)], nums[0] - 1


def _is_def(line: str) -> bool:
    return bool(DEF_RE.match(line[:300]) or C_FN_RE.match(line[:300]))


def _analyze(text: str, tool_name: str | None = None) -> _Analysis:
    lines, stripped, json_error = text.splitlines(), text.strip(), ""
    if stripped[:1] in ("{", "["):
        try:
            doc = json.loads(stripped)
            if isinstance(doc, dict | list):
                return _Analysis("json", lines, doc=doc)
        except json.JSONDecodeError as e:
            json_error = f"{e.msg} at char {e.pos}"
        except Exception:  # RecursionError, or an int over the str-conversion limit
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
    n, kind = max(len(sample), 1), "text"
    if sum(bool(TS_RE.search(c[:40]) or LEVEL_RE.search(c[:80])) for c in sample) * 10 >= n * 3:
        kind = "log"
    elif len(sample) >= 3 and not (tool_name and SHELL_RE.search(tool_name)):
        # Shell output is a log even with braces in it; a .py read through a shell already hit "python".
        defs = sum(map(_is_def, sample))
        code = sum(bool(CODE_LINE_RE.search(c[:300])) or _is_def(c) for c in sample)
        kind = "code" if (code * 10 >= n * 4 and defs) or code * 10 >= n * 6 else kind
    if kind == "text" and sample and sum(bool(ERR_RE.search(c)) for c in sample) * 5 >= n:
        kind = "log"
    return _Analysis(kind, lines, content=content, offset=offset, json_error=json_error)


def _tname(v: object) -> str:
    if v is None or isinstance(v, bool):
        return "null" if v is None else "bool"
    return {int: "int", float: "float", str: "str", dict: "object", list: "array"}.get(type(v), "value")


def _dump(v: object) -> str:
    try:
        return json.dumps(v, ensure_ascii=False)
    except Exception:
        return repr(v)


def _fields(dicts: list[dict], depth: int) -> list[str]:
    by_key: dict[str, list[object]] = {}
    for d in dicts:
        for k, v in d.items():
            by_key.setdefault(k, []).append(v)
    return [f"{k}{'' if len(vs) == len(dicts) else '?'}: {_shape(vs, depth)}" for k, vs in by_key.items()]


def _shape(values: list[object], depth: int) -> str:
    """Merged shape of sample values, e.g. 'str|null', 'array[3] of {sku: str, qty: int}'."""
    parts = []
    for t in _distinct([_tname(v) for v in values[:SAMPLE]]):
        if t == "object":
            fields = _fields([v for v in values[:SAMPLE] if isinstance(v, dict)], depth + 1) \
                if depth < MAX_DEPTH else ["…"]
            more = f", +{len(fields) - MAX_FIELDS} keys" if len(fields) > MAX_FIELDS else ""
            parts.append("{" + ", ".join(fields[:MAX_FIELDS]) + more + "}")
        elif t == "array":
            arrays = [v for v in values[:SAMPLE] if isinstance(v, list)]
            lo, hi = min(map(len, arrays)), max(map(len, arrays))
            items = [x for a in arrays for x in a[:SAMPLE]][:SAMPLE]
            inner = "" if not items else " of …" if depth >= MAX_DEPTH else f" of {_shape(items, depth + 1)}"
            parts.append(f"array[{lo if lo == hi else f'{lo}..{hi}'}]{inner}")
        else:
            parts.append(t)
    return "|".join(parts)


def _is_id_key(key: str) -> bool:
    low = key.lower()
    return low in ID_KEYS or low.endswith(("_id", "-id")) or (len(key) > 2 and key.endswith(("Id", "ID")))


def _id_value(v: object) -> str:
    s = v if isinstance(v, str) else _dump(v)
    if not s or ", " in s or s != s.strip() or BREAK_RE.search(s):
        s = _dump(s)  # quoted only when the bare value would be ambiguous in a ", " list
    return _clip(s, VALUE_W)


def _collect_ids(doc: object) -> dict[str, dict[str, None]]:
    """Values of id-like keys anywhere in the document, per key, de-duplicated in document order."""
    found: dict[str, dict[str, None]] = {}
    stack = [doc]  # explicit stack: json.loads accepts nesting deeper than our recursion limit
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for k, v in node.items():
                if isinstance(v, str | int | float) and not isinstance(v, bool) and _is_id_key(k):
                    found.setdefault(k, {})[_id_value(v)] = None
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend(c for c in reversed(list(children)) if isinstance(c, dict | list))
    return found


def _id_secs(found: dict[str, dict[str, None]]) -> list[_Sec]:
    def weight(key: str) -> int:  # real identifiers before names and titles
        return 4 if key.lower() in STRONG_ID_KEYS or key.lower().endswith(("_id", "id")) else 2

    secs = [_Sec(list(vals), f"{_clip(k, 40)} ({len(vals)} distinct): ", "", weight(k), inline=True)
            for k, vals in list(found.items())[:MAX_ID_KEYS]]
    return secs + [_Sec([f"(+{len(found) - MAX_ID_KEYS} more id-like keys)"])] * (len(found) > MAX_ID_KEYS)


def _json_title(doc: dict | list) -> str:
    if isinstance(doc, dict):
        return f"JSON object with {_plural(len(doc), 'key')}"
    types = _distinct([_tname(v) for v in doc])
    noun = NOUNS.get("|".join(types), f"items ({'|'.join(types)})")
    return f"JSON array of {len(doc)} {noun}"


def _json_summary(doc: dict | list, text: str, max_chars: int) -> str:
    if isinstance(doc, list):
        dicts = [v for v in doc[:SAMPLE] if isinstance(v, dict)]
        shape = [_clip(f, LINE_W) for f in _fields(dicts, 1)] if dicts else [_clip(_shape(doc, 1), LINE_W)]
        secs = [_Sec([f"{_json_title(doc)}, {len(text)} chars"], weight=50),
                _Sec(shape if doc else [], "item fields:" if dicts else "items:", "fields", 3),
                _Sec([_clip(f"[{i}] {_dump(v)}", ITEM_W) for i, v in enumerate(doc[:3])], "first items:",
                     "items", 2)]
    else:
        arrays = [(k, v) for k, v in doc.items() if isinstance(v, list) and v][:3]
        secs = [_Sec([f"{_json_title(doc)}, {len(text)} chars"], weight=50),
                _Sec([_clip(f"{k} = {_dump(v)}", LINE_W) for k, v in doc.items()
                      if not isinstance(v, dict | list)], "fields:", "fields", 4),
                _Sec([_clip(f"{k}: {_shape([v], 1)}", LINE_W) for k, v in doc.items()
                      if isinstance(v, dict | list)], "structure:", "keys", 3),
                _Sec([_clip(f"{k}[{i}] {_dump(x)}", ITEM_W) for k, v in arrays for i, x in enumerate(v[:3])],
                     "samples:", "samples", 2)]
    return _layout(secs + _id_secs(_collect_ids(doc)), max_chars)


def _source(lines: list[str]) -> Callable[[ast.AST], str]:
    """Source text of a one-line node as written (quotes, spacing); ast.unparse for anything else."""
    def seg(node: ast.AST) -> str:
        lineno, end = getattr(node, "lineno", 0), getattr(node, "end_lineno", -1)
        if lineno == end and 0 < lineno <= len(lines):
            raw = lines[lineno - 1].encode("utf-8", "surrogatepass")
            start, stop = getattr(node, "col_offset", 0), getattr(node, "end_col_offset", 0)
            if text := raw[start:stop].decode("utf-8", "replace"):
                return text
        return ast.unparse(node)
    return seg


def _signature(fn: ast.FunctionDef | ast.AsyncFunctionDef, src: Callable[[ast.AST], str]) -> str:
    def one(arg: ast.arg, default: ast.expr | None, star: str = "") -> str:
        s = star + arg.arg + (f": {src(arg.annotation)}" if arg.annotation else "")
        return s + ((" = " if arg.annotation else "=") + src(default) if default else "")

    a = fn.args
    positional = a.posonlyargs + a.args
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    parts = [one(arg, d) for arg, d in zip(positional, defaults, strict=True)]
    if a.posonlyargs:
        parts.insert(len(a.posonlyargs), "/")
    if a.vararg or a.kwonlyargs:
        parts.append(one(a.vararg, None, "*") if a.vararg else "*")
    parts += [one(arg, d) for arg, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)]
    if a.kwarg:
        parts.append(one(a.kwarg, None, "**"))
    decos = "".join(f"@{src(d)} " for d in fn.decorator_list)
    kw = "async def" if isinstance(fn, ast.AsyncFunctionDef) else "def"
    return f"{decos}{kw} {fn.name}({', '.join(parts)})" + (f" -> {src(fn.returns)}" if fn.returns else "")


def _module_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """Module-level statements, including those inside top-level if/try/with blocks."""
    out: list[ast.stmt] = []
    for node in body:
        out.append(node)
        if isinstance(node, ast.If | ast.Try | ast.With):
            for block in (node.body, getattr(node, "orelse", []), getattr(node, "finalbody", []),
                          *(h.body for h in getattr(node, "handlers", []))):
                out += _module_level(block)
    return out


def _doc_line(node: ast.AST) -> str:
    doc = ast.get_docstring(node) if isinstance(node, ast.Module | ast.ClassDef | FUNCS) else None
    return _clip(next((ln.strip() for ln in (doc or "").splitlines() if ln.strip()), ""), VALUE_W)


def _python_summary(an: _Analysis, max_chars: int) -> str:
    assert an.tree is not None and an.content is not None
    src, off = _source(an.content), an.offset
    imports: list[str] = []
    consts: list[str] = []
    symbols: list[tuple[str, str]] = []  # ("L12 def f(...)", '    "first docstring line"'), indented
    counts = {"function": 0, "class": 0, "method": 0}

    def add(node: ast.AST, indent: str) -> None:
        if isinstance(node, FUNCS):
            counts["method" if indent else "function"] += 1
            line = _signature(node, src)
        elif isinstance(node, ast.ClassDef) and len(indent) < 4:
            counts["class"] += not indent
            bases = [src(b) for b in node.bases]
            bases += [f"{k.arg}={src(k.value)}" if k.arg else f"**{src(k.value)}" for k in node.keywords]
            decos = "".join(f"@{src(d)} " for d in node.decorator_list)
            line = f"{decos}class {node.name}" + (f"({', '.join(bases)})" if bases else "")
        else:
            return
        doc = _doc_line(node)
        symbols.append((f"{indent}L{node.lineno + off} {line}", f'{indent}    "{doc}"' if doc else ""))
        for child in node.body if isinstance(node, ast.ClassDef) else ():
            add(child, indent + "  ")

    for node in _module_level(an.tree.body):
        if isinstance(node, ast.Import):
            imports += [a.name + (f" as {a.asname}" if a.asname else "") for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in node.names)
            imports.append(f"{'.' * node.level}{node.module or ''} ({names})")
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            consts += [name for name in names if name.isupper() or name == "__all__"]
        else:
            add(node, "")
    header = [f"Python module, {len(an.content)} lines, {_plural(counts['function'], 'function')}, "
              f"{_plural(counts['class'], 'class', 'classes')}, {_plural(counts['method'], 'method')}"]
    header += [f'"""{doc}"""' for doc in [_doc_line(an.tree)] if doc]
    full = [line for pair in symbols for line in pair if line]
    # When space is tight, docstrings go first: every signature is worth more than any one docstring.
    lines = full if _size(full) <= max_chars * 0.7 else [sig for sig, _ in symbols]
    return _layout([_Sec(header, weight=50), _Sec(imports, "imports: ", "imports", 2, inline=True),
                    _Sec(consts, "constants: ", "", 1, inline=True),
                    _Sec([_clip(line, LINE_W + 100) for line in lines], "symbols:", "symbol lines", 6)],
                   max_chars)


def _code_summary(an: _Analysis, text: str, max_chars: int) -> str:
    defs = [i for i, c in enumerate(an.content or an.lines) if _is_def(c)]
    header = f"code, {_plural(len(an.lines), 'line')}, {_plural(len(defs), 'definition')}, {len(text)} chars"
    head = [] if defs else _numbered(an.lines, range(min(HEAD_LINES, len(an.lines))), LINE_W)
    return _layout([_Sec([header], weight=50), _Sec(head, "first lines:", "lines", 2),
                    _Sec(_numbered(an.lines, defs, LINE_W), "outline:", "definitions", 6)], max_chars)


def _flagged(lines: list[str]) -> list[int]:
    """Error-ish lines, plus traceback frames, their source lines and the exception that ends them."""
    out: list[int] = []
    in_tb = after_frame = False
    for i, line in enumerate(lines):
        frame = bool(FRAME_RE.match(line))
        hit = frame or bool(ERR_RE.search(line)) or (after_frame and line[:1].isspace())
        if TB_RE.search(line):
            in_tb = True
        elif in_tb and line.strip() and not line[0].isspace():
            hit, in_tb = True, False  # the exception line, e.g. "KeyboardInterrupt" which names no error
        after_frame = frame
        if hit:
            out.append(i)
    return out


def _lines_summary(an: _Analysis, text: str, max_chars: int) -> str:
    lines, n = an.lines, len(an.lines)
    flagged = _flagged(lines)
    shown = set(flagged[:MAX_ERR])  # membership only, never iterated
    split = n if n <= HEAD_LINES + TAIL_LINES else HEAD_LINES
    head = _numbered(lines, [i for i in range(split) if i not in shown], LINE_W)
    tail = _numbered(lines, [i for i in range(max(split, n - TAIL_LINES), n) if i not in shown], LINE_W)
    notes = f"; starts like JSON but does not parse ({an.json_error})" if an.json_error else ""
    if len(text) >= 200 and re.fullmatch(r"[A-Za-z0-9+/=_\-\s]+", text[:100_000]):
        notes += "; looks like base64"
    header = (f"{an.kind}, {_plural(n, 'line')}, {_plural(len(flagged), 'error line')}, {len(text)} chars"
              f"{notes}" if text else f"{an.kind}, empty")
    paths = [_clip(p, VALUE_W) for p in _distinct([m.group().rstrip(".,") for m in PATH_RE.finditer(text)])]
    secs = [_Sec([_clip(header, LINE_W)], weight=50),
            _Sec(head, "lines:" if split == n else "first lines:", "lines", 2),
            _Sec(_numbered(lines, flagged[:MAX_ERR], ERR_W), "error/warning lines:",
                 "error lines", 5, extra=max(len(flagged) - MAX_ERR, 0)),
            _Sec(tail, "last lines:", "lines", 2, tail=True),
            _Sec(paths[:MAX_PATHS], "paths: ", "paths", 1, inline=True, extra=max(len(paths) - MAX_PATHS, 0))]
    if an.json_error:  # truncated or broken JSON still carries ids worth keeping
        found: dict[str, dict[str, None]] = {}
        for m in JSON_ID_RE.finditer(text):
            if _is_id_key(m[1]):
                found.setdefault(m[1], {})[_id_value(m[2][1:-1] if m[2][:1] == '"' else m[2])] = None
        secs += _id_secs(found)
    return _layout(secs, max_chars)


def detect_kind(text: str) -> str:
    """'json' | 'python' | 'code' | 'log' | 'text'."""
    try:
        return _analyze(text).kind
    except Exception:
        return "text"


def summarize(text: str, *, tool_name: str | None = None, max_chars: int = 2400) -> str:
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
