#!/usr/bin/env python3
"""Python `batch_get_into` and `batch_get_into_multi_buffers` vs the same operations from
Rust, measured in the same run.

    benches/ffi-batch-get.py [--bin-dir target/release] [--size 10M] [--count 16] [--batch 4]
                             [--rounds 40] [--repeats 3] [--pieces 8]

Starts a crescent-master and a holder client (`crescent client`, which puts `--count` values
of `--size` bytes, pattern-filled), then, `--repeats` times and for each of the two calls, runs
a pair of readers one after the other (Python, then Rust) that run the same loop over those
keys into registered memory:
* Python: `crescent.MooncakeDistributedStore` in this process (numpy destination buffer):
  `batch_get_into` (one buffer per value), then `batch_get_into_multi_buffers` (each value
  into `--pieces` buffers, piece l of value j in layer l's slot j, as a KV cache's layers);
* Rust: `store-batch-get` (crescent-store's client directly): `batch_get_into` and
  `batch_get_into_sg` with the same layout.
Each checks its first batch byte by byte (untimed), then times `--rounds` batches. Prints the
load average before each pair, each run, the median of each, and the ratio Python / Rust per
call (target >= 0.90). Needs the `crescent` package installed (maturin wheel) and the release
binaries.
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import threading
import time

import numpy as np

import crescent

REPO = pathlib.Path(__file__).resolve().parents[1]


def parse_size(s: str) -> int:
    units = {"K": 10, "M": 20, "G": 30}
    s = s.strip().upper().rstrip("B").rstrip("I")
    return int(s[:-1]) << units[s[-1]] if s[-1] in units else int(s)


def pattern(seed: int, n: int) -> np.ndarray:
    """crescent_store::pattern::fill(seed, offset 0) in numpy."""
    off = np.arange(n, dtype=np.uint64)
    rot = ((seed << 17) | (seed >> 47)) & (2**64 - 1)
    with np.errstate(over="ignore"):
        x = (off ^ np.uint64(rot)) * np.uint64(0x9E3779B97F4A7C15)
    return ((x >> np.uint64(56)).astype(np.uint8)) ^ ((off >> np.uint64(12)).astype(np.uint8))


def lines(proc):
    q = []
    ev = threading.Condition()

    def pump():
        for line in proc.stdout:
            with ev:
                q.append(line.rstrip("\n"))
                ev.notify_all()

    threading.Thread(target=pump, daemon=True).start()

    def next_line(timeout=120):
        end = time.time() + timeout
        with ev:
            while not q:
                left = end - time.time()
                if left <= 0 or not ev.wait(left):
                    raise RuntimeError(f"no output from {proc.args[0]}")
            return q.pop(0)

    return next_line


def python_reader(master, args, size, pieces):
    s = crescent.MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 16 << 20, 16 << 20, "tcp", "", master) == 0, crescent.last_error()
    buf = np.zeros(args.batch * size, dtype=np.uint8)
    assert s.register_buffer(buf) == 0, crescent.last_error()
    ptrs = [buf.ctypes.data + j * size for j in range(args.batch)]
    sizes = [size] * args.batch
    # The multi-buffer layout: piece l of value j at layer l, slot j (as store-batch-get's).
    piece = size // pieces
    layer = args.batch * piece
    all_ptrs = [[buf.ctypes.data + l * layer + j * piece for l in range(pieces)] for j in range(args.batch)]
    all_sizes = [[piece] * pieces for _ in range(args.batch)]

    def keys(r):
        return [f"bench/{(r * args.batch + j) % args.count}" for j in range(args.batch)]

    def get(r):
        if pieces == 1:
            rs = s.batch_get_into(keys(r), ptrs, sizes)
        else:
            rs = s.batch_get_into_multi_buffers(keys(r), all_ptrs, all_sizes)
        if rs != sizes:
            raise RuntimeError(f"get returned {rs}: {crescent.last_error()}")

    get(0)
    expected = pattern(args.seed, size)
    for j in range(args.batch):
        value = np.concatenate([buf[p - buf.ctypes.data:p - buf.ctypes.data + piece] for p in all_ptrs[j]])
        if not np.array_equal(value, expected):
            raise RuntimeError(f"value {j} differs from the pattern")
    t = time.perf_counter()
    for r in range(1, args.rounds + 1):
        get(r)
    secs = time.perf_counter() - t
    s.unregister_buffer(buf)
    s.close()
    nbytes = args.rounds * args.batch * size
    return {"reader": "python", "pieces": pieces, "bytes": nbytes, "secs": secs, "gb_s": nbytes / secs / 1e9}


def rust_reader(bin_dir, master, args, pieces):
    out = subprocess.run(
        [str(bin_dir / "store-batch-get"), "--master", master, "--prefix", "bench/", "--count", str(args.count),
         "--size", args.size, "--batch", str(args.batch), "--rounds", str(args.rounds), "--seed", str(args.seed),
         "--pieces", str(pieces)],
        capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"store-batch-get failed: {out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin-dir", default=os.environ.get("CRESCENT_BIN_DIR",
                                                       str(pathlib.Path(os.environ.get("CARGO_TARGET_DIR",
                                                                                       REPO / "target")) / "release")))
    p.add_argument("--size", default="10M")
    p.add_argument("--count", type=int, default=16)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--pieces", type=int, default=8, help="buffers per value of the multi-buffer get")
    args = p.parse_args()
    bin_dir = pathlib.Path(args.bin_dir)
    size = parse_size(args.size)
    if args.pieces < 2 or size % args.pieces:
        p.error("--pieces must be 2 or more and divide --size")
    procs = []
    try:
        m = subprocess.Popen([str(bin_dir / "crescent-master"), "--rpc-address", "127.0.0.1:0", "--admin-address", ""],
                             stdout=subprocess.PIPE, text=True)
        procs.append(m)
        next_m = lines(m)
        master = next_m()
        while not master.startswith("master: "):
            master = next_m()
        master = master.split(" ", 1)[1]
        seg = max(64 << 20, 2 * args.count * size)
        h = subprocess.Popen([str(bin_dir / "crescent"), "client", "--master", master, "--local-hostname", "127.0.0.1",
                              "--segment-size", str(seg), "--buffer-size", "64M", "--protocol", "tcp"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        procs.append(h)
        next_h = lines(h)
        ready = next_h()
        assert ready.startswith("ready "), ready
        for i in range(args.count):
            h.stdin.write(f"batch_put {args.seed} bench/{i}:{size}\n")
            h.stdin.flush()
            answer = next_h()
            assert answer == "ok ok", answer
        print(f"holder {ready.split()[1]} holds {args.count} x {args.size}; readers: batch_get_into of "
              f"{args.batch} x {args.size}, {args.rounds} batches per run, tcp over loopback")
        calls = {1: ("batch_get_into", "batch_get_into"),
                 args.pieces: ("batch_get_into_multi_buffers", "batch_get_into_sg")}
        runs = {(pieces, name): [] for pieces in calls for name in ("python", "rust")}
        for rep in range(args.repeats):
            for pieces, (py_call, rs_call) in calls.items():
                load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
                print(f"  pair {rep + 1} {py_call} ({pieces} buffer(s) per value), load {load}")
                for name, run in (("python", lambda: python_reader(master, args, size, pieces)),
                                  ("rust", lambda: rust_reader(bin_dir, master, args, pieces))):
                    r = run()
                    runs[(pieces, name)].append(r["gb_s"])
                    call = py_call if name == "python" else rs_call
                    print(f"    {name:6s} {call:28s} {r['gb_s']:6.2f} GB/s "
                          f"({r['bytes'] / 1e9:.2f} GB in {r['secs']:.2f} s)")
        for pieces, (py_call, rs_call) in calls.items():
            py, rs = statistics.median(runs[(pieces, "python")]), statistics.median(runs[(pieces, "rust")])
            print(f"{py_call} {args.batch} x {args.size} ({pieces} buffer(s) per value): Python {py:.2f} GB/s, "
                  f"Rust ({rs_call}) {rs:.2f} GB/s, ratio {py / rs:.3f} (target >= 0.90)")
        h.stdin.write("quit\n")
        h.stdin.flush()
        h.wait(timeout=30)
        return 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


if __name__ == "__main__":
    sys.exit(main())
