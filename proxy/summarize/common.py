"""Shared limits, line helpers and the budgeted section layout every summary is built from."""

from __future__ import annotations

import bisect
import itertools
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass

HEAD_LINES, TAIL_LINES = 10, 10
LINE_W, ERR_W, ITEM_W, VALUE_W = 200, 320, 240, 120  # widths beyond which a kept line is cut, marked
MAX_ERR, MAX_PATHS, MAX_ID_KEYS, MAX_FIELDS, MAX_DEPTH = 300, 200, 8, 12, 5  # depth: +1 per object or array
SAMPLE = 50  # array items merged into a shape: bounded so huge arrays stay cheap
# Default size: a summary aims at TARGET_SHARE of the input (within these bounds); context (head/tail lines,
# samples) fills what the critical sections leave of it. What an agent acts on (critical sections) is kept in
# full up to the input's own size (CRITICAL_MAX for huge ones): a summary whose critical part does not fit
# in half the original is then not applied (layer 1 compares tokens), rather than applied with the facts
# cut out; only beyond CRITICAL_MAX are they cut, with a count.
TARGET_SHARE, TARGET_MIN, TARGET_MAX = 0.3, 300, 12_000
CRITICAL_SHARE, CRITICAL_MAX = 1.0, 48_000

ERR_RE = re.compile(r"(?i)error|warn|exception|traceback|fail|fatal|panic|denied|refused|timeout|timed out"
                    r"|assert")
_ERR_LOWER_RE = re.compile(ERR_RE.pattern.removeprefix("(?i)"))
ERR_WORDS = tuple(_ERR_LOWER_RE.pattern.split("|"))  # (all plain words: finding one is matching it)
BREAK_RE = re.compile(r"[\r\n\x0b\x0c\x1c-\x1e\x85\u2028\u2029]")  # everything splitlines() breaks on


def has_error_word(line: str) -> bool:
    """`ERR_RE.search(line)`, ~5x faster on ASCII text, where searching the lower-cased line case-sensitively
    is the same test (outside ASCII, case-insensitive matching has its own equivalences: U+0131, U+017F)."""
    if line.isascii():
        return _ERR_LOWER_RE.search(line.lower()) is not None
    return ERR_RE.search(line) is not None


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


def _numbered(lines: list[str], indices: list[int] | range, width: int, base: int = 0) -> list[str]:
    return [f"L{base + i + 1}: {_clip(lines[i], width)}" for i in indices]


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
    critical: bool = False  # ids, paths, error lines: allocated in full before any context

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


class Unfit(Exception):
    """The critical sections alone exceed the cap: no summary both keeps them and is smaller."""


def budgets(size: int, max_chars: int | None) -> tuple[int, int]:
    """(context budget, hard cap) for an input of `size` chars; an explicit max_chars is both."""
    if max_chars is not None:
        return max_chars, max_chars
    target = min(max(int(size * TARGET_SHARE), TARGET_MIN), TARGET_MAX)
    return target, max(target, min(int(size * CRITICAL_SHARE), CRITICAL_MAX))


def _share(secs: list[_Sec], room: int) -> list[list[str]]:
    """Share `room` (line costs: len + 1) among sections by weight; one needing less hands it on."""
    need = [_size(s.render(1 << 60)) for s in secs]
    alloc, left, active = [0] * len(secs), room, list(range(len(secs)))
    while active:
        wsum = sum(secs[i].weight for i in active)
        fits = [i for i in active if need[i] * wsum <= left * secs[i].weight]
        for i in fits or active:
            alloc[i] = need[i] if fits else left * secs[i].weight // wsum
        left -= sum(need[i] for i in fits)
        active = [i for i in active if i not in fits] if fits else []
    out = [s.render(a) for s, a in zip(secs, alloc, strict=True)]
    # Whole-line granularity leaves slack: hand it to cut sections, heaviest first (sorted() is stable).
    spare = room - sum(map(_size, out))
    for i in sorted(range(len(secs)), key=lambda i: -secs[i].weight):
        if spare > 0 and _size(out[i]) < need[i]:
            new = secs[i].render(_size(out[i]) + spare)
            spare, out[i] = spare - _size(new) + _size(out[i]), new
    return out


def unfit(secs: list[_Sec], max_chars: int, cap: int | None) -> bool:
    """Whether `_layout` raises Unfit for these sections, whatever others are added: critical ones in
    full exceed a cap above max_chars (a kind's own sections are checked before the costlier scans)."""
    cap = max(cap if cap is not None else max_chars, max_chars)
    return cap > max_chars and sum(_size(s.render(1 << 60)) for s in secs
                                   if s.critical and (s.items or s.extra)) > cap + 1


def _layout(secs: list[_Sec], max_chars: int, cap: int | None = None) -> str:
    """Critical sections first, in full when they fit in `cap` (else, with a cap above max_chars, Unfit;
    with a hard cap, shared by weight); the other sections share what is left of `max_chars`. Section
    order is kept."""
    if unfit(secs, max_chars, cap):
        raise Unfit
    cap = max(cap if cap is not None else max_chars, max_chars)
    secs = [s for s in secs if s.items or s.extra]
    crit = [i for i, s in enumerate(secs) if s.critical]
    rest = [i for i, s in enumerate(secs) if not s.critical]
    out: dict[int, list[str]] = dict(zip(crit, _share([secs[i] for i in crit], cap + 1), strict=True))
    used = sum(map(_size, out.values()))
    out |= dict(zip(rest, _share([secs[i] for i in rest], max(max_chars + 1 - used, 0)), strict=True))
    return "\n".join(line for i in range(len(secs)) for line in out[i])


def share_at_least(sample: list[str], test: Callable[[str], bool], tenths: int) -> bool:
    """Whether at least `tenths`/10 of `sample` pass `test` (`passed * 10 >= len(sample) * tenths`); stops
    as soon as that is settled either way (most outputs are plainly one thing or another after a few
    lines)."""
    need = -(-len(sample) * tenths // 10)
    spare = len(sample) - need  # misses that still allow it
    for line in sample:
        if test(line):
            need -= 1
            if need <= 0:
                return True
        else:
            spare -= 1
            if spare < 0:
                return False
    return need <= 0


# Scans of many lines at once. `joined(lines)` is the lines (as splitlines() gives them: no line break inside
# one) as one text, each after a "\n": line i's newline at starts[i]. A pattern that matches no "\n" past its
# first character finds there, with one regex call per matching line, what it finds line by line. Patterns
# anchored to a line's start lead with that "\n", not re.M's ^: sre then jumps from newline to newline in C
# (~1 ns a character) instead of trying each position in turn (~10 ns); blanks are [^\S\n].
def joined(lines: list[str]) -> tuple[str, list[int]]:
    """("\n" + each line after a "\n", where each line's newline is and where one more would be)."""
    # (line i starts after i newlines and the lines before it: summed in C, no Python loop a line)
    return "\n" + "\n".join(lines), list(map(operator.add, itertools.accumulate(map(len, lines), initial=0),
                                            range(len(lines) + 1)))


def matching_lines(pattern: re.Pattern[str], text: str, starts: list[int]) -> set[int]:
    """Indices of the lines of `text` (as `joined` gives them) where `pattern` matches: one search per
    matching line, resumed at the next line."""
    found: set[int] = set()
    position, last = 0, len(starts) - 2
    while (match := pattern.search(text, position)) is not None:
        index = bisect.bisect_right(starts, match.start()) - 1
        found.add(index)
        if index >= last:
            break
        position = starts[index + 1]
    return found


def lines_with(text: str, words: tuple[str, ...], starts: list[int]) -> set[int]:
    """Lines of `text` (as `joined` gives them; lower-cased by the caller for a search that ignores case)
    holding any of `words`, found with str.find: a regex over megabytes is ten times slower."""
    found: set[int] = set()
    last = len(starts) - 2
    for word in words:
        position = text.find(word)
        while position != -1:
            index = bisect.bisect_right(starts, position) - 1
            found.add(index)
            if index >= last:
                break
            position = text.find(word, starts[index + 1])
    return found
