"""`get` returning bytes (issue 28 §2): the value is read straight into the `bytes` object the
call returns (made, unzeroed, once the master gave the size; written with the GIL released),
so the call holds one copy of the value, never two. Exact bytes at sizes around pages and the
2 MiB piece, from another client's memory, the client's own, and the disk tier; errors as
before (empty bytes).
"""

import re

import pytest

import crescent
from conftest import MiB, Master, connect, pattern

_n = 0


def key(tag: str) -> str:
    global _n
    _n += 1
    return f"byte-get/{tag}/{_n}"


SIZES = [1, 2, 4095, 4096, 4097, 2 * MiB - 1, 2 * MiB + 1, 6 * MiB + 5]


def test_get_returns_exact_bytes_across_pages_from_memory(store_a, store_b):
    for i, n in enumerate(SIZES):
        k = key("mem")
        v = pattern(n, 100 + i).tobytes()
        assert store_a.put(k, v) == 0, crescent.last_error()
        for who, s in [("other client", store_b), ("own segment", store_a)]:
            got = s.get(k)
            assert type(got) is bytes, who
            assert len(got) == n, (who, n)
            assert got == v, (who, n)
            # A finished bytes object: hashes and slices as one made from the same bytes.
            assert hash(got) == hash(v) and got[-1:] == v[-1:], (who, n)
    # A batch: each value into its own bytes, a miss empty.
    keys = [key("batch") for _ in SIZES]
    values = [pattern(n, 300 + i).tobytes() for i, n in enumerate(SIZES)]
    assert store_a.put_batch(keys, values) == 0, crescent.last_error()
    for s in (store_b, store_a):
        got = s.get_batch(keys + [key("missing")])
        assert [type(g) for g in got] == [bytes] * (len(keys) + 1)
        assert got == values + [b""]
    # Two gets of one key are two objects with the same bytes.
    a, b = store_b.get(k), store_b.get(k)
    assert a == b and a is not b


def test_get_misses_and_failures_return_empty_bytes_as_before(store_b):
    k = key("missing")
    assert store_b.get(k) == b""
    assert k in crescent.last_error()
    assert store_b.get_batch([k]) == [b""]


def test_get_reads_the_disk_tier_here_and_through_another_client(master, store_b, tmp_path):
    def disk_client():
        s = crescent.MooncakeDistributedStore()
        rc = s.setup("127.0.0.1", "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "tcp", "", master.addr,
                     enable_ssd_offload=True, ssd_offload_path=str(tmp_path))
        assert rc == 0, crescent.last_error()
        return s

    s = disk_client()
    keys = [key("disk") for _ in SIZES[:-1]]
    values = [pattern(n, 200 + i).tobytes() for i, n in enumerate(SIZES[:-1])]
    for k, v in zip(keys, values):
        assert s.put(k, v) == 0, crescent.last_error()
    assert s.close() == 0  # waits for the files to be written; the memory copies go
    # Restarted on the same root: its files are the only copies now.
    s = disk_client()
    try:
        for k, v in zip(keys, values):
            assert s.get(k) == v, f"{len(v)} bytes from the local file"
            assert store_b.get(k) == v, f"{len(v)} bytes through the disk service"
    finally:
        s.close()


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M).group(1))


def test_a_get_and_a_batch_get_hold_one_copy_of_the_value():
    # 48 MiB: above glibc's largest mmap threshold (32 MiB), so every buffer of that size is
    # its own mapping, resident while it lives and gone when freed; the process's peak RSS
    # then says how many copies a get held at once. Reading the value into a vector and
    # copying that into the bytes object (the old get) holds two.
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError as e:
        pytest.skip(f"peak RSS cannot be reset here: {e}")
    n = 48 * MiB
    m = Master("--lease-ttl-ms", "30000", "--allocation-strategy", "local-first")
    holder = connect(m, segment=2 * n + 16 * MiB)
    reader = connect(m, segment=16 * MiB)
    try:
        v = pattern(n, 7)
        assert holder.put("warm", v) == 0 and holder.put("big", v) == 0, crescent.last_error()
        # The first get opens the connections and threads; its value is freed.
        assert len(reader.get("warm")) == n
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        base = _status_kib("VmRSS")
        got = reader.get("big")
        grew = (_status_kib("VmHWM") - base) << 10
        assert len(got) == n and got == v.tobytes()
        assert grew < 1.5 * n, f"the get's peak held {grew / n:.2f}x the value (one copy: about 1x)"
        del got
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        base = _status_kib("VmRSS")
        got = reader.get_batch(["big"])
        grew = (_status_kib("VmHWM") - base) << 10
        assert len(got[0]) == n and got[0] == v.tobytes()
        assert grew < 1.5 * n, f"the batch get's peak held {grew / n:.2f}x the value (one copy: about 1x)"
    finally:
        reader.close()
        holder.close()
        m.stop()
