"""Charts as inline SVG written here: grouped bars over time, and a session's per-request timeline.

Colours come from CSS classes (the page's stylesheet), so the SVG carries no style of its own; every bar
has a <title> with its exact value (the browser shows it on hover).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.ui.page import attr, esc

RIGHT, TOP = 8, 8
MAX_LABELS = 10
MAX_GROUP = 90  # widest group of bars: a chart of two days is not two slabs


@dataclass(frozen=True)
class Frame:
    """Chart geometry in SVG units: total width, room for the left-hand labels."""

    width: int = 720
    left: int = 58

    def step(self, groups: int) -> float:
        return min(MAX_GROUP, (self.width - self.left - RIGHT) / groups)


OVER_TIME = Frame()
TIMELINE = Frame(width=1240, left=70)  # the session page gives it the whole width: same text size


@dataclass
class Series:
    name: str
    cls: str  # CSS class giving its colour: spent, baseline, client, forwarded, cached
    values: list[float]


def compact(value: float) -> str:
    for size, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:.3g}{unit}"
    return f"{value:.3g}"


def dollars(value: float) -> str:
    return f"${value:.2f}" if value >= 1 else f"${value:.4g}"


def _ceiling(top: float) -> float:
    """A round axis maximum at or above `top` (1, 2, 2.5 or 5 times a power of ten)."""
    if top <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(top))
    return next(step * power for step in (1, 2, 2.5, 5, 10) if step * power >= top * (1 - 1e-12))


def legend(series: Sequence[Series]) -> str:
    return '<div class="legend">' + "".join(f'<i class="{esc(s.cls)}"></i>{esc(s.name)}' for s in series) \
        + "</div>"


def _text(x: float, y: float, label: str, anchor: str = "end") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}">{esc(label)}</text>'


def _axis(frame: Frame, height: float, top: float, fmt: Callable[[float], str]) -> list[str]:
    out = []
    for share in (0.0, 0.5, 1.0):
        y = TOP + height * (1 - share)
        out.append(f'<line class="grid" x1="{frame.left}" x2="{frame.width - RIGHT}" y1="{y:.1f}" '
                   f'y2="{y:.1f}"/>')
        out.append(_text(frame.left - 6, y + 3, fmt(top * share)))
    return out


def _labels(frame: Frame, labels: Sequence[str], step: float, y: float, most: int = MAX_LABELS) -> list[str]:
    every = max(1, -(-len(labels) // most))
    return [_text(frame.left + step * (i + 0.5), y, label, "middle")
            for i, label in enumerate(labels) if i % every == 0]


def bars(title: str, labels: Sequence[str], series: Sequence[Series], fmt: Callable[[float], str],
         ident: str = "", height: int = 170) -> str:
    """Grouped bars, one group per label (a day, an hour), one bar per series."""
    plot = height - TOP - 22
    if not labels:
        return f'<div class="chart"{attr("id", ident)}><h3>{esc(title)}</h3><p class=muted>no data</p></div>'
    top = _ceiling(max((v for s in series for v in s.values), default=0.0))
    frame = OVER_TIME
    step = frame.step(len(labels))
    width = step * 0.8 / len(series)
    parts = _axis(frame, plot, top, fmt)
    for i, label in enumerate(labels):
        for k, s in enumerate(series):
            value = s.values[i]
            h = plot * value / top
            x = frame.left + step * i + step * 0.1 + width * k
            parts.append(f'<rect class="{esc(s.cls)}" x="{x:.1f}" y="{TOP + plot - h:.1f}" '
                         f'width="{width:.1f}" height="{h:.1f}"><title>{esc(label)} · {esc(s.name)}: '
                         f"{esc(fmt(value))}</title></rect>")
    parts += _labels(frame, labels, step, TOP + plot + 14)
    return (f'<div class="chart"{attr("id", ident)}><h3>{esc(title)}</h3>{legend(series)}'
            f'<svg viewBox="0 0 {frame.width} {height}" role="img" aria-label="{esc(title)}">'
            f'{"".join(parts)}</svg></div>')


LANES = (("evictions", "evictions"), ("summaries", "summaries"), ("masked", "masked"),
         ("internal_rounds", "rounds"), ("recalls", "recalls"), ("reads", "reads"))
TOKEN_SERIES = (("client tokens", "client", "tokens_client"), ("forwarded", "forwarded", "tokens_forwarded"),
                ("cached", "cached", "tokens_cached"))


def timeline(requests: Sequence[dict[str, Any]], href: Callable[[dict[str, Any]], str]) -> str:
    """Per request: client / forwarded / cached tokens, the gate's state, and what the proxy did (a dot
    with the count). Each column links to its request."""
    if not requests:
        return '<div class="chart" id="timeline"><p class="muted">no requests</p></div>'
    plot, lane = 150, 15
    series = [Series(name, cls, [float(r.get(key) or 0) for r in requests])
              for name, cls, key in TOKEN_SERIES]
    top = _ceiling(max((v for s in series for v in s.values), default=0.0))
    frame = TIMELINE
    step = frame.step(len(requests))
    width = step * 0.8 / len(series)
    gate_y = TOP + plot + 6
    lanes_y = gate_y + 16
    height = lanes_y + lane * len(LANES) + 18
    parts = _axis(frame, plot, top, compact)
    parts.append(_text(frame.left - 6, gate_y + 9, "gate"))
    parts += [_text(frame.left - 6, lanes_y + lane * j + 10, name) for j, (_, name) in enumerate(LANES)]
    for i, request in enumerate(requests):
        x0 = frame.left + step * i
        group = []
        for k, s in enumerate(series):
            h = plot * s.values[i] / top
            x = x0 + step * 0.1 + width * k
            group.append(f'<rect class="{s.cls}" x="{x:.1f}" y="{TOP + plot - h:.1f}" width="{width:.1f}" '
                         f'height="{h:.1f}"><title>request {i + 1} · {s.name}: {int(s.values[i]):,}'
                         "</title></rect>")
        gate = str(request.get("gate") or "other")
        known = gate if gate in ("pass", "warn", "prune", "refuse", "command") else "other"
        group.append(f'<rect class="g-{known}" x="{x0 + step * 0.05:.1f}" y="{gate_y}" '
                     f'width="{step * 0.9:.1f}" height="10"><title>request {i + 1} · gate {esc(gate)}'
                     "</title></rect>")
        for j, (key, name) in enumerate(LANES):
            n = int(request.get(key) or 0)
            if n:
                cx, cy = x0 + step / 2, lanes_y + lane * j + 6
                group.append(f'<circle class="event" cx="{cx:.1f}" cy="{cy}" r="6"><title>request {i + 1} · '
                             f'{name}: {n}</title></circle><text class="event-n" x="{cx:.1f}" y="{cy + 3}" '
                             f'text-anchor="middle">{n if n < 100 else "99+"}</text>')
        parts.append(f'<a href="{esc(href(request))}">{"".join(group)}</a>')
    parts += _labels(frame, [str(i + 1) for i in range(len(requests))], step, height - 4, most=40)
    return (f'<div class="chart" id="timeline"><h3>Per request (click a column to open it)</h3>'
            f'{legend(series)}<svg viewBox="0 0 {frame.width} {height}" role="img" '
            'aria-label="per-request timeline">'
            f'{"".join(parts)}</svg></div>')
