#!/usr/bin/env python3
"""Rows of a benchmark that compares a tool with its limit measured in alternating pairs.

The benchmark scripts run the tool and its limit alternately in short pairs (benches/lib-pairs.sh
does the running); this helper turns the pairs into a row: both medians, the median of the
per-pair ratios (each taken within its pair, so that a limit that drifts between pairs moves
both sides of a ratio alike), the ratios' range, the target and whether the median meets it.

  pairs.py load start|end                     the machine's load (warns at start above 0.5);
                                              at end, the CPU time the hypervisor took
                                              (steal) since start, which a load average
                                              does not show
  pairs.py header LABELS OURS LIMIT [--metric NAME,OURS,LIMIT ...]
  pairs.py row LABELS FILE --target '>=0.90' [--metric NAME ...] [--csv OUT]

LABELS is `|`-separated (the row's first cells). FILE has one pair a line: `ours limit`, or
with more metrics `ours1 ours2 ...;limit1 limit2 ...` (the first metric is the one the target
is about; the others get their own medians and ratio). --csv appends the row to OUT (with a
header line when OUT is new), which benches/plot.py reads like the markdown tables.
"""

import argparse
import csv
import os
import statistics
import sys

BUSY = 0.5


def cpu_times():
    """The machine's cumulative CPU times (/proc/stat's `cpu` line), or None."""
    try:
        with open("/proc/stat") as f:
            return [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None


def steal_mark():
    """Where `load start` leaves the CPU times for `load end`: one file per process group (a
    bench script and what it runs)."""
    return os.path.join(os.environ.get("TMPDIR", "/tmp"), f"pairs-cpu-{os.getuid()}-{os.getpgrp()}")


def steal(when):
    now = cpu_times()
    if now is None:
        return
    if when == "start":
        with open(steal_mark(), "w") as f:
            f.write(" ".join(map(str, now)))
        return
    try:
        with open(steal_mark()) as f:
            then = [int(x) for x in f.read().split()]
        os.unlink(steal_mark())
    except (OSError, ValueError):
        return
    d = [b - a for a, b in zip(then, now)]
    total = sum(d[:8])
    if total <= 0 or len(d) < 8:
        return
    print(f"cpu since start: busy {100 * (total - d[3] - d[4]) / total:.0f} %, "
          f"taken by the hypervisor (steal) {100 * d[7] / total:.1f} %")


def load(when):
    try:
        with open("/proc/loadavg") as f:
            one, five, fifteen = f.read().split()[:3]
        print(f"load average at {when}: {one} {five} {fifteen} (1, 5, 15 min)")
        if when == "start" and float(one) > BUSY:
            print(f"warning: 1-minute load {one} > {BUSY} at start: other programs are running; "
                  "the figures measure a shared machine")
    except OSError:
        print(f"load average at {when}: unknown")
    steal(when)


def parse_target(text):
    t = text.replace(" ", "")
    if t == "-":
        return "-", None
    for op in (">=", "<="):
        if t.startswith(op):
            return op, float(t[2:])
    sys.exit(f"pairs.py: target {text!r} is not >=X or <=X")


def read_pairs(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            if ";" in line:
                ours, _, limit = line.partition(";")
            else:  # "ours limit"
                ours, _, limit = line.partition(" ")
            o, l = [float(v) for v in ours.split()], [float(v) for v in limit.split()]
            if not o or len(o) != len(l):
                sys.exit(f"pairs.py: {path}: bad pair line {line!r}")
            rows.append((o, l))
    if not rows:
        sys.exit(f"pairs.py: {path}: no pairs")
    return rows


def summary(pairs, k):
    ours = [o[k] for o, _ in pairs]
    limit = [l[k] for _, l in pairs]
    ratios = [o / l if l > 0 else float("inf") for o, l in zip(ours, limit)]
    return statistics.median(ours), statistics.median(limit), statistics.median(ratios), min(ratios), max(ratios)


def header(a):
    labels = a.labels.split("|")
    cols = labels + [a.ours, a.limit, "ratio", "range", "target", "met"]
    for m in a.metric or []:
        name, ours, limit = m.split(",")
        cols += [ours, limit, f"ratio ({name})"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))


def row(a):
    pairs = read_pairs(a.file)
    op, target = parse_target(a.target)
    o, l, r, lo, hi = summary(pairs, 0)
    met = None if op == "-" else (r >= target if op == ">=" else r <= target)
    shown = "-" if op == "-" else f"{op} {target:.2f}"
    verdict = "-" if met is None else ("met" if met else "NOT met")
    cells = a.labels.split("|") + [f"{o:.2f}", f"{l:.2f}", f"{r:.2f}", f"{lo:.2f}-{hi:.2f}", shown, verdict]
    extra = len(pairs[0][0]) - 1
    for k in range(1, extra + 1):
        eo, el, er, elo, ehi = summary(pairs, k)
        cells += [f"{eo:.2f}", f"{el:.2f}", f"{er:.2f} ({elo:.2f}-{ehi:.2f})"]
    print("| " + " | ".join(cells) + " |", flush=True)
    if a.csv:
        names = (a.columns.split("|") if a.columns else [f"label{i}" for i in range(len(a.labels.split("|")))])
        names += ["ours", "limit", "ratio", "ratio_min", "ratio_max", "target", "met", "pairs"]
        for k in range(1, extra + 1):
            names += [f"ours{k + 1}", f"limit{k + 1}", f"ratio{k + 1}"]
        values = a.labels.split("|") + [f"{o:.4g}", f"{l:.4g}", f"{r:.4g}", f"{lo:.4g}", f"{hi:.4g}",
                                        shown.replace(" ", ""), {None: "-", True: "yes", False: "no"}[met],
                                        str(len(pairs))]
        for k in range(1, extra + 1):
            eo, el, er, _, _ = summary(pairs, k)
            values += [f"{eo:.4g}", f"{el:.4g}", f"{er:.4g}"]
        new = not os.path.exists(a.csv) or os.path.getsize(a.csv) == 0
        with open(a.csv, "a", newline="") as f:
            w = csv.writer(f)
            if new:
                w.writerow(names)
            w.writerow(values)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("load")
    p.add_argument("when", choices=["start", "end"])
    p = sub.add_parser("header")
    p.add_argument("labels")
    p.add_argument("ours")
    p.add_argument("limit")
    p.add_argument("--metric", action="append", help="NAME,OURS,LIMIT column names of a further metric")
    p = sub.add_parser("row")
    p.add_argument("labels")
    p.add_argument("file")
    p.add_argument("--target", required=True)
    p.add_argument("--csv")
    p.add_argument("--columns", help="|-separated names of the label cells in the CSV")
    a = ap.parse_args()
    {"load": lambda: load(a.when), "header": lambda: header(a), "row": lambda: row(a)}[a.cmd]()


if __name__ == "__main__":
    main()
