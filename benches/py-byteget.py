#!/usr/bin/env python3
"""Python `get` (the value as a new `bytes` object) beside `get_into` (registered memory, zero
copy) of the same value, call by call: the Python counterpart of `byteget-pair`.

    benches/py-byteget.py --master HOST:PORT --local-hostname ADDR [--sizes 1M,10M,25M] [--pairs 30]

Each pair times one `get` and one `get_into` of the same key (in alternating order, so a load
that moves between rows moves both halves of a pair alike); the `bytes` a get returned is
checked and dropped before the next call, as a user's loop drops what it has used. Prints per
size the medians of both calls, the process's minor page faults per call of each, and the
median of the per-pair ratios get / get_into (throughput; target >= 0.85, issue 28 §2) with
their range; the load average at start and end. Run it on another host than the value's holder
(benches/py-byteget.sh runs it between two network namespaces), or its gets read its own
memory. Needs the `crescent` package (a release wheel: `maturin build --release`).
"""

import argparse
import resource
import statistics
import time

import numpy as np

import crescent

TARGET = 0.85


def parse_size(s: str) -> int:
    units = {"K": 10, "M": 20, "G": 30}
    s = s.strip().upper().rstrip("B").rstrip("I")
    return int(s[:-1]) << units[s[-1]] if s[-1] in units else int(s)


def load(when: str):
    with open("/proc/loadavg") as f:
        one, five, fifteen = f.read().split()[:3]
    print(f"load average at {when}: {one} {five} {fifteen} (1, 5, 15 min)")
    if when == "start" and float(one) > 0.5:
        print(f"warning: 1-minute load {one} > 0.5 at start: other programs are running; "
              "the figures measure a shared machine")


def faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def label(n: int) -> str:
    return f"{n / (1 << 20):.2f} MiB"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--master", required=True)
    p.add_argument("--local-hostname", required=True)
    p.add_argument("--sizes", default="1M,10M,25M")
    p.add_argument("--pairs", type=int, default=30)
    args = p.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    load("start")
    big = max(sizes)
    s = crescent.MooncakeDistributedStore()
    # A segment smaller than any value: the puts land on the holder's host.
    rc = s.setup(args.local_hostname, "P2PHANDSHAKE", 64 << 10, max(2 * big, 64 << 20), "tcp", "", args.master)
    assert rc == 0, crescent.last_error()
    buf = np.zeros(big, dtype=np.uint8)
    assert s.register_buffer(buf) == 0, crescent.last_error()
    ptr = buf.ctypes.data
    print("| value | pairs | get ms (p50) | get_into ms (p50) | faults per get | per get_into "
          "| get / get_into | range | target | met |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for size in sizes:
        key = f"pybg/{size}"
        value = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
        assert s.put(key, value) == 0, crescent.last_error()
        t_get, t_into, ratios = [], [], []
        f_get = f_into = 0

        def get():
            nonlocal f_get
            f = faults()
            start = time.perf_counter()
            got = s.get(key)
            t = time.perf_counter() - start
            f_get += faults() - f
            if got != value:
                raise SystemExit(f"get of {key} returned {len(got)} bytes that differ: {crescent.last_error()}")
            del got
            return t

        def get_into():
            nonlocal f_into
            f = faults()
            start = time.perf_counter()
            n = s.get_into(key, ptr, size)
            t = time.perf_counter() - start
            f_into += faults() - f
            if n != size:
                raise SystemExit(f"get_into of {key} returned {n}: {crescent.last_error()}")
            return t

        for i in range(args.pairs + 2):
            if i % 2 == 0:
                a = get()
                b = get_into()
            else:
                b = get_into()
                a = get()
            if i < 2:  # warm-up pairs
                f_get = f_into = 0
                continue
            t_get.append(a)
            t_into.append(b)
            ratios.append(b / a)  # rates: get / get_into
        if buf[:size].tobytes() != value:
            raise SystemExit(f"get_into of {key} wrote wrong bytes")
        r = statistics.median(ratios)
        print(f"| {label(size)} | {args.pairs} | {1e3 * statistics.median(t_get):.2f} "
              f"| {1e3 * statistics.median(t_into):.2f} | {f_get / args.pairs:.0f} | {f_into / args.pairs:.0f} "
              f"| {r:.2f} | {min(ratios):.2f}-{max(ratios):.2f} | >= {TARGET} | {'met' if r >= TARGET else 'NOT met'} |")
        s.remove(key, True)  # the last gets may still hold a lease
    s.unregister_buffer(buf)
    s.close()
    load("end")


if __name__ == "__main__":
    main()
