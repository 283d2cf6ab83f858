#!/usr/bin/env python3
"""One side of benches/vs-mooncake.sh's store rows: `mooncake.store` as a user calls it.

Run by the interpreter of the venv under test (upstream's wheel, or Crescent's `.venv` with the
`mooncake` alias): the same file drives both, so the two sides make exactly the same calls.

  PYTHON vs-mooncake-store.py holder --master 127.0.0.1:PORT [--segment 1G]
      contributes a segment of --segment bytes, prints `ready <mooncake package dir>`, and holds
      it until SIGTERM or SIGINT (or until its parent is gone).
  PYTHON vs-mooncake-store.py reader --master 127.0.0.1:PORT --size 1M [--bytes 256M]
      contributes no segment (global_segment_size 0): puts values of --size bytes (they land
      in the holder's segment) and gets each back, --bytes in all after one untimed warm-up
      put and get; checks every value read; prints `<put MiB/s> <get MiB/s>` on one line
      (bytes over the summed time of the calls of each kind), then removes its keys.

Loopback only: the client's hostname is 127.0.0.1, protocol tcp, metadata P2PHANDSHAKE.
"""

import argparse
import os
import signal
import sys
import time


def size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    return int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)


def store(master, segment, local_buffer):
    import mooncake
    from mooncake.store import MooncakeDistributedStore

    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", "P2PHANDSHAKE", segment, local_buffer, "tcp", "", master)
    if rc != 0:
        sys.exit(f"vs-mooncake-store: setup(..., master {master}) returned {rc}")
    return s, os.path.dirname(mooncake.__file__)


def holder(a):
    parent = os.getppid()
    s, where = store(a.master, size(a.segment), 16 << 20)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
    print(f"ready {where}", flush=True)
    try:
        while os.getppid() == parent:  # until ended, or orphaned by a script that was killed
            time.sleep(1)
    finally:
        s.close()


def reader(a):
    n = size(a.size)
    count = max(3, size(a.bytes) // n)
    s, _ = store(a.master, 0, max(2 * n, 64 << 20))
    value = os.urandom(n)
    tag = f"vs-{os.getpid()}"
    keys = [f"{tag}-warm"] + [f"{tag}-{i}" for i in range(count)]
    put_s = get_s = 0.0
    for i, key in enumerate(keys):
        t0 = time.perf_counter()
        rc = s.put(key, value)
        t1 = time.perf_counter()
        got = s.get(key)
        t2 = time.perf_counter()
        if rc != 0:
            sys.exit(f"vs-mooncake-store: put({key!r}, {n} bytes) returned {rc}")
        if len(got) != n or got != value:
            sys.exit(f"vs-mooncake-store: get({key!r}) returned {len(got)} bytes, not the {n} put")
        if i > 0:  # the first pair of calls opens the connections: not timed
            put_s += t1 - t0
            get_s += t2 - t1
    mib = count * n / (1 << 20)
    print(f"{mib / put_s:.1f} {mib / get_s:.1f}", flush=True)
    # Free the holder's space for the next run. A get's read lease (the masters run with a
    # short --default_kv_lease_ttl) refuses a remove for a moment (-706, OBJECT_HAS_LEASE);
    # -704 is OBJECT_NOT_FOUND. No is_exist here: upstream's renews the lease.
    left, deadline = keys, time.monotonic() + 10
    while left and time.monotonic() < deadline:
        left = [k for k in left if s.remove(k) not in (0, -704)]
        if left:
            time.sleep(0.1)
    s.close()
    if left:
        sys.exit(f"vs-mooncake-store: {len(left)} key(s) could not be removed")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("holder")
    p.add_argument("--master", required=True)
    p.add_argument("--segment", default="1G")
    p = sub.add_parser("reader")
    p.add_argument("--master", required=True)
    p.add_argument("--size", required=True)
    p.add_argument("--bytes", default="256M")
    a = ap.parse_args()
    holder(a) if a.cmd == "holder" else reader(a)


if __name__ == "__main__":
    main()
