"""Source code summaries: a Python digest from the AST, an outline of definitions for other languages."""

from __future__ import annotations

import ast
from collections.abc import Callable

from .common import HEAD_LINES, LINE_W, VALUE_W, _clip, _layout, _numbered, _plural, _Sec, _size
from .detect import FUNCS, _Analysis, _is_def
from .salient import salient_secs


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


def _python_summary(an: _Analysis, max_chars: int, cap: int | None = None, extra: list[_Sec] | None = None,
                    text: str = "") -> str:
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
            assigned = [t.id for t in targets if isinstance(t, ast.Name)]
            consts += [name for name in assigned if name.isupper() or name == "__all__"]
        else:
            add(node, "")
    header = [f"Python module, {len(an.content)} lines, {_plural(counts['function'], 'function')}, "
              f"{_plural(counts['class'], 'class', 'classes')}, {_plural(counts['method'], 'method')}"]
    header += [f'"""{doc}"""' for doc in [_doc_line(an.tree)] if doc]
    full = [line for pair in symbols for line in pair if line]
    # When space is tight, docstrings go first: every signature is worth more than any one docstring.
    lines = full if _size(full) <= max_chars * 0.7 else [sig for sig, _ in symbols]
    secs = [_Sec(header, weight=50, critical=True), *(extra or []),
            _Sec(imports, "imports: ", "imports", 2, inline=True),
            _Sec(consts, "constants: ", "", 1, inline=True),
            _Sec([_clip(line, LINE_W + 100) for line in lines], "symbols:", "symbol lines", 6)]
    return _layout(secs + salient_secs(an.lines, text, an.base, warnings=False), max_chars, cap)


def _code_summary(an: _Analysis, text: str, max_chars: int, cap: int | None = None,
                  extra: list[_Sec] | None = None) -> str:
    defs = [i for i, c in enumerate(an.content or an.lines) if _is_def(c)]
    header = f"code, {_plural(len(an.lines), 'line')}, {_plural(len(defs), 'definition')}, {len(text)} chars"
    head = [] if defs else _numbered(an.lines, range(min(HEAD_LINES, len(an.lines))), LINE_W, an.base)
    outline = _numbered(an.lines, defs, LINE_W, an.base)
    secs = [_Sec([header], weight=50, critical=True), *(extra or []), _Sec(head, "first lines:", "lines", 2),
            _Sec(outline, "outline:", "definitions", 6)]
    return _layout(secs + salient_secs(an.lines, text, an.base, warnings=False), max_chars, cap)

