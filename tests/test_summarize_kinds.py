"""Summaries an agent can act on, per kind of output: what must survive (ids, paths, error lines, test
results, hunk headers, the lines a call pointed at) and the `ctxproxy summarize` preview."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from proxy.cli import main
from proxy.summarize import detect_kind, summarize
from proxy.summarize.common import Unfit, _layout, _Sec, share_at_least, unfit
from proxy.summarize.detect import CODE_LINE_RE, GUTTER_RE, _is_def, _looks_like_code, _strip_gutter
from proxy.summarize.listing_summary import CLIP, GREP_FILE_RE, GREP_RE, _greppy, _pathy, listing_kind

WARNING = ("/usr/lib/python3.11/site-packages/pkg_resources/__init__.py:3154: DeprecationWarning: "
           "Deprecated call to `pkg_resources.declare_namespace('sphinxcontrib')`.")


def pytest_run() -> str:
    lines = ["============================= test session starts ==============================",
             "platform linux -- Python 3.11.4, pytest-8.3.3", "collected 74 items", ""]
    lines += [WARNING] * 37  # early repeats must not crowd out the failure
    lines += ["", "=================================== FAILURES ===================================",
              "_______________________________ test_parse_date ________________________________",
              "    def test_parse_date():", ">       parse('2024-13-01')", "",
              "src/dates.py:41: in parse", "    raise ValueError(f'bad month {month}')",
              "E   ValueError: bad month 13", "tests/test_dates.py:12: ValueError",
              "=========================== short test summary info ============================",
              "FAILED tests/test_dates.py::test_parse_date - ValueError: bad month 13",
              "FAILED tests/test_io.py::test_read - OSError: [Errno 2] No such file",
              "======================== 2 failed, 72 passed in 1.93s ========================="]
    return "\n".join(lines)


def test_test_run_puts_the_result_first_and_collapses_repeated_warnings():
    out = summarize(pytest_run())
    lines = out.splitlines()
    assert lines[0].startswith("test run, ")
    assert lines[1] == "result:" and "== 2 failed, 72 passed in 1.93s ==" in lines[2]
    assert "L53: FAILED tests/test_dates.py::test_parse_date - ValueError: bad month 13" in lines
    assert "L54: FAILED tests/test_io.py::test_read - OSError: [Errno 2] No such file" in lines
    assert "L50: E   ValueError: bad month 13" in lines and "L48: src/dates.py:41: in parse" in lines
    assert f"L5 (×37): {WARNING}" in lines and out.count("DeprecationWarning") == 1  # noqa: RUF001


def test_mini_swe_agent_observation_keeps_the_return_code_and_numbers_lines_in_the_whole_message():
    text = f"<returncode>1</returncode>\n<output>\n{pytest_run()}\n</output>"
    out = summarize(text)
    assert out.splitlines()[0] == "observation: return code 1"
    assert "L56: FAILED tests/test_io.py::test_read - OSError: [Errno 2] No such file" in out  # +2 lines


def test_swe_agent_trailer_is_kept_verbatim():
    body = "\n".join(f"./src/pkg/mod_{i}.py" for i in range(200))
    text = f"{body}\n(Open file: /repo/src/app.py)\n(Current directory: /repo)\nbash-$"
    out = summarize(text)
    assert out.splitlines()[0] == "observation: (Open file: /repo/src/app.py); (Current directory: /repo)"
    assert "./src/pkg/: " + ", ".join(f"mod_{i}.py" for i in range(200)) in out


def test_diff_keeps_every_file_hunk_header_and_hash():
    parts = [f"commit {i:040x}\nAuthor: Ann <a@b.c>\nDate:   Mon Jan 1\n\n    Fix parser case {i}\n\n"
             f"diff --git a/src/m{i}.py b/src/m{i}.py\nindex {i:07x}1..{i:07x}2 100644\n--- a/src/m{i}.py\n"
             f"+++ b/src/m{i}.py\n@@ -{i * 10},7 +{i * 10},8 @@ def f{i}():\n" + "     context_line()\n" * 40
             + "-    old()\n+    new()\n+    more()\n" for i in range(1, 30)]
    text = "".join(parts)
    out = summarize(text)
    assert out.startswith("diff (29 files, +58 -29, 29 commits)")
    for i in range(1, 30):
        assert f"commit {i:040x}" in out and f"diff --git a/src/m{i}.py b/src/m{i}.py" in out
        assert f"@@ -{i * 10},7 +{i * 10},8 @@ def f{i}():" in out and f"Fix parser case {i}" in out
    assert len(out) < len(text) / 2


def test_find_listing_keeps_every_path_grouped_by_directory():
    paths = [f"./django/{d}/{name}{i}.py" for d in ("db", "http", "core/mail") for i in range(44)
             for name in ("module_",)]
    text = "\n".join(paths)
    out = summarize(text)
    assert out.startswith("listing of 132 paths in 3 groups")
    for d in ("db", "http", "core/mail"):
        assert f"./django/{d}/: " + ", ".join(f"module_{i}.py" for i in range(44)) in out
    assert len(out) < len(text) * 0.6


def test_grep_lists_each_file_with_its_line_numbers():
    text = "\n".join(f"src/app/{f}.py:{n}:    value = compute({n})" for f in ("a", "b")
                     for n in range(10, 400, 7))
    out = summarize(text)
    assert out.startswith("search results, 112 matches in 2 files")
    assert "src/app/a.py: lines 10, 17, 24" in out and "src/app/b.py: lines 10, 17" in out


def test_html_page_title_headings_links_and_forms():
    page = ("<!DOCTYPE html><html><head><title>Order 7731 — Shop</title><script>var x = 1;</script></head>"
            "<body><h1>Your order</h1><h2>Items</h2>" + "<p>Some words about the product.</p>" * 200
            + '<a href="/orders/7731/invoice.pdf">Invoice</a><form action="/cart/update" method="post">'
            '<input name="qty" type="number"><button name="save">Save</button></form></body></html>')
    out = summarize(page)
    assert out.startswith("HTML page, 2 headings, 1 link, 1 form")
    for kept in ("title: Order 7731 — Shop", "h1: Your order", "h2: Items",
                 "Invoice -> /orders/7731/invoice.pdf", "form POST /cart/update", "  input qty (number)",
                 "  button save"):
        assert kept in out.splitlines()
    assert "var x" not in out


def test_file_read_keeps_the_lines_the_arguments_point_at():
    source = "\n".join(f"{n:6}\tvalue_{n} = compute({n})  # line {n}" for n in range(1000, 1400))
    args = json.dumps({"path": "src/big.py", "start_line": 1200, "end_line": 1203})
    out = summarize(source, tool_name="read_file", arguments=args)
    for n in range(1200, 1204):
        assert f"L{n - 999}: {n:6}\tvalue_{n} = compute({n})  # line {n}" in out
    found = summarize(source, tool_name="grep", arguments=json.dumps({"pattern": "compute(1337)"}))
    assert "L338:   1337\tvalue_1337 = compute(1337)  # line 1337" in found
    for bad in (None, "", "not json", "[1, 2]", '{"start_line": "x", "end_line": 10000000000}', "{" * 5000):
        assert summarize(source, arguments=bad)  # never raises, whatever the model wrote


def test_facts_that_cannot_fit_make_no_summary():
    names = "\n".join(f"test_module_{i:04d}_{'x' * (i % 7)}.py" for i in range(300))  # ls of a flat folder
    assert summarize(names) == names  # no smaller text keeps every name: layer 1 keeps the original
    assert len(summarize(names, max_chars=800)) <= 800  # an explicit cap still holds


def test_a_listing_that_cannot_shrink_is_known_before_the_costly_scans(monkeypatch):
    import proxy.summarize.text_summary as text_summary

    names = "\n".join(f"test_module_{i:04d}_{'x' * (i % 7)}.py" for i in range(300))  # every name is a fact
    assert summarize(names) == names
    # Its paths alone are over the cap: that is settled before the error-line and path scans.
    monkeypatch.setattr(text_summary, "flag_lines", lambda lines: pytest.fail("scanned anyway"))
    assert summarize(names) == names


section = st.builds(lambda items, critical, extra: _Sec(items, "t:", "items", 1, critical=critical,
                                                        extra=extra),
                    st.lists(st.text(max_size=40), max_size=8), st.booleans(), st.integers(0, 3))


@given(st.lists(section, max_size=4), st.lists(section, max_size=4), st.integers(0, 400),
       st.integers(0, 400))
def test_unfit_sections_stay_unfit_whatever_is_added(front, rest, max_chars, extra_cap):
    cap = max_chars + extra_cap
    if unfit(front, max_chars, cap):
        with pytest.raises(Unfit):
            _layout([*front, *rest], max_chars, cap)


@given(st.lists(st.booleans(), max_size=40), st.integers(0, 10))
@example([False, False, True, True, True], 6)  # the misses first, the share met on the last line
def test_share_at_least_stops_early_and_decides_as_counting_every_line(passes, tenths):
    asked: list[int] = []

    def test(index: str) -> bool:
        asked.append(int(index))
        return passes[int(index)]

    sample = [str(i) for i in range(len(passes))]
    assert share_at_least(sample, test, tenths) == (sum(passes) * 10 >= len(passes) * tenths)
    assert asked == list(range(len(asked)))  # in order, each line once


def test_kind_detection_shares_hold_at_their_boundaries():
    plain = [f"just some words here number {i}" for i in range(10)]
    stamped = [f"2024-01-01 10:00:0{i} started the thing" for i in range(10)]
    failing = [f"the upload failed with an error {i}" for i in range(10)]
    # A log: at least three lines in ten open with a time or a level; else two in ten with error words.
    assert detect_kind("\n".join(plain[:7] + stamped[:3])) == "log"  # (met on the last line)
    assert detect_kind("\n".join(stamped[:2] + plain[:8])) == "text"
    assert detect_kind("\n".join(plain[:8] + failing[:2])) == "log"
    assert detect_kind("\n".join(failing[:1] + plain[:9])) == "text"


grep_line = st.builds(lambda f, n: f"src/{f}.py:{n}: hit", st.sampled_from("abc"), st.integers(1, 999))
path_line = st.builds(lambda d, f: f"./{d}/{f}.txt", st.sampled_from(["x", "y/z"]), st.sampled_from("pq"))
other_line = st.sampled_from(["hello there", "  ", "ERROR: it broke", "total 12", "a b c: d"])


@given(st.lists(st.one_of(grep_line, path_line, other_line), max_size=60))
@example(["hello there", "a b c: d", "src/a.py:1: hit", "src/b.py:2: hit", "src/c.py:3: hit"])  # 6/10, late
@example(["hello there", "./x/p.txt", "./x/q.txt", "./y/z/p.txt", "./y/z/q.txt"])  # 8/10, misses first
def test_listing_kind_stops_early_and_decides_as_counting_every_line(lines):
    sample = [line for line in lines if line.strip()]
    n = len(sample)
    greppy = sum(map(_greppy, sample))
    pathy = sum(map(_pathy, sample))
    expected = None if n < 5 else "grep" if greppy * 10 >= n * 6 else "listing" if pathy * 10 >= n * 8 \
        else None
    assert listing_kind(lines) == expected


grep_file_line = st.builds(lambda f, c: f"lib/{f}.cfg:{c}", st.sampled_from("abc"),
                           st.sampled_from(["", " x"]))
# (long paths: the colon anywhere up to past the clipped length, within and beyond the patterns' reach)
clipped = st.builds(lambda a, b, tail: "a" * a + "/" + "b" * b + tail, st.integers(0, 320),
                    st.integers(0, 420), st.sampled_from([":12: x", ".py:", ".py:x", ":"]))


@given(st.one_of(grep_line, grep_file_line, path_line, other_line, clipped, st.text(max_size=40)))
def test_a_grep_line_is_told_as_the_two_patterns_tell_it(line):
    """The colon looked for first (within the clipped length the patterns see) decides nothing itself."""
    expected = bool(GREP_RE.match(line[:CLIP]) or GREP_FILE_RE.match(line[:CLIP]))
    assert _greppy(line) == expected


code_like = st.sampled_from(["def run(x):", "class Job:", "int main(void) {", "    x = 1;", "import os",
                             "}", "plain words here", "more plain text", "ERROR: it broke", "# a comment"])


@given(st.lists(code_like, min_size=3, max_size=60))
@example(["def f():"] + ["plain words here"] * 2 + ["    x = 1;"] * 2)  # 3 of 5 code-like: settled late
def test_code_detection_stops_early_and_decides_as_counting_every_line(sample):
    """Code when six tenths of the lines look like code, or four tenths and one is a definition."""
    n = len(sample)
    defs = sum(map(_is_def, sample))
    code = sum(_is_def(line) or bool(CODE_LINE_RE.search(line[:300])) for line in sample)
    assert _looks_like_code(sample) == ((code * 10 >= n * 4 and defs > 0) or code * 10 >= n * 6)


def test_the_budget_grows_with_the_input():
    small, big = ("\n".join(f"INFO step {i} ok" for i in range(n)) for n in (400, 8000))
    assert len(summarize(big)) > 2 * len(summarize(small))
    assert len(summarize(big)) <= 12_000


log_line = st.one_of(
    st.sampled_from(["INFO ok", "DEBUG tick", "", "  indented detail", WARNING]),
    st.builds(lambda n, w: f"ERROR job-{n} failed on /srv/{w}/data.csv", st.integers(0, 10**6),
              st.from_regex(r"[a-z]{1,8}", fullmatch=True)),
    st.builds(lambda n: f"Traceback (most recent call last):\n  File \"/app/m{n}.py\", line {n}, in run\n"
              f"ValueError: bad value {n}", st.integers(0, 999)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(log_line, min_size=20, max_size=300))
def test_every_error_line_survives_or_no_summary_is_made(lines):
    text = "\n".join(lines)
    out = summarize(text)
    if out == text:
        return
    for line in text.splitlines():
        if "ERROR" in line or "Error" in line or line.startswith("  File"):
            assert line in out, line


# ---------------------------------------------------------------- ctxproxy summarize


def test_cli_prints_the_replacement_or_says_why_not(tmp_path, capsys):
    result = tmp_path / "pytest.txt"
    result.write_text(pytest_run() + "\n" + "\n".join(f"INFO line {i} of the run" for i in range(400)))
    assert main(["summarize", str(result), "--tool", "bash"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("[ctxproxy summary of tool result call_id=preview from bash: original ")
    assert "2 failed, 72 passed" in out

    assert main(["summarize", str(result), "--json"]) == 0
    shown = orjson.loads(capsys.readouterr().out)
    assert shown["replaced"] is True and shown["summary_tokens"] * 2 <= shown["original_tokens"]
    assert shown["text"].startswith("[ctxproxy summary of tool result call_id=preview:")

    flat = tmp_path / "ls.txt"
    flat.write_text("\n".join(f"test_module_{i:04d}.py" for i in range(300)))
    assert main(["summarize", str(flat)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("not replaced: the summary would be ") and "test_module_0299.py" in out
    assert main(["summarize", str(flat), "--json"]) == 0
    assert orjson.loads(capsys.readouterr().out)["replaced"] is False


def test_cli_missing_file_and_stdin(tmp_path):
    script = str(Path(sys.executable).parent / "ctxproxy")  # the installed console script
    missing = subprocess.run([script, "summarize", str(tmp_path / "nope")],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "no such file" in missing.stderr and "Traceback" not in missing.stderr
    piped = subprocess.run([script, "summarize", "-", "--json"], input=pytest_run(),
                           capture_output=True, text=True, timeout=60)
    assert piped.returncode == 0 and orjson.loads(piped.stdout)["original_tokens"] > 0


def full_gutter(lines: list[str]) -> tuple[list[str], int]:
    """The definition, on every line: each non-blank line has a gutter, the numbers run on by one."""
    matches = [GUTTER_RE.match(line) for line in lines]
    nums = [int(m[1]) for m in matches if m]
    if len(nums) < 2 or any(not m and line.strip() for m, line in zip(matches, lines, strict=True)) \
            or any(b != a + 1 for a, b in itertools.pairwise(nums)):
        return lines, 0
    return [line[m.end():] if m else line for m, line in zip(matches, lines, strict=True)], nums[0] - 1


GUTTER_PIECES = ["  ", "\t", "12", "13", "7", "\u2192", ":", ": ", "| ", "x = 1", "", " \u3000", "def f():"]


@given(st.lists(st.lists(st.sampled_from(GUTTER_PIECES), max_size=4).map("".join), max_size=8))
@example(["  ", "1\tone", "2\ttwo"])  # a blank first line, then a gutter that holds
@example(["text", "1\tone", "2\ttwo"])  # the first line has none: nothing is stripped
def test_a_gutter_is_stripped_exactly_when_every_line_has_one(lines):
    assert _strip_gutter(lines) == full_gutter(lines)
