#!/usr/bin/env python3
"""The table, CSV and plots of benches/vs-mooncake.sh, from its raw pairs.

  vs-mooncake-report.py RAW.csv --out DIR

RAW.csv has one line per pair: part (engine|store), op, size, threads, pair, first (which
system ran first in the pair), mooncake, crescent, limit, unit, limit_name. Every row (part,
op, size, threads) prints Mooncake's and Crescent's medians, the median of the per-pair ratios
Crescent / Mooncake with their range, the limit's median (iperf3 or memcpy, measured in the
same pairs) and the median of the per-pair ratios Crescent / limit and Mooncake / limit.
Writes DIR/table.md (the same table), DIR/summary.csv and one SVG per part
(DIR/vs-mooncake-engine.svg, DIR/vs-mooncake-store.svg), drawn by benches/plot.py as its
FIGURES list says (`plot.py --all` redraws them from benches/results/vs-mooncake.csv).
"""

import argparse
import csv
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import plot  # noqa: E402  (benches/plot.py)



def summarise(raw):
    rows = {}
    for r in raw:
        rows.setdefault((r["part"], r["op"], r["size"], r["threads"]), []).append(r)
    out = []
    for (part, op, size, threads), pairs in rows.items():
        m = [float(p["mooncake"]) for p in pairs]
        c = [float(p["crescent"]) for p in pairs]
        lim = [float(p["limit"]) for p in pairs]
        ratio = [ci / mi if mi > 0 else float("inf") for ci, mi in zip(c, m)]
        c_lim = [ci / li if li > 0 else float("inf") for ci, li in zip(c, lim)]
        m_lim = [mi / li if li > 0 else float("inf") for mi, li in zip(m, lim)]
        out.append({
            "part": part, "op": op, "size": size, "threads": threads, "unit": pairs[0]["unit"],
            "limit_name": pairs[0]["limit_name"], "pairs": len(pairs),
            "Mooncake": statistics.median(m), "Crescent": statistics.median(c),
            "ratio": statistics.median(ratio), "ratio_min": min(ratio), "ratio_max": max(ratio),
            "limit": statistics.median(lim), "crescent_of_limit": statistics.median(c_lim),
            "mooncake_of_limit": statistics.median(m_lim),
        })
    return out


def fmt(v, unit):
    return f"{v:.2f}" if unit == "GB/s" else f"{v:.0f}"


def table(rows):
    head = ["part", "op", "size", "threads", "Mooncake", "Crescent", "Crescent / Mooncake",
            "range", "limit", "Crescent / limit", "Mooncake / limit", "unit", "pairs"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        u = r["unit"]
        lines.append("| " + " | ".join([
            r["part"], r["op"], r["size"], r["threads"], fmt(r["Mooncake"], u), fmt(r["Crescent"], u),
            f"**{r['ratio']:.2f}x**", f"{r['ratio_min']:.2f}-{r['ratio_max']:.2f}",
            f"{fmt(r['limit'], u)} ({r['limit_name']})", f"{r['crescent_of_limit']:.2f}",
            f"{r['mooncake_of_limit']:.2f}", u, str(r["pairs"])]) + " |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    with open(a.raw, newline="") as f:
        raw = list(csv.DictReader(f))
    if not raw:
        sys.exit(f"vs-mooncake-report: {a.raw} has no pairs")
    rows = summarise(raw)
    out = Path(a.out)
    text = table(rows)
    sys.stdout.write(text)
    (out / "table.md").write_text(text)
    keys = list(rows[0])
    with open(out / "summary.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in r.items()})
    # The plots as benches/plot.py --all draws them from a copy in benches/results/, each of
    # the rows in its unit (not the store's puts/s rows on its MiB/s axis).
    lines = (out / "summary.csv").read_text().splitlines(keepends=True)
    unit_col = keys.index("unit")
    parts = {r["part"] for r in rows}
    for src, label, values, where, title, unit, name in plot.FIGURES:
        if src == "vs-mooncake.csv" and where.partition("=")[2] in parts:
            csv_text = "".join(lines[:1] + [ln for ln in lines[1:] if ln.split(",")[unit_col] == unit])
            path = out / name
            path.write_text(plot.plot(csv_text, True, label, values, where, title, unit))
            print(f"wrote {path}", file=sys.stderr)

if __name__ == "__main__":
    main()
