#!/usr/bin/env python3
"""Draws a benchmark's table as a grouped bar chart in SVG (stdlib only).

Input: the markdown table a benchmark script prints (the first table in the file; `-` reads
stdin), or a CSV file (`.csv`). Each row is one group of bars, labelled by --label columns;
each --values column is one bar of the group. Cells are read as their leading number
("2.55", "1.4x", "95 %").

  benches/tcp-vs-iperf3.sh 3 | python3 benches/plot.py - --label op,block,threads \\
      --values "tebench GB/s,iperf3 GB/s" --title "tcp vs iperf3" --unit GB/s -o tcp.svg

`--all` redraws every figure of the book (docs/src/img/) from the saved tables in
benches/results/, as listed in FIGURES below.
"""

import argparse
import csv
import re
import sys
from html import escape
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (saved table, label columns, value columns, row filter column=value or None, title, unit, svg)
FIGURES = [
    ("tcp-vs-iperf3.md", "op,block,threads", "tebench GB/s,iperf3 GB/s", None,
     "tcp transport vs iperf3 (loopback, batch 128)", "GB/s", "tcp-vs-iperf3.svg"),
    ("storebench-vs-redis.md", "value", "store MiB/s,redis MiB/s", "op=get_into (zero copy)",
     "store get_into (zero copy) vs Redis GET, two hosts", "MiB/s", "storebench-vs-redis.svg"),
    ("shm-vs-memcpy.md", "op,block,threads", "shm GB/s,memcpy GB/s", None,
     "shm transport vs memcpy (one host, batch 128)", "GB/s", "shm-vs-memcpy.svg"),
    # benches/vs-mooncake.sh's summary.csv (its report draws the same two from it)
    ("vs-mooncake.csv", "op,size,threads", "Mooncake,Crescent,limit", "part=engine",
     "engine over tcp loopback: transfer_engine_bench vs tebench (limit: iperf3)", "GB/s",
     "vs-mooncake-engine.svg"),
    ("vs-mooncake.csv", "op,size,threads", "Mooncake,Crescent,limit", "part=store",
     "store over tcp loopback: Python put / get (limit: memcpy)", "MiB/s", "vs-mooncake-store.svg"),
]

COLOURS = ["#3b6ea8", "#d9822b", "#5a9e5a", "#a23b72", "#777777"]
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def read_table(text, is_csv):
    """Rows of the first table in `text`, as dicts of column -> cell."""
    if is_csv:
        return list(csv.DictReader(text.splitlines()))
    lines = []
    for line in text.splitlines():
        if line.strip().startswith("|"):
            lines.append(line)
        elif lines:
            break
    if len(lines) < 3:
        sys.exit("plot.py: no markdown table in the input")
    cells = [[c.strip() for c in l.strip().strip("|").split("|")] for l in lines]
    head, body = cells[0], [r for r in cells[2:] if len(r) == len(cells[0])]
    return [dict(zip(head, r)) for r in body]


def number(cell):
    m = NUMBER.search(cell.replace(",", ""))
    if not m:
        sys.exit(f"plot.py: {cell!r} is not a number")
    return float(m.group())


def nice_ceiling(v):
    """A round axis maximum at or above v."""
    if v <= 0:
        return 1.0
    step = 10 ** (len(str(int(v))) - 1) if v >= 1 else 0.1
    for m in (1, 2, 2.5, 5, 10):
        if m * step >= v:
            return m * step
    return 10 * step


def svg(groups, series, title, unit):
    """groups: [(label, [value per series])]."""
    bar, gap, left, top, bottom = 14, 18, 60, 40, 70
    n = len(series)
    bar = 14 if len(groups) > 6 else 28
    width = max(left + len(groups) * (n * bar + gap) + 20, 12 + 7 * len(title), left + 150 * n)
    height, plot_h = 340, 340 - top - bottom
    vmax = nice_ceiling(max(v for _, vs in groups for v in vs))
    y = lambda v: top + plot_h - v / vmax * plot_h
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2}" y="18" text-anchor="middle" font-size="14">{escape(title)}</text>']
    for i in range(6):
        v = vmax * i / 5
        out.append(f'<line x1="{left}" x2="{width - 10}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:g}</text>')
    out.append(f'<text x="14" y="{top + plot_h / 2}" transform="rotate(-90 14 {top + plot_h / 2})" '
               f'text-anchor="middle">{escape(unit)}</text>')
    x = left + gap / 2
    for label, values in groups:
        for k, v in enumerate(values):
            out.append(f'<rect x="{x + k * bar:.1f}" y="{y(v):.1f}" width="{bar - 2}" '
                       f'height="{top + plot_h - y(v):.1f}" fill="{COLOURS[k % len(COLOURS)]}">'
                       f'<title>{escape(label)}: {escape(series[k])} {v:g}</title></rect>')
        cx = x + n * bar / 2
        out.append(f'<text x="{cx:.1f}" y="{top + plot_h + 12}" text-anchor="end" '
                   f'transform="rotate(-40 {cx:.1f} {top + plot_h + 12})">{escape(label)}</text>')
        x += n * bar + gap
    for k, name in enumerate(series):
        lx = left + k * 150
        out.append(f'<rect x="{lx}" y="{height - 16}" width="10" height="10" fill="{COLOURS[k % len(COLOURS)]}"/>')
        out.append(f'<text x="{lx + 14}" y="{height - 7}">{escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def plot(text, is_csv, label, values, where, title, unit):
    rows = read_table(text, is_csv)
    if where:
        col, _, want = where.partition("=")
        rows = [r for r in rows if r.get(col) == want]
    labels, cols = label.split(","), values.split(",")
    for c in labels + cols:
        if rows and c not in rows[0]:
            sys.exit(f"plot.py: no column {c!r} (columns: {', '.join(rows[0])})")
    if not rows:
        sys.exit("plot.py: no rows to plot")
    groups = [(" ".join(r[c] for c in labels), [number(r[c]) for c in cols]) for r in rows]
    return svg(groups, cols, title, unit)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("input", nargs="?", help="markdown table or .csv file; - for stdin")
    ap.add_argument("--label", help="comma-separated label columns")
    ap.add_argument("--values", help="comma-separated value columns (one bar each)")
    ap.add_argument("--where", help="keep only rows whose COLUMN=VALUE")
    ap.add_argument("--title", default="")
    ap.add_argument("--unit", default="")
    ap.add_argument("-o", "--output", help="SVG file (default: stdout)")
    ap.add_argument("--all", action="store_true", help="redraw docs/src/img/ from benches/results/")
    a = ap.parse_args()
    if a.all:
        for src, label, values, where, title, unit, out in FIGURES:
            text = (ROOT / "benches" / "results" / src).read_text(encoding="utf-8")
            dest = ROOT / "docs" / "src" / "img" / out
            dest.write_text(plot(text, src.endswith(".csv"), label, values, where, title, unit))
            print(f"wrote {dest.relative_to(ROOT)}")
        return
    if not (a.input and a.label and a.values):
        ap.error("give INPUT, --label and --values (or --all)")
    text = sys.stdin.read() if a.input == "-" else Path(a.input).read_text(encoding="utf-8")
    result = plot(text, a.input.endswith(".csv"), a.label, a.values, a.where, a.title, a.unit)
    if a.output:
        Path(a.output).write_text(result)
    else:
        sys.stdout.write(result)


if __name__ == "__main__":
    main()
