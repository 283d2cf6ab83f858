#!/usr/bin/env python3
"""A replica copy task against the engine's read of the same bytes on the same link (issue 45:
a copy task of 1 GiB between two clients >= 0.80 of the engine's read throughput).

    benches/copy-task.py [--size 1G] [--pairs 5] [--out FILE]

Starts a crescent-master ($BIN_DIR, else target/release; release builds) and two holder
processes (this script, --holder) with a segment of --size + 64 MiB each, on loopback, tcp.
This process, a client without a segment, then runs --pairs pairs, the two of each pair in
alternating order:
* copy: a value of --size bytes is put from registered memory onto holder A (untimed), then
  `create_copy_task(key, [B])` is timed until `query_task` says SUCCESS (polled every
  millisecond) and the new replica on B checked (its bytes read back through it, untimed); the
  key is removed after;
* engine read: this process's transfer engine reads --size bytes from a target engine process
  (this script, --target) into registered memory with one `transfer_sync_read`.
Writes each pair as `copy engine` (MiB/s) to --out (default: a temporary file) and prints the
row through benches/pairs.py: both medians and the median of the per-pair ratios against the
target >= 0.80. Needs the `crescent` package (ci/ffi.sh's release wheel in .venv).
"""

import argparse
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

import crescent
from crescent.engine import TransferEngine
from crescent.store import MooncakeDistributedStore, ReplicateConfig, TaskStatus

REPO = pathlib.Path(__file__).resolve().parents[1]
MiB = 1 << 20


def parse_size(s: str) -> int:
    units = {"K": 10, "M": 20, "G": 30}
    s = s.strip().upper().rstrip("B").rstrip("I")
    return int(s[:-1]) << units[s[-1]] if s[-1] in units else int(s)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def connect(master: str, segment: int) -> MooncakeDistributedStore:
    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", "P2PHANDSHAKE", segment, 16 * MiB, "tcp", "", master)
    if rc != 0:
        sys.exit(f"copy-task: setup returned {rc}: {crescent.last_error()}")
    return s


def holder(master: str, segment: int) -> None:
    s = connect(master, segment)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"ready {s.get_hostname()}", flush=True)
    sys.stdin.read()  # until the driver closes it
    s.close()


def target(size: int) -> None:
    te = TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, crescent.last_error()
    addr = te.allocate_managed_buffer(size)
    assert addr != 0, crescent.last_error()
    print(json.dumps({"name": te.get_segment_name(), "addr": addr}), flush=True)
    sys.stdin.read()


def spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)


def timed_copy(s: MooncakeDistributedStore, key: str, target: str) -> float:
    start = time.perf_counter()
    task, rc = s.create_copy_task(key, [target])
    if rc != 0:
        sys.exit(f"copy-task: create_copy_task returned {rc}: {crescent.last_error()}")
    while True:
        info, rc = s.query_task(task)
        if rc != 0:
            sys.exit(f"copy-task: query_task returned {rc}: {crescent.last_error()}")
        if info.status == TaskStatus.SUCCESS:
            return time.perf_counter() - start
        if info.status == TaskStatus.FAILED:
            sys.exit(f"copy-task: the task failed: {info.message}")
        time.sleep(0.001)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="1G")
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--out")
    p.add_argument("--holder", help=argparse.SUPPRESS)
    p.add_argument("--target", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    size = parse_size(a.size)
    if a.holder:
        return holder(a.holder, size + 64 * MiB)
    if a.target:
        return target(size)

    bin_dir = pathlib.Path(os.environ.get("BIN_DIR", REPO / "target" / "release"))
    port = free_port()
    master = subprocess.Popen([str(bin_dir / "crescent-master"), "--rpc-address", f"127.0.0.1:{port}",
                               "--admin-address", "", "--lease-ttl-ms", "1000"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs = []
    try:
        addr = f"127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    sys.exit("copy-task: the master did not start")
                time.sleep(0.1)
        holders = [spawn("--holder", addr, "--size", str(size)) for _ in range(2)]
        procs += holders
        seg_a, seg_b = (h.stdout.readline().split()[1] for h in holders)
        peer = spawn("--target", "--size", str(size))
        procs.append(peer)
        hello = json.loads(peer.stdout.readline())

        s = connect(addr, 0)
        value = np.random.default_rng(5).integers(0, 256, size, dtype=np.uint8)
        assert s.register_buffer(value.ctypes.data, size) == 0, crescent.last_error()
        back = np.zeros(size, dtype=np.uint8)
        assert s.register_buffer(back.ctypes.data, size) == 0, crescent.last_error()
        te = TransferEngine()
        assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, crescent.last_error()
        local = te.allocate_managed_buffer(size)
        assert local != 0, crescent.last_error()
        te.transfer_sync_read(hello["name"], local, hello["addr"], MiB)  # opens the connection: untimed

        on_a = ReplicateConfig()
        on_a.replica_num = 1
        on_a.preferred_segment = seg_a

        def copy(i: int) -> float:
            key = f"copy-{os.getpid()}-{i}"
            assert s.put_from(key, value.ctypes.data, size, on_a) == 0, crescent.last_error()
            secs = timed_copy(s, key, seg_b)
            where = sorted(r.get_memory_descriptor().buffer_descriptor.transport_endpoint
                           for r in s.get_replica_desc(key))
            assert where == sorted([seg_a, seg_b]), f"replicas on {where}, not on A and B"
            while s.remove(key, True) not in (0, -704):
                time.sleep(0.01)
            return size / MiB / secs

        def engine(i: int) -> float:
            start = time.perf_counter()
            assert te.transfer_sync_read(hello["name"], local, hello["addr"], size) == 0, crescent.last_error()
            return size / MiB / (time.perf_counter() - start)

        copy(-1)  # warm-up: the holders' first contact with each other
        out = pathlib.Path(a.out) if a.out else pathlib.Path(tempfile.mkstemp(prefix="copy-task.")[1])
        out.write_text("")
        subprocess.run([sys.executable, REPO / "benches/pairs.py", "load", "start"], check=True)
        for i in range(a.pairs):
            if i % 2 == 0:
                c, e = copy(i), engine(i)
            else:
                e, c = engine(i), copy(i)
            print(f"  pair {i + 1} of {a.pairs} (MiB/s): copy task {c:.0f}, engine read {e:.0f}", file=sys.stderr)
            with out.open("a") as f:
                f.write(f"{c:.1f} {e:.1f}\n")
        label = f"copy task / engine read|{a.size}"
        subprocess.run([sys.executable, REPO / "benches/pairs.py", "header", "op|size", "copy MiB/s",
                        "engine read MiB/s"], check=True)
        subprocess.run([sys.executable, REPO / "benches/pairs.py", "row", label, str(out), "--target", ">=0.80"],
                       check=True)
        subprocess.run([sys.executable, REPO / "benches/pairs.py", "load", "end"], check=True)
        s.close()
    finally:
        for proc in procs:
            try:
                proc.stdin.close()
                proc.wait(timeout=30)
            except Exception:  # noqa: BLE001
                proc.kill()
        master.kill()
        master.wait()


if __name__ == "__main__":
    main()
