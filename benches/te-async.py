#!/usr/bin/env python3
"""Mooncake's async TransferEngine calls vs the sync ones, measured in the same run.

    benches/te-async.py [--protocol tcp] [--size 1M] [--batch 4] [--inflight 4]
                        [--rounds 64] [--repeats 3]

Starts a target engine in a child process (this script with --target) holding a managed
buffer, then alternates, --repeats times, two writers in this process moving the same bytes:
* sync: `batch_transfer_sync_write` of --batch requests of --size bytes, one batch at a time;
* async: `batch_transfer_async_write` of the same batches with --inflight of them in flight,
  the oldest waited for with `get_batch_transfer_status` before the next is submitted.
Each runs --rounds batches. The first round of each is checked byte for byte (a read back,
untimed). Prints each run, the median of each, and the ratio async / sync (target >= 1.0: the
async API moves at least as much). Needs the `crescent` package installed (maturin wheel).
"""

import argparse
import json
import statistics
import subprocess
import sys
import time

import numpy as np

import crescent
from crescent.engine import TransferEngine


def parse_size(s: str) -> int:
    units = {"K": 10, "M": 20, "G": 30}
    s = s.strip().upper().rstrip("B").rstrip("I")
    return int(s[:-1]) << units[s[-1]] if s[-1] in units else int(s)


def target(protocol: str, size: int) -> None:
    te = TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", protocol, "") == 0, crescent.last_error()
    addr = te.allocate_managed_buffer(size)
    assert addr != 0, crescent.last_error()
    print(json.dumps({"name": te.get_segment_name(), "addr": addr}), flush=True)
    sys.stdin.read()  # until the initiator closes it


def check(te, name, local, remote, n):
    """Reads the target's first `n` bytes back into a scratch copy and compares."""
    scratch = te.allocate_managed_buffer(n)
    assert te.batch_transfer_sync_read(name, [scratch], [remote], [n]) == 0, crescent.last_error()
    assert te.read_bytes_from_buffer(scratch, n) == te.read_bytes_from_buffer(local, n), "data differs"
    assert te.free_managed_buffer(scratch, n) == 0


def batches(local, remote, args, size):
    """--inflight batch shapes over distinct ranges; both writers cycle through all of them, so
    they touch the same memory."""
    span = args.batch * size
    shapes = []
    for k in range(args.inflight):
        offs = [k * span + i * size for i in range(args.batch)]
        shapes.append(([local + o for o in offs], [remote + o for o in offs], [size] * args.batch))
    return shapes


def run_sync(te, name, local, remote, args, size):
    shapes = batches(local, remote, args, size)
    assert te.batch_transfer_sync_write(name, *shapes[0]) == 0, crescent.last_error()
    check(te, name, local, remote, args.batch * size)
    start = time.perf_counter()
    for r in range(args.rounds):
        assert te.batch_transfer_sync_write(name, *shapes[r % args.inflight]) == 0, crescent.last_error()
    return args.rounds * args.batch * size / (time.perf_counter() - start)


def run_async(te, name, local, remote, args, size):
    span = args.batch * size
    shapes = batches(local, remote, args, size)
    first = te.batch_transfer_async_write(name, *shapes[0])
    assert first != 0 and te.get_batch_transfer_status([first]) == 0, crescent.last_error()
    check(te, name, local, remote, span)
    start = time.perf_counter()
    window = []
    for r in range(args.rounds):
        if len(window) == args.inflight:
            assert te.get_batch_transfer_status([window.pop(0)]) == 0, crescent.last_error()
        bid = te.batch_transfer_async_write(name, *shapes[r % args.inflight])
        assert bid != 0, crescent.last_error()
        window.append(bid)
    assert te.get_batch_transfer_status(window) == 0, crescent.last_error()
    return args.rounds * span / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--protocol", default="tcp")
    p.add_argument("--size", default="1M")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--inflight", type=int, default=4)
    p.add_argument("--rounds", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--target", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    size = parse_size(args.size)
    total = args.inflight * args.batch * size
    if args.target:
        return target(args.protocol, total)
    peer = subprocess.Popen(
        [sys.executable, __file__, "--target", "--protocol", args.protocol, "--size", str(size),
         "--batch", str(args.batch), "--inflight", str(args.inflight)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        hello = json.loads(peer.stdout.readline())
        name, remote = hello["name"], hello["addr"]
        te = TransferEngine()
        assert te.initialize("127.0.0.1", "P2PHANDSHAKE", args.protocol, "") == 0, crescent.last_error()
        local = te.allocate_managed_buffer(total)
        data = np.random.default_rng(7).integers(0, 256, total, dtype=np.uint8).tobytes()
        assert te.write_bytes_to_buffer(local, data, total) == 0
        print(f"protocol {args.protocol}: batches of {args.batch} x {size} B writes, {args.rounds} per run, "
              f"async with {args.inflight} batches in flight")
        sync, asyn = [], []
        for i in range(args.repeats):
            sync.append(run_sync(te, name, local, remote, args, size))
            asyn.append(run_async(te, name, local, remote, args, size))
            print(f"  run {i + 1}: sync {sync[-1] / 1e9:.2f} GB/s   async {asyn[-1] / 1e9:.2f} GB/s")
        s, a = statistics.median(sync), statistics.median(asyn)
        print(f"median: sync {s / 1e9:.2f} GB/s   async {a / 1e9:.2f} GB/s   async / sync = {a / s:.2f}")
    finally:
        peer.stdin.close()
        peer.wait(timeout=30)


if __name__ == "__main__":
    main()
