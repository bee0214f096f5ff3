"""Deterministic tool-result summaries: hard size cap, verbatim ids/signatures/error lines, never raising."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.summarize import detect_kind, gist, summarize
from proxy.summarize.common import ERR_RE, has_error_word
from proxy.summarize.detect import C_FN_RE, DEF_RE, LEVEL_RE, TS_RE, _is_def, _log_lines

ROOT = Path(__file__).resolve().parent.parent
NUMBERED = re.compile(r"^\s*L(\d+): (.*)$")
MARKER = re.compile(r"…\[\+(\d+) chars\]$")


def orders(n: int = 500) -> list[dict]:
    return [{"id": f"ord_{i:06d}", "customer_id": f"cus_{i % 37:04d}", "status": ["paid", "open"][i % 2],
             "total": round(i * 1.25, 2), "lines": [{"sku": f"SKU-{i % 11}", "qty": i % 4 + 1}]}
            for i in range(n)]


PY_SOURCE = '''"""HTTP helpers for the crawler.

More detail that a digest does not need.
"""
import os
from typing import Any

DEFAULT_TIMEOUT = 5.0


def fetch(url: str, *, timeout: float = 5.0) -> bytes:
    """Fetch a URL and return the raw body."""
    body = BODY_MARKER_ONE(url, timeout)
    return body


@decorated
async def stream(path: str, /, chunk: int = 65_536, *parts: str, mode: str = "rb", **extra: Any) -> None:
    for part in BODY_MARKER_TWO:
        yield part


class Client(Base, metaclass=Meta):
    """A small client with retries."""

    def __init__(self, base_url: str, retries: int = 3) -> None:
        self.base_url = BODY_MARKER_THREE

    def get(self, path: str, **params: Any) -> dict[str, Any]:
        """GET a path."""
        return {"marker": "BODY_MARKER_FOUR"}
'''

JS_SOURCE = """import { readFile } from "fs";

export function parse(text, opts = {}) {
  const rows = text.split("\\n");
  return rows.map((r) => r.trim());
}

export const load = async (path) => {
  return parse(await readFile(path, "utf8"));
};

class Store extends Base {
  constructor(db) {
    this.db = db;
  }
}

interface Row { id: string; }
"""

GO_SOURCE = """package store

import "fmt"

type Store struct {
\tdb *DB
}

func (s *Store) Get(id string) (*Row, error) {
\treturn s.db.Find(id)
}

func New() *Store {
\treturn &Store{}
}
"""

RUST_SOURCE = """use std::collections::HashMap;

pub struct Cache {
    map: HashMap<String, u64>,
}

impl Cache {
    pub fn get(&self, key: &str) -> Option<u64> {
        self.map.get(key).copied()
    }
}

pub(crate) async fn refresh(cache: &mut Cache) -> Result<(), Error> {
    Ok(())
}
"""


def service_log(n: int = 5000) -> tuple[str, dict[int, str]]:
    """A 5,000-line log with 7 scattered ERROR lines and one traceback; returns text and {line_no: line}."""
    lines = [f"2024-05-01T10:{i // 60 % 60:02d}:{i % 60:02d}Z INFO worker.{i % 5} processed batch {i} "
             f"in {i % 97}ms" for i in range(n)]
    wanted: dict[int, str] = {}
    for k, at in enumerate(p * n // 5000 for p in [7, 480, 1333, 2001, 2999, 4100, 4996]):
        lines[at - 1] = f"2024-05-01T11:00:0{k}Z ERROR worker.{k} write to shard-{k} failed: code={500 + k}"
        wanted[at] = lines[at - 1]
    traceback = ["Traceback (most recent call last):", '  File "/srv/app/worker.py", line 88, in main',
                 "    process(batch)", '  File "/srv/app/db.py", line 12, in process',
                 "    charge(row)", "payments.Declined: card ending 4242 declined"]  # names no error
    lines[2500 * n // 5000] += " from /var/data/orders-2024.parquet"  # a path only the paths line keeps
    start = 3500 * n // 5000
    lines[start:start + len(traceback)] = traceback
    wanted |= {start + 1 + j: line for j, line in enumerate(traceback)}
    return "\n".join(lines), wanted


def check_numbered_lines_are_verbatim(summary: str, original: str) -> int:
    """Every 'L<n>: ...' line is line n of the original, whole or cut with an exact '…[+N chars]' marker."""
    source = original.splitlines()
    checked = 0
    for line in summary.splitlines():
        m = NUMBERED.match(line)
        if not m or not 1 <= int(m[1]) <= len(source):
            continue
        kept, full = m[2], source[int(m[1]) - 1]
        cut = MARKER.search(kept)
        if kept != full:
            assert cut is not None, (line, full)
            prefix = kept[: cut.start()]
            assert full.startswith(prefix) and len(full) - len(prefix) == int(cut[1]), (line, full)
        checked += 1
    return checked


# ---------------------------------------------------------------- determinism and size


SCRIPT = """
import json, sys
from proxy.summarize import gist, summarize
inputs = json.loads(sys.stdin.read())
print(json.dumps([[summarize(t, max_chars=900), summarize(t), gist(t)] for t in inputs]))
"""


def test_same_input_same_bytes_even_across_hash_seeds():
    log, _ = service_log(400)
    inputs = [json.dumps(orders(300)), json.dumps({"status": "ok", "data": orders(50), "tags": ["a", "b"]}),
              PY_SOURCE, JS_SOURCE, log, "plain words\n" * 50, '{"id": "x", "name": "broken', ""]
    assert [summarize(t) for t in inputs] == [summarize(t) for t in inputs]
    runs = []
    for seed in ("1", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run([sys.executable, "-c", SCRIPT], input=json.dumps(inputs), capture_output=True,
                              text=True, env=env, cwd=ROOT, check=True, timeout=60)
        runs.append(done.stdout)
    assert runs[0] == runs[1]
    assert json.loads(runs[0])[0][1] == summarize(inputs[0])


@settings(max_examples=300, deadline=None)
@given(text=st.text(), max_chars=st.integers(0, 3000))
def test_hard_cap_and_gist_on_arbitrary_text(text, max_chars):
    out = summarize(text, max_chars=max_chars)
    assert len(out) <= max_chars
    assert summarize(text, max_chars=max_chars) == out
    g = gist(text)
    assert len(g) <= 120 and len(g.splitlines()) == 1
    assert detect_kind(text) in {"json", "python", "code", "log", "text"}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=8) | st.dictionaries(
        st.sampled_from(["id", "name", "user_id", "items", "status", "url", "é"]) | st.text(max_size=8),
        inner, max_size=6),
    max_leaves=60)
log_line = st.one_of(st.text(max_size=300), st.sampled_from(
    ["ERROR boom", "Traceback (most recent call last):", '  File "/a/b.py", line 3, in f', "ValueError: x",
     "2024-01-01 10:00:00 INFO ok /var/log/app.log", "x" * 5000]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), max_chars=st.integers(40, 3000))
def test_hard_cap_on_large_structured_inputs(data, max_chars):
    shape = data.draw(st.sampled_from(["json", "log", "python"]))
    if shape == "json":
        text = json.dumps(data.draw(st.lists(json_values, min_size=20, max_size=60)), indent=data.draw(
            st.sampled_from([None, 2])))
    elif shape == "log":
        text = "\n".join(data.draw(st.lists(log_line, min_size=50, max_size=400)))
    else:
        names = data.draw(st.lists(st.from_regex(r"[a-z_]{1,30}", fullmatch=True), min_size=1, max_size=80))
        text = "\n".join(f"def {n}(a: int = {i}, *, b: str = 'x' * 40) -> list[int]:\n    '''Doc {i}.'''\n"
                         for i, n in enumerate(names))
    out = summarize(text, max_chars=max_chars)
    assert len(out) <= max_chars
    if len(text) > 4 * max_chars:
        assert len(out) < len(text) / 4
    if shape == "log":
        check_numbered_lines_are_verbatim(out, text)


def test_sixty_kb_inputs_of_every_kind_fit_the_cap():
    log, _ = service_log(5000)
    cases = {"json": json.dumps(orders(500)), "log": log[:60_000], "python": PY_SOURCE, "code": JS_SOURCE,
             "text": "The quick brown fox jumps over the lazy dog.\n"}
    for kind, text in cases.items():
        text = text * (60_000 // len(text) + 1) if len(text) < 60_000 else text
        assert len(text) >= 60_000 and detect_kind(text) == kind
        out = summarize(text, max_chars=2400)
        assert len(out) <= 2400, kind
        assert len(out) < len(text) / 20, kind


# ---------------------------------------------------------------- JSON


def test_records_become_a_table_keeping_every_field_value_verbatim():
    records = orders(500)
    out = summarize(json.dumps(records))
    lines = out.splitlines()
    assert lines[0].startswith("JSON array of 500 objects")
    assert lines[1] == "[] (500 rows)" and lines[2] == "  id | customer_id | status | total"
    for r in records:  # every id, customer, status and price, in order, one row each
        assert f"  {r['id']} | {r['customer_id']} | {r['status']} | {r['total']}" in lines
    # nested records get their own table, each row placed; a repeated row points at its first
    assert "[].lines[] (500 rows)" in lines and "  [0].lines[0] | SKU-0 | 1" in lines
    assert "  [44].lines[0] | = [0].lines[0]" in lines
    assert len(out) < len(json.dumps(records)) * 0.65


def test_a_hard_cap_cuts_table_rows_with_a_count():
    out = summarize(json.dumps(orders(500)), max_chars=2400)
    assert len(out) <= 2400
    rows = [line for line in out.splitlines() if line.startswith("  ord_")]
    assert rows and rows[0].startswith("  ord_000000 | cus_0000 | paid | 0.0")
    assert re.search(r"^\(\+\d+ more rows\)$", out, re.M)


def test_decision_fields_of_nested_records_are_flattened_and_constants_folded():
    flights = [[{"flight_number": f"HAT{i:03d}", "origin": "ATL", "status": "available", "date": "2024-05-24",
                 "prices": {"economy": 100 + i, "business": 400 + i}, "notes": "x" * 300}
                for i in range(j, j + 2)] for j in range(0, 12, 2)]
    out = summarize(json.dumps(flights))
    assert "[][] (12 rows); every row: origin=ATL, status=available, date=2024-05-24" in out
    assert "  at | flight_number | prices.economy | prices.business" in out
    assert "  [0][1] | HAT001 | 101 | 401" in out and "  [5][1] | HAT011 | 111 | 411" in out
    assert "long text left out: [][].notes (12)" in out and "x" * 300 not in out


def test_records_keyed_by_id_and_top_level_fields():
    doc = {"name": "Action Camera", "product_id": "3377618313", "next": None,
           "variants": {f"{k}": {"item_id": f"{k}", "price": 400.25, "available": k % 2 == 0}
                        for k in range(6700049080, 6700049086)},
           "address": {"city": "Denver", "zip": "80298"}}
    lines = summarize(json.dumps(doc)).splitlines()
    assert {"name = Action Camera", "product_id = 3377618313", "address: city = Denver; zip = 80298",
            "null: next"} <= set(lines)
    assert "variants{} (6 rows); every row: price=400.25" in lines  # a shared value is said once
    assert "  item_id | available" in lines  # the key column repeats item_id: left out
    assert "  6700049081 | false" in lines


def test_json_top_level_scalars_and_tables():
    doc = {"status": "error", "message": "quota exceeded for project p-77", "total": 12345, "next": None,
           "data": orders(200), "meta": {"page": {"size": 50, "cursor": "c_9"}}}
    out = summarize("\n  " + json.dumps(doc, indent=2) + "\n")
    lines = out.splitlines()
    assert lines[0].startswith("JSON object with 6 keys")
    for kept in ["status = error", "message = quota exceeded for project p-77", "total = 12345",
                 "meta.page: size = 50; cursor = c_9", "null: next", "data[] (200 rows)"]:
        assert kept in lines
    assert any(line.endswith('  "status": "error",') for line in lines)  # the raw error line, numbered
    assert gist(json.dumps(doc)) == "JSON object with 6 keys (status, message, total, next, data, meta)"


def test_invalid_or_truncated_json_still_keeps_ids():
    text = json.dumps(orders(300))[:-5000]  # cut mid-stream, as a size-limited tool would
    out = summarize(text, max_chars=2400)
    assert detect_kind(text) == "text" and "starts like JSON but does not parse" in out
    assert "ids: ord_000000, cus_0000, SKU-0, ord_000001" in out
    assert len(out) <= 2400


# ---------------------------------------------------------------- code


def test_python_digest_keeps_signatures_verbatim_and_omits_bodies():
    out = summarize(PY_SOURCE, max_chars=2400)
    assert detect_kind(PY_SOURCE) == "python"
    assert out.startswith("Python module, 31 lines, 2 functions, 1 class, 2 methods")
    assert '"""HTTP helpers for the crawler."""' in out
    assert "imports: os, typing (Any)" in out and "constants: DEFAULT_TIMEOUT" in out
    assert "L11 def fetch(url: str, *, timeout: float = 5.0) -> bytes" in out
    assert '"Fetch a URL and return the raw body."' in out
    assert ('L18 @decorated async def stream(path: str, /, chunk: int = 65_536, *parts: str, '
            'mode: str = "rb", **extra: Any) -> None') in out
    assert "L23 class Client(Base, metaclass=Meta)" in out
    assert "  L26 def __init__(self, base_url: str, retries: int = 3) -> None" in out
    assert "  L29 def get(self, path: str, **params: Any) -> dict[str, Any]" in out
    assert "BODY_MARKER" not in out and "More detail" not in out and "yield" not in out
    assert gist(PY_SOURCE) == "Python module, 31 lines, 2 functions, 1 class"


def test_python_digest_uses_file_line_numbers_from_a_numbered_read():
    numbered = "\n".join(f"{i + 100:>6}\t{line}" for i, line in enumerate(PY_SOURCE.splitlines()))
    out = summarize(numbered)
    assert detect_kind(numbered) == "python"
    assert "L110 def fetch(url: str, *, timeout: float = 5.0) -> bytes" in out


def test_big_python_module_drops_docstrings_before_signatures():
    source = "\n".join(f"def handler_{i}(request: Request, *, retries: int = {i}) -> Response:\n"
                       f'    """Handle route {i} with a rather long docstring line."""\n    return None\n'
                       for i in range(120))
    out = summarize(source, max_chars=2400)
    assert len(out) <= 2400
    assert "L1 def handler_0(request: Request, *, retries: int = 0) -> Response" in out
    assert "rather long docstring" not in out
    assert re.search(r"^\(\+\d+ more symbol lines\)$", out, re.M)


def test_other_code_gets_an_outline_of_verbatim_definition_lines():
    for source, expected in [
        (JS_SOURCE, ["L3: export function parse(text, opts = {}) {", "L12: class Store extends Base {",
                     "L8: export const load = async (path) => {", "L18: interface Row { id: string; }"]),
        (GO_SOURCE, ["L5: type Store struct {", "L9: func (s *Store) Get(id string) (*Row, error) {",
                     "L13: func New() *Store {"]),
        (RUST_SOURCE, ["L3: pub struct Cache {", "L7: impl Cache {",
                       "L8:     pub fn get(&self, key: &str) -> Option<u64> {",
                       "L13: pub(crate) async fn refresh(cache: &mut Cache) -> Result<(), Error> {"]),
    ]:
        assert detect_kind(source) == "code", source
        out = summarize(source)
        for line in expected:
            assert line in out.splitlines(), (line, out)
        assert "rows.map" not in out and "self.map.get" not in out and "s.db.Find" not in out
        assert gist(source).startswith("code, ")


def test_shell_tool_output_gets_the_line_treatment_even_when_it_looks_like_code():
    # a diff or compiler output is full of braces; from a shell tool, head/tail/errors/paths serve better
    assert summarize(JS_SOURCE, tool_name="read_file").startswith("code, 18 lines, 4 definitions")
    for tool in ("bash", "run_command", "shell.exec"):
        out = summarize(JS_SOURCE, tool_name=tool)
        assert out.startswith("text, 18 lines") and "L4:   const rows = text.split(" in out, tool
    assert summarize(PY_SOURCE, tool_name="bash").startswith("Python module")  # `cat x.py` still parses


# ---------------------------------------------------------------- logs and text


def test_every_error_line_of_a_big_log_is_verbatim_with_its_line_number():
    log, wanted = service_log(5000)
    out = summarize(log)
    assert detect_kind(log) == "log"
    assert out.startswith("log, 5000 lines, 13 error lines")
    for number, line in wanted.items():
        assert f"L{number}: {line}" in out.splitlines()
    assert "/var/data/: orders-2024.parquet" in out.splitlines()  # the traceback's paths are in its lines
    assert "L1: 2024-05-01T10:00:00Z INFO" in out and "L5000: " in out  # head and tail
    assert check_numbered_lines_are_verbatim(out, log) >= 30
    assert gist(log) == "log, 5000 lines, 13 error lines"


def test_too_many_error_lines_are_capped_with_a_count():
    text = "\n".join(f"step {i}: FAILED test_case_{i}" for i in range(1000))
    out = summarize(text, max_chars=1500)
    after = out.split("error lines:\n")[1].splitlines()
    section = after[:next(i for i, line in enumerate(after) if line.startswith("(+")) + 1]
    assert len(out) <= 1500 and section[-1].startswith("(+")
    assert len(section) > 20 and all(f"L{i + 1}: step {i}: FAILED test_case_{i}" == section[i]
                                     for i in range(len(section) - 1))
    assert section[-1] == f"(+{1000 - (len(section) - 1)} more error lines)"


def test_long_lines_are_cut_with_an_explicit_marker_never_rewritten():
    blob = base64.b64encode(bytes(range(256)) * 2000).decode()
    out = summarize(blob)
    assert len(out) <= 2400 and "looks like base64" in out and out.startswith("text, 1 line, 0 error lines")
    line = next(line for line in out.splitlines() if line.startswith("L1: "))
    cut = MARKER.search(line)
    assert cut is not None and blob.startswith(line[4: cut.start()])
    assert len(line[4: cut.start()]) + int(cut[1]) == len(blob)
    assert gist(blob) == f"text, 1 line ({len(blob)} chars)"


def test_windows_line_endings_and_non_ascii_are_kept_verbatim():
    lines = ["Démarrage du service 東京 ✓", "WARNING: disque presque plein — 95 %", "fin"]
    unix, windows = "\n".join(lines * 20), "\r\n".join(lines * 20)
    out = summarize(windows, max_chars=2400)
    assert out == summarize(unix, max_chars=2400).replace(f"{len(unix)} chars", f"{len(windows)} chars")
    assert "\r" not in out
    assert "L2 (×20): WARNING: disque presque plein — 95 %" in out.splitlines()  # noqa: RUF001
    assert "L1: Démarrage du service 東京 ✓" in out.splitlines()


def test_short_text_and_empty_input():
    assert summarize("") == "text, empty" and gist("") == "text, empty"
    text = "\n".join(f"line {i}" for i in range(15))
    out = summarize(text)
    assert out.splitlines()[:2] == ["text, 15 lines, 0 error lines, 109 chars", "lines:"]
    assert all(f"L{i + 1}: line {i}" in out for i in range(15))
    assert gist(text) == "text, 15 lines"


def test_pathological_inputs_never_raise():
    nasty = ["[" * 100_000, "[" * 50_000 + "]" * 50_000, "1" * 5000, '{"a": ' + "1" * 5000 + "}",
             "\ud800 lone surrogate", "a\x00b\x00c", "\n" * 10_000, "\r\r\r", "\u2028\u2029\x0c",
             "x" * 300_000, "(" * 5000, "def f(:\n" * 100, "a+" * 50_000 + "a"]
    for text in nasty:
        for max_chars in (0, 1, 50, 2400):
            out = summarize(text, max_chars=max_chars)
            assert len(out) <= max_chars
        assert len(gist(text)) <= 120
        detect_kind(text)


def test_gist_is_one_short_line_for_every_kind():
    log, _ = service_log(812)
    cases = {
        json.dumps([{"id": i, "name": f"n{i}", "status": "ok"} for i in range(240)]):
            "JSON array of 240 objects (keys: id, name, status)",
        PY_SOURCE: "Python module, 31 lines, 2 functions, 1 class",
        log: "log, 812 lines, 13 error lines",
        "\n".join(["some prose"] * 40): "text, 40 lines",
        GO_SOURCE: "code, 15 lines, 3 definitions",
        json.dumps({f"key\n{i}": i for i in range(50)}): None,
        "y" * 100_000: None,
    }
    for text, expected in cases.items():
        g = gist(text)
        assert len(g) <= 120 and len(g.splitlines()) == 1, g
        if expected is not None:
            assert g == expected


DEF_PIECES = ["export ", "default ", "async ", "function ", "abstract ", "class ", "declare ", "interface ",
              "enum ", "type ", "impl", "func ", "pub ", "pub(crate) ", "unsafe ", "const ", 'extern "C" ',
              "fn ", "struct ", "trait ", "mod ", "module ", "let ", "var ", "public ", "static ", "record ",
              "typedef ", "def ", "int ", "main", "Foo", "<T>", "(", ")", "(int a, char *b)", " {", ";",
              " = ", "=> ", "x", "  ", "\t", "if ", "return ", "void ", "*", "&", ":", "~Bar", "functional ",
              " const", ") const {", "\u3000", "_x", "\xe9", "ty", "de"]


@settings(max_examples=2000, deadline=None)
@given(st.lists(st.sampled_from(DEF_PIECES), max_size=8).map("".join))
def test_the_definition_test_takes_its_shortcut_without_changing_its_answer(line: str) -> None:
    assert _is_def(line) == bool(DEF_RE.match(line[:300]) or C_FN_RE.match(line[:300]))


LOG_PIECES = ["2024-01-02 ", "2024-01-02T", "12:30", ":45", " INFO ", "info", "WARN", "Warning", "level=",
              "level: ", "Level=", "ERROR", " x", "É", "ß", "abc", "[", "]", "\t", ": ", "DEBUG:", "levels"]


@settings(max_examples=2000, deadline=None)
@given(st.lists(st.sampled_from(LOG_PIECES), max_size=10).map("".join))
def test_a_log_line_is_told_as_its_time_and_level_patterns_tell_it(line: str) -> None:
    assert _log_lines([line]) == bool(TS_RE.search(line[:40]) or LEVEL_RE.search(line[:80]))


ERR_PIECES = ["error", "ERROR", "Warn", "EXCEPTION", "traceback", "fail", "FaTaL", "panic", "denied",
              "refused", "timeout", "timed out", "timed  out", "assert", "ASSERT", "x", " ", "err", "or",
              "\u0131", "\u017f", "\u212a", "\u0130", "É", "ß", "pan\u0131c", "a\u017fsert", "den\u0131ed",
              "TIMED OUT"]


@settings(max_examples=2000, deadline=None)
@given(st.lists(st.sampled_from(ERR_PIECES), max_size=8).map("".join) | st.text(max_size=40))
def test_the_error_word_test_answers_as_the_case_insensitive_regex(line: str) -> None:
    assert has_error_word(line) == bool(ERR_RE.search(line))
