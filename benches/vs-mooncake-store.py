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
      put and get; checks every value read; prints `<put MiB/s> <get MiB/s> <puts/s>` on one
      line (bytes, and puts, over the summed time of the calls of each kind), then removes its
      keys.
  PYTHON vs-mooncake-store.py batch --master 127.0.0.1:PORT --count 32 --size 1M [--bytes 256M]
      contributes no segment: `batch_put_from` of --count keys of --size bytes each from one
      registered buffer, --bytes in all after one untimed warm-up batch (one of its values read
      back with `get` and checked); prints `<MiB/s>` (bytes over the summed time of the batch
      calls), removing each batch's keys before the next.
  PYTHON vs-mooncake-store.py tensor --master 127.0.0.1:PORT [--size 256M] [--shards 8]
      [--rounds 3] (Crescent's package: upstream's tensor methods need torch)
      contributes no segment: per round, `put_tensor_with_tp` of a --size float32 tensor split
      into --shards along dim 0 against `batch_put_from` of the same bytes (--shards keys of a
      header and a shard each, from one registered buffer), then `get_tensor_with_tp` of every
      rank against `batch_get_into` of those keys into registered buffers and against one
      `batch_get_into` per key (rank by rank, one call per shard as get_tensor_with_tp makes),
      in alternating order; checks what it reads; prints `<tp put> <batch_put_from> <tp get>
      <batch_get_into> <batch_get_into per key>` in MiB/s (bytes over the summed time of each
      kind's calls).

  PYTHON vs-mooncake-store.py calls --master 127.0.0.1:PORT --size 64K [--count 2000]
      contributes no segment: --count rounds of `is_exist` of a key not stored, `put` of a
      --size value and `get` of it, each call timed alone; prints the medians `<exists us>
      <put us> <get us>` (the first 10 rounds open the connections: not counted), then removes
      its keys (benches/call-latency.sh).
  PYTHON vs-mooncake-store.py pingpong [--count 5000]
      the limit of a call: a 64-byte message to a process of this interpreter and back over
      loopback tcp (TCP_NODELAY), --count times; prints the median in microseconds.

Loopback only: the client's hostname is 127.0.0.1, protocol tcp, metadata P2PHANDSHAKE.
"""

import argparse
import ctypes
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
    print(f"{mib / put_s:.1f} {mib / get_s:.1f} {count / put_s:.0f}", flush=True)
    remove(s, keys)
    s.close()


def remove(s, keys):
    """Frees the holder's space for the next run. A get's read lease (the masters run with a
    short --default_kv_lease_ttl) refuses a remove for a moment (-706, OBJECT_HAS_LEASE); -704
    is OBJECT_NOT_FOUND. No is_exist here: upstream's renews the lease."""
    left, deadline = keys, time.monotonic() + 10
    while left and time.monotonic() < deadline:
        left = [k for k in left if s.remove(k) not in (0, -704)]
        if left:
            time.sleep(0.1)
    if left:
        sys.exit(f"vs-mooncake-store: {len(left)} key(s) could not be removed")


def registered(s, n):
    """A bytearray of `n` random bytes registered with `s`, and its address (by address, as
    upstream's binding takes it)."""
    buf = bytearray(os.urandom(n))
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    if s.register_buffer(addr, n) != 0:
        sys.exit(f"vs-mooncake-store: register_buffer of {n} bytes failed")
    return buf, addr


def batch(a):
    n, count = size(a.size), a.count
    rounds = max(1, size(a.bytes) // (n * count))
    s, _ = store(a.master, 0, 64 << 20)
    buf, addr = registered(s, n * count)
    tag = f"vsb-{os.getpid()}"
    took, all_keys = 0.0, []
    for r in range(rounds + 1):  # round 0 opens the connections: not timed
        keys = [f"{tag}-{r}-{i}" for i in range(count)]
        t0 = time.perf_counter()
        rcs = s.batch_put_from(keys, [addr + i * n for i in range(count)], [n] * count)
        t1 = time.perf_counter()
        all_keys += keys
        if any(rc != 0 for rc in rcs):
            sys.exit(f"vs-mooncake-store: batch_put_from of {count} x {n} bytes returned {rcs}")
        if r == 0 and s.get(keys[-1]) != bytes(buf[(count - 1) * n:]):
            sys.exit(f"vs-mooncake-store: get({keys[-1]!r}) is not the value put")
        if r > 0:
            took += t1 - t0
        remove(s, keys)  # the holder's segment holds a few rounds, not all
    print(f"{rounds * count * n / (1 << 20) / took:.1f}", flush=True)
    s.unregister_buffer(addr)
    s.close()


def tensor(a):
    import numpy as np

    n, shards = size(a.size), a.shards
    s, _ = store(a.master, 0, 64 << 20)
    if not hasattr(s, "put_tensor_with_tp"):
        sys.exit("vs-mooncake-store: this package has no put_tensor_with_tp")
    full = np.frombuffer(os.urandom(n), dtype=np.float32).reshape(shards, -1)
    shard = n // shards
    # The baseline's values: the same bytes as the tensor's objects (a 304-byte header and a
    # shard each), in registered memory, put and read back with the batch calls.
    header = 304
    obj = header + shard  # bytes of one object, the tensor's or the baseline's
    src, src_addr = registered(s, shards * obj)
    dst, dst_addr = registered(s, shards * obj)
    tag = f"vst-{os.getpid()}"
    took = {"tp_put": 0.0, "batch_put": 0.0, "tp_get": 0.0, "batch_get": 0.0, "key_get": 0.0}

    def timed(name, r, call):
        """What `call()` returns; its time is added to took[name] but in round 0."""
        t0 = time.perf_counter()
        out = call()
        took[name] += time.perf_counter() - t0 if r else 0
        return out

    def batch_keys(r):
        return [f"{tag}-b{r}-{i}" for i in range(shards)]

    def tp_put(r):
        rc = timed("tp_put", r,
                   lambda: s.put_tensor_with_tp(f"{tag}-t{r}", full, tp_rank=0, tp_size=shards, split_dim=0))
        if rc != 0:
            sys.exit(f"vs-mooncake-store: put_tensor_with_tp returned {rc}")

    def batch_put(r):
        keys = batch_keys(r)
        rcs = timed("batch_put", r,
                    lambda: s.batch_put_from(keys, [src_addr + i * obj for i in range(shards)], [obj] * shards))
        if any(rc != 0 for rc in rcs):
            sys.exit(f"vs-mooncake-store: batch_put_from returned {rcs}")

    def tp_get(r):
        got = timed("tp_get", r, lambda: [s.get_tensor_with_tp(f"{tag}-t{r}", tp_rank=rank, tp_size=shards)
                                          for rank in range(shards)])
        for rank, t in enumerate(got):
            if t is None or np.asarray(t).tobytes() != full[rank:rank + 1].tobytes():  # random bits: NaNs too
                sys.exit(f"vs-mooncake-store: get_tensor_with_tp rank {rank} is not the shard put")

    def batch_get(r):
        keys = batch_keys(r)
        got = timed("batch_get", r,
                    lambda: s.batch_get_into(keys, [dst_addr + i * obj for i in range(shards)], [obj] * shards))
        if got != [obj] * shards or dst[:obj] != src[:obj]:
            sys.exit(f"vs-mooncake-store: batch_get_into returned {got}")

    def key_get(r):
        keys = batch_keys(r)
        got = timed("key_get", r, lambda: [read for i in range(shards)
                                           for read in s.batch_get_into([keys[i]], [dst_addr + i * obj], [obj])])
        if got != [obj] * shards or dst[:obj] != src[:obj]:
            sys.exit(f"vs-mooncake-store: batch_get_into of one key returned {got}")

    for r in range(a.rounds + 1):  # round 0 opens the connections: not timed
        for group in ((tp_put, batch_put), (tp_get, batch_get, key_get)):
            for f in (group if r % 2 else group[::-1]):
                f(r)
        remove(s, [f"{tag}-t{r}_tp_{i}" for i in range(shards)] + batch_keys(r))
    mib = a.rounds * shards * obj / (1 << 20)
    print(" ".join(f"{mib / took[k]:.1f}" for k in ("tp_put", "batch_put", "tp_get", "batch_get", "key_get")),
          flush=True)
    s.unregister_buffer(src_addr)
    s.unregister_buffer(dst_addr)
    s.close()


def calls(a):
    import statistics

    n = size(a.size)
    s, _ = store(a.master, 0, max(2 * n, 64 << 20))
    value = os.urandom(n)
    tag = f"vsc-{os.getpid()}"
    keys = [f"{tag}-{i}" for i in range(a.count)]
    took = {"exists": [], "put": [], "get": []}
    for key in keys:
        t0 = time.perf_counter()
        s.is_exist(f"{key}-absent")
        t1 = time.perf_counter()
        rc = s.put(key, value)
        t2 = time.perf_counter()
        got = s.get(key)
        t3 = time.perf_counter()
        if rc != 0 or got != value:
            sys.exit(f"vs-mooncake-store: put({key!r}) returned {rc}, or its get another value")
        for name, t in (("exists", t1 - t0), ("put", t2 - t1), ("get", t3 - t2)):
            took[name].append(t)
    med = [statistics.median(took[k][10:]) * 1e6 for k in ("exists", "put", "get")]
    print(" ".join(f"{m:.0f}" for m in med), flush=True)
    remove(s, keys)
    s.close()


def pingpong(a):
    import socket
    import statistics
    import subprocess

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    echo = (
        "import socket,sys\n"
        f"c=socket.create_connection(('127.0.0.1',{port}))\n"
        "c.setsockopt(socket.IPPROTO_TCP,socket.TCP_NODELAY,1)\n"
        "while True:\n"
        "    d=c.recv(256)\n"
        "    if not d: break\n"
        "    c.sendall(d)\n"
    )
    peer = subprocess.Popen([sys.executable, "-c", echo])
    c, _ = listener.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    took, msg = [], b"x" * 64
    for _ in range(a.count):
        t0 = time.perf_counter()
        c.sendall(msg)
        got = 0
        while got < len(msg):
            got += len(c.recv(256))
        took.append(time.perf_counter() - t0)
    c.close()
    peer.wait(5)
    print(f"{statistics.median(took[10:]) * 1e6:.0f}", flush=True)


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
    p = sub.add_parser("batch")
    p.add_argument("--master", required=True)
    p.add_argument("--count", type=int, default=32)
    p.add_argument("--size", default="1M")
    p.add_argument("--bytes", default="256M")
    p = sub.add_parser("tensor")
    p.add_argument("--master", required=True)
    p.add_argument("--size", default="256M")
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p = sub.add_parser("calls")
    p.add_argument("--master", required=True)
    p.add_argument("--size", default="64K")
    p.add_argument("--count", type=int, default=2000)
    p = sub.add_parser("pingpong")
    p.add_argument("--count", type=int, default=5000)
    a = ap.parse_args()
    cmds = {"holder": holder, "reader": reader, "batch": batch, "tensor": tensor, "calls": calls, "pingpong": pingpong}
    cmds[a.cmd](a)


if __name__ == "__main__":
    main()
