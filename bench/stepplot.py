"""Step curves as a small SVG document, written by hand: a benchmark draws its figure without a
plotting library (the bench runs from the test extras alone).

A series is a list of ``(x, y)`` steps: ``y`` holds from ``x`` until the next step's ``x`` (a
count that grows as events happen). :func:`cumulative` turns event times into such a count;
:func:`step_svg` draws any number of series on shared axes, with vertical marker lines (a target)
and a legend. The output is deterministic (same input, same bytes), so a committed copy changes
only when the figures do.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from xml.sax.saxutils import escape, quoteattr

__all__ = ["Marker", "Series", "cumulative", "nice_ticks", "step_svg"]


@dataclass(frozen=True)
class Series:
    label: str
    #: ``(x, y)`` steps in ascending ``x``
    points: Sequence[tuple[float, float]]
    colour: str
    dashed: bool = False


@dataclass(frozen=True)
class Marker:
    """A vertical line across the plot at ``x`` (a deadline, a target), labelled at its top."""

    x: float
    label: str
    colour: str = "#c0392b"


def cumulative(times: Sequence[float]) -> list[tuple[float, float]]:
    """The count of ``times`` at or before x, as steps: ``(t, k)`` for the k-th time in order."""
    return [(t, float(k)) for k, t in enumerate(sorted(times), start=1)]


def nice_ticks(high: float, count: int = 6) -> list[float]:
    """Round tick values from 0 to at least ``high`` (steps of 1, 2 or 5 times a power of ten)."""
    if high <= 0 or not math.isfinite(high):
        return [0.0, 1.0]
    raw = high / max(1, count - 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    ticks = [0.0]
    while ticks[-1] < high:
        ticks.append(round(ticks[-1] + step, 10))
    return ticks


def _fmt(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _label(value: float) -> str:
    return f"{value:g}"


def step_svg(
    series: Sequence[Series],
    *,
    title: str,
    x_label: str,
    y_label: str,
    markers: Sequence[Marker] = (),
    width: int = 760,
    height: int = 440,
) -> str:
    """An SVG document of ``series`` as step curves on axes from 0 that hold every point and
    marker; each curve is extended flat to the right edge (a count stays where it ended)."""
    # the legend goes under the axis label, a line per series, so it never covers a curve
    left, right, top, bottom = 64, 24, 40, 56 + 18 * len(series)
    plot_w, plot_h = width - left - right, height - top - bottom
    xs = [x for s in series for x, _ in s.points] + [m.x for m in markers]
    ys = [y for s in series for _, y in s.points]
    x_ticks = nice_ticks(max(xs, default=1.0))
    y_ticks = nice_ticks(max(ys, default=1.0))
    x_max, y_max = x_ticks[-1], y_ticks[-1]

    def px(x: float) -> float:
        return left + plot_w * x / x_max

    def py(y: float) -> float:
        return top + plot_h * (1 - y / y_max)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="{width / 2:g}" y="22" text-anchor="middle" font-size="14">{escape(title)}</text>',
    ]
    for tick in x_ticks:
        x = _fmt(px(tick))
        out.append(f'<line x1="{x}" y1="{top}" x2="{x}" y2="{top + plot_h}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{x}" y="{top + plot_h + 16}" text-anchor="middle">{_label(tick)}</text>')
    for tick in y_ticks:
        y = _fmt(py(tick))
        out.append(f'<line x1="{left}" y1="{y}" x2="{left + plot_w}" y2="{y}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{left - 6}" y="{y}" text-anchor="end" dy="4">{_label(tick)}</text>')
    out.append(
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#555555"/>'
    )
    out.append(
        f'<text x="{left + plot_w / 2:g}" y="{top + plot_h + 36}" text-anchor="middle">'
        f"{escape(x_label)}</text>"
    )
    out.append(
        f'<text x="16" y="{top + plot_h / 2:g}" text-anchor="middle" '
        f'transform="rotate(-90 16 {top + plot_h / 2:g})">{escape(y_label)}</text>'
    )
    for marker in markers:
        x = _fmt(px(marker.x))
        out.append(
            f'<line x1="{x}" y1="{top}" x2="{x}" y2="{top + plot_h}" stroke={quoteattr(marker.colour)} '
            'stroke-width="1.5" stroke-dasharray="6 4"/>'
        )
        # a marker at the right edge (the axis ends on it) has its label end there, not past it
        anchor = "end" if px(marker.x) > left + 0.9 * plot_w else "middle"
        out.append(
            f'<text x="{x}" y="{top - 4}" text-anchor="{anchor}" fill={quoteattr(marker.colour)}>'
            f"{escape(marker.label)}</text>"
        )
    for index, one in enumerate(series):
        out.append(_path(one, px, py, left + plot_w))
        legend_y = top + plot_h + 56 + 18 * index
        dash = ' stroke-dasharray="6 3"' if one.dashed else ""
        out.append(
            f'<line x1="{left + 12}" y1="{legend_y}" x2="{left + 36}" y2="{legend_y}" '
            f'stroke={quoteattr(one.colour)} stroke-width="2"{dash}/>'
        )
        out.append(f'<text x="{left + 42}" y="{legend_y + 4}">{escape(one.label)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _path(
    series: Series, px: Callable[[float], float], py: Callable[[float], float], right_edge: float
) -> str:
    """The step path of one series: from (first x, 0) up and along each step, flat to the edge."""
    points = list(series.points)
    dash = ' stroke-dasharray="6 3"' if series.dashed else ""
    if not points:
        return f'<path d="" fill="none" stroke={quoteattr(series.colour)}{dash}/>'
    first_x = points[0][0]
    parts = [f"M{_fmt(px(first_x))},{_fmt(py(0.0))}"]
    for x, y in points:
        parts.append(f"H{_fmt(px(x))}V{_fmt(py(y))}")
    parts.append(f"H{_fmt(right_edge)}")
    return (
        f'<path d="{"".join(parts)}" fill="none" stroke={quoteattr(series.colour)} stroke-width="2"{dash}/>'
    )
