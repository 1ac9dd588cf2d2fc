"""A log-log line plot as SVG text, with nothing but the standard library.

The benchmarks' plots (bench/scale.py --plot FILE.svg) must not need a
plotting package the project does not install: this draws lines with
markers on log axes, decade grid lines, tick labels and a legend, which
is all a cost-against-hosts figure needs.

    svg = log_log_svg({"server CPU per call (us)": [(16, 90.0), ...]},
                      xlabel="hosts", ylabel="microseconds", title="...")
"""
import math
from xml.sax.saxutils import escape

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e")
WIDTH, HEIGHT = 640, 420
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 40, 60


def _decades(lo, hi):
    """Powers of ten covering [lo, hi]."""
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    return [10.0 ** e for e in range(first, last + 1)]


def _label(v):
    if v >= 1e6:
        return f"{v / 1e6:g}M"
    if v >= 1e3:
        return f"{v / 1e3:g}k"
    return f"{v:g}"


def log_log_svg(series, xlabel, ylabel, title="", x_base=2):
    """`series`: {label: [(x, y), ...]}, every x and y positive. The x axis
    is logarithmic with ticks at the data's x values (base `x_base` for
    spacing), the y axis logarithmic in decades."""
    xs = sorted({x for points in series.values() for x, _ in points})
    ys = [y for points in series.values() for _, y in points if y > 0]
    if not xs or not ys:
        raise ValueError("nothing to plot")
    x_lo, x_hi = math.log(xs[0], x_base), math.log(xs[-1], x_base)
    if x_hi == x_lo:
        x_lo, x_hi = x_lo - 1, x_hi + 1
    decades = _decades(min(ys), max(ys))
    y_lo, y_hi = math.log10(decades[0]), math.log10(decades[-1])
    if y_hi == y_lo:
        y_hi = y_lo + 1
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(x):
        return LEFT + (math.log(x, x_base) - x_lo) / (x_hi - x_lo) * plot_w

    def py(y):
        return TOP + (1 - (math.log10(y) - y_lo) / (y_hi - y_lo)) * plot_h

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
           f'height="{HEIGHT}" font-family="sans-serif" font-size="12">',
           f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>']
    if title:
        out.append(f'<text x="{WIDTH / 2}" y="22" text-anchor="middle" '
                   f'font-size="14">{escape(title)}</text>')
    for d in decades:
        y = py(d)
        out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" '
                   f'y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" '
                   f'text-anchor="end">{_label(d)}</text>')
    for x in xs:
        X = px(x)
        out.append(f'<line x1="{X:.1f}" y1="{TOP}" x2="{X:.1f}" '
                   f'y2="{HEIGHT - BOTTOM}" stroke="#eee"/>')
        out.append(f'<text x="{X:.1f}" y="{HEIGHT - BOTTOM + 16}" '
                   f'text-anchor="middle">{x:g}</text>')
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" '
               f'height="{plot_h}" fill="none" stroke="black"/>')
    out.append(f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 18}" '
               f'text-anchor="middle">{escape(xlabel)}</text>')
    out.append(f'<text transform="translate(16,{TOP + plot_h / 2}) '
               f'rotate(-90)" text-anchor="middle">{escape(ylabel)}</text>')
    for i, (label, points) in enumerate(series.items()):
        colour = COLOURS[i % len(COLOURS)]
        kept = [(x, y) for x, y in sorted(points) if y > 0]
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in kept)
        out.append(f'<polyline points="{path}" fill="none" '
                   f'stroke="{colour}" stroke-width="2"/>')
        for x, y in kept:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3.5" '
                       f'fill="{colour}"/>')
        # The legend in the lower right corner (costs rise to the right).
        lx = WIDTH - RIGHT - 270
        ly = HEIGHT - BOTTOM - 12 - 18 * (len(series) - 1 - i)
        out.append(f'<line x1="{lx}" y1="{ly - 4}" x2="{lx + 24}" '
                   f'y2="{ly - 4}" stroke="{colour}" stroke-width="2"/>')
        out.append(f'<text x="{lx + 30}" y="{ly}">{escape(label)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
