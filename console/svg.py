"""Charts drawn by the server as SVG: a stacked bar chart (usage over time) and a timeline (reservations per pool and
node). No script, no library: each is a string of SVG that the page puts in place, and is read again with the
page's live part.

Each chart is an image with a name and a description (`role="img"`, `<title>`, `<desc>`, `aria-labelledby`), and
its page shows the same numbers in a table. Series are told apart by more than colour: the Okabe-Ito palette (safe
for the common colour-blindnesses), a pattern of their own (stripes, dots, cross-hatch, ...) and a legend, and a
bar tall enough carries its value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from markupsafe import Markup, escape

# Okabe & Ito, "Color Universal Design": distinguishable with protanopia, deuteranopia and tritanopia.
OKABE_ITO = ("#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#f0e442", "#000000")
# A pattern per series, drawn over its colour: the series stay apart in greyscale and for every colour vision.
PATTERNS = (
    "",  # plain
    '<path d="M0,6 L6,0" stroke="#fff" stroke-width="1.5"/>',  # diagonal stripes
    '<circle cx="3" cy="3" r="1.3" fill="#fff"/>',  # dots
    '<path d="M0,3 H6" stroke="#fff" stroke-width="1.5"/>',  # horizontal stripes
    '<path d="M0,0 L6,6 M6,0 L0,6" stroke="#fff" stroke-width="1"/>',  # cross-hatch
    '<path d="M3,0 V6" stroke="#fff" stroke-width="1.5"/>',  # vertical stripes
    '<path d="M0,0 L6,6" stroke="#000" stroke-width="1"/>',  # back stripes, dark (for the light yellow)
    '<circle cx="3" cy="3" r="1.3" fill="#fff"/><path d="M0,6 L6,0" stroke="#fff" stroke-width="1"/>',
)
OTHER = "other"


def swatch(index: int) -> tuple[str, str]:
    """(colour, pattern SVG) of the series at `index` (they repeat past eight, colour and pattern shifted apart)."""
    return OKABE_ITO[index % len(OKABE_ITO)], PATTERNS[(index + index // len(OKABE_ITO)) % len(PATTERNS)]


def _defs(prefix: str, count: int) -> str:
    parts = []
    for index in range(count):
        colour, pattern = swatch(index)
        parts.append(
            f'<pattern id="{prefix}-p{index}" width="6" height="6" patternUnits="userSpaceOnUse">'
            f'<rect width="6" height="6" fill="{colour}"/>{pattern}</pattern>'
        )
    return f"<defs>{''.join(parts)}</defs>"


def legend_swatch(prefix: str, index: int, size: int = 14) -> Markup:
    """A small square in the series' colour and pattern, for a legend or a table's row (aria-hidden: the name
    beside it says which series it is)."""
    colour, pattern = swatch(index)
    ident = f"{escape(prefix)}-l{index}"
    return Markup(
        f'<svg width="{size}" height="{size}" viewBox="0 0 {size} {size}" aria-hidden="true" focusable="false">'
        f'<defs><pattern id="{ident}" width="6" height="6" patternUnits="userSpaceOnUse">'
        f'<rect width="6" height="6" fill="{colour}"/>{pattern}</pattern></defs>'
        f'<rect width="{size}" height="{size}" fill="url(#{ident})" stroke="#333"/></svg>'
    )


def _number(value: float) -> str:
    """A figure with as many digits as its size needs: 1,250, 12.5, 0.0042 (a few GPU-minutes is not "0.0")."""
    if value == 0:
        return "0"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:,.1f}" if value >= 1 else f"{value:.2g}"


@dataclass(frozen=True)
class Series:
    name: str
    values: Sequence[float]  # one per bucket


def stacked_bars(
    ident: str,
    title: str,
    description: str,
    buckets: Sequence[str],
    series: Sequence[Series],
    unit: str,
    width: int = 900,
    height: int = 320,
) -> Markup:
    """A stacked bar per bucket (labelled `buckets`), each series a layer in its colour and pattern, a y axis in
    `unit`, the total above each bar when there is room."""
    left, right, top, bottom = 64, 12, 16, 48
    plot_w, plot_h = width - left - right, height - top - bottom
    totals = [sum(s.values[i] for s in series) for i in range(len(buckets))]
    peak = max(totals, default=0.0) or 1.0
    scale = _nice(peak)
    parts = [
        f'<svg class="chart" id="{escape(ident)}" role="img" aria-labelledby="{escape(ident)}-t {escape(ident)}-d" '
        f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">',
        f'<title id="{escape(ident)}-t">{escape(title)}</title><desc id="{escape(ident)}-d">{escape(description)}</desc>',
        _defs(ident, len(series)),
    ]
    for step in range(5):
        value = scale * step / 4
        y = top + plot_h - plot_h * value / scale
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#d0d0d0"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{_number(value)}</text>')
    parts.append(
        f'<text x="14" y="{top + plot_h / 2:.0f}" transform="rotate(-90 14 {top + plot_h / 2:.0f})" '
        f'text-anchor="middle">{escape(unit)}</text>'
    )
    count = max(len(buckets), 1)
    slot = plot_w / count
    bar = max(min(slot * 0.75, 60.0), 1.0)
    label_every = max(1, round(count / 12))
    labelled_to = float("-inf")  # the right edge of the last bucket label drawn: labels never overlap
    for i, label in enumerate(buckets):
        x = left + slot * i + (slot - bar) / 2
        y = top + plot_h
        for index, one in enumerate(series):
            value = one.values[i]
            if value <= 0:
                continue
            h = plot_h * value / scale
            y -= h
            parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{h:.1f}" fill="url(#{escape(ident)}-p{index})" '
                f'stroke="#333" stroke-width=".5"><title>{escape(one.name)}, {escape(label)}: '
                f"{_number(value)} {escape(unit)}</title></rect>"
            )
        if totals[i] > 0 and bar >= 24:
            parts.append(
                f'<text x="{x + bar / 2:.1f}" y="{y - 3:.1f}" text-anchor="middle">{_number(totals[i])}</text>'
            )
        half = 3.5 * len(label)  # about half the label's width at 12px: kept inside the chart at either end
        middle = min(max(x + bar / 2, left + half), width - right - half)
        if i % label_every == 0 and middle - half > labelled_to + 4:
            labelled_to = middle + half
            parts.append(f'<text x="{middle:.1f}" y="{top + plot_h + 16}" text-anchor="middle">{escape(label)}</text>')
    parts.append(f'<line x1="{left}" x2="{width - right}" y1="{top + plot_h}" y2="{top + plot_h}" stroke="#333"/>')
    parts.append("</svg>")
    return Markup("".join(parts))


def _nice(peak: float) -> float:
    """The axis's top: the smallest of 1, 2, 2.5, 5 times a power of ten at or above `peak`."""
    power = 10 ** len(str(int(peak))) / 10 if peak >= 1 else 0.1
    while power > peak:
        power /= 10
    for factor in (1, 2, 2.5, 5, 10):
        if power * factor >= peak:
            return power * factor
    return power * 10


@dataclass(frozen=True)
class Span:
    """A bar on a timeline: [start, end), its label, and its state (a class and a pattern)."""

    start: datetime
    end: datetime
    label: str
    state: str
    href: str | None = None


@dataclass(frozen=True)
class Lane:
    name: str
    spans: Sequence[Span]


STATE_STYLE = {  # colour, pattern index: a state is told by its pattern and its label too
    "reserved": ("#56b4e9", 2),
    "started": ("#0072b2", 1),
    "ended": ("#999999", 0),
    "cancelled": ("#e69f00", 4),
    "failed": ("#d55e00", 3),
}


def timeline(
    ident: str,
    title: str,
    description: str,
    lanes: Sequence[Lane],
    start: datetime,
    end: datetime,
    now: datetime,
    width: int = 900,
) -> Markup:
    """A row per lane, each span a bar from its start to its end (cut at the chart's edges), labelled with its
    label and state; a dashed "now" line; ticks at whole hours or days."""
    left, right, top, row = 180, 12, 28, 30
    height = top + row * max(len(lanes), 1) + 12
    plot_w = width - left - right
    total = max((end - start).total_seconds(), 1.0)

    def x_of(at: datetime) -> float:
        return left + plot_w * min(max((at - start).total_seconds() / total, 0.0), 1.0)

    states = list(STATE_STYLE)
    parts = [
        f'<svg class="chart timeline" id="{escape(ident)}" role="img" aria-labelledby="{escape(ident)}-t {escape(ident)}-d" '
        f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">',
        f'<title id="{escape(ident)}-t">{escape(title)}</title><desc id="{escape(ident)}-d">{escape(description)}</desc>',
        "<defs>",
    ]
    for name in states:
        colour, pattern = STATE_STYLE[name]
        parts.append(
            f'<pattern id="{escape(ident)}-{name}" width="6" height="6" patternUnits="userSpaceOnUse">'
            f'<rect width="6" height="6" fill="{colour}"/>{PATTERNS[pattern]}</pattern>'
        )
    parts.append("</defs>")
    for at, text in _ticks(start, end):
        x = x_of(at)
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top - 4}" y2="{height - 12}" stroke="#e0e0e0"/>')
        parts.append(f'<text x="{x:.1f}" y="{top - 8}" text-anchor="middle">{escape(text)}</text>')
    for i, lane in enumerate(lanes):
        y = top + row * i
        parts.append(f'<text x="{left - 8}" y="{y + row / 2 + 4:.1f}" text-anchor="end">{escape(lane.name)}</text>')
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y + row}" y2="{y + row}" stroke="#d0d0d0"/>')
        for span in lane.spans:
            if span.end <= start or span.start >= end:
                continue
            x1, x2 = x_of(span.start), x_of(span.end)
            fill = f"url(#{escape(ident)}-{span.state})" if span.state in STATE_STYLE else "#999999"
            said = f"{span.label} ({span.state}), {span.start:%Y-%m-%d %H:%M}Z to {span.end:%Y-%m-%d %H:%M}Z"
            bar = (
                f'<rect x="{x1:.1f}" y="{y + 4}" width="{max(x2 - x1, 2):.1f}" height="{row - 8}" fill="{fill}" '
                f'stroke="#333" stroke-width=".75"><title>{escape(said)}</title></rect>'
            )
            if x2 - x1 > 60:
                bar += (
                    f'<text x="{x1 + 4:.1f}" y="{y + row / 2 + 4:.1f}" class="on-bar">'
                    f"{escape(_fit(f'{span.label} · {span.state}', (x2 - x1 - 8) / 6.5))}</text>"
                )
            if span.href:
                bar = f'<a href="{escape(span.href)}">{bar}</a>'
            parts.append(bar)
    if start <= now <= end:
        x = x_of(now)
        parts.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top - 4}" y2="{height - 12}" stroke="#000" stroke-width="2" '
            f'stroke-dasharray="5 3"/><text x="{x + 3:.1f}" y="{height - 2}" font-weight="700">now</text>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))


def _fit(text: str, chars: float) -> str:
    most = max(int(chars), 1)
    return text if len(text) <= most else text[: max(most - 1, 1)] + "…"


def _ticks(start: datetime, end: datetime) -> list[tuple[datetime, str]]:
    """Ticks at whole hours (a window under two days) or whole days, at most about eight."""
    hours = (end - start).total_seconds() / 3600
    if hours <= 48:
        step = timedelta(hours=max(1, round(hours / 8)))
        first = start.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
        shown = "%H:%M"
    else:
        step = timedelta(days=max(1, round(hours / 24 / 8)))
        first = start.replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=1)
        shown = "%m-%d"
    ticks, at = [], first
    while at < end and len(ticks) < 40:
        ticks.append((at, at.strftime(shown)))
        at += step
    return ticks
