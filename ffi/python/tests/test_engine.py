"""TransferEngine: every method against an engine in another process (te_peer.py) over tcp and
shm, notifications, and bad input getting Mooncake's codes with a message."""

import json
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest

import crescent
from crescent import engine as mooncake_engine
from crescent.engine import TransferEngine, TransferNotify, TransferOpcode

MiB = 1 << 20
PEER = pathlib.Path(__file__).with_name("te_peer.py")
UNKNOWN = "127.0.0.1:1"  # nothing listens on port 1


class Peer:
    """An engine in another process, its managed buffer, and its notifications."""

    def __init__(self, protocol: str, size: int = 16 * MiB, location: str = ""):
        self.proc = subprocess.Popen(
            [sys.executable, str(PEER), protocol, str(size), location],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        hello = json.loads(self.proc.stdout.readline() or '{"error": "the peer exited"}')
        if "error" in hello:
            self.stop()
            raise RuntimeError(hello["error"])
        self.name, self.addr, self.len = hello["name"], hello["addr"], hello["len"]

    def ask(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def read(self, off: int, n: int) -> bytes:
        return bytes.fromhex(self.ask(op="read", off=off, len=n)["hex"])

    def fill(self, off: int, data: bytes) -> None:
        assert self.ask(op="fill", off=off, hex=data.hex())["ok"]

    def notifies(self, want: int = 0, wait: float = 10.0) -> list:
        """The notifications taken within `wait` seconds (until `want` came); then a short
        quiet time that lets a duplicate show up."""
        got, end = [], time.time() + wait
        while len(got) < want and time.time() < end:
            got += [tuple(n) for n in self.ask(op="notifies")["notifies"]]
            time.sleep(0.01)
        time.sleep(0.1)
        return got + [tuple(n) for n in self.ask(op="notifies")["notifies"]]

    def stop(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module", params=["tcp", "shm"])
def pair(request):
    """(initiator in this process, peer process), both forced to one protocol."""
    peer = Peer(request.param)
    te = TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", request.param, "") == 0, crescent.last_error()
    yield te, peer
    peer.stop()


def rand(n: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def test_names_match_mooncake():
    for name in [
        "initialize", "initialize_ext", "get_rpc_port", "get_engine", "get_engine_ptr", "register_memory",
        "unregister_memory", "batch_register_memory", "batch_unregister_memory", "transfer_sync",
        "transfer_sync_read", "transfer_sync_write", "batch_transfer_sync", "batch_transfer_sync_read",
        "batch_transfer_sync_write", "batch_transfer_async", "batch_transfer_async_read",
        "batch_transfer_async_write", "get_batch_transfer_status", "transfer_submit_write", "transfer_check_status",
        "send_probe", "get_notifies", "allocate_managed_buffer", "free_managed_buffer", "get_first_buffer_address",
        "write_bytes_to_buffer", "read_bytes_from_buffer", "warmup_efa_segment", "transfer_write_on_cuda",
        "transfer_read_on_cuda", "batch_transfer_write_on_cuda", "batch_transfer_read_on_cuda",
    ]:
        assert callable(getattr(TransferEngine, name)), name
    assert crescent.TransferEngine is TransferEngine
    assert TransferEngine.TransferOpcode is TransferOpcode
    assert (int(TransferOpcode.Read), int(TransferOpcode.Write)) == (0, 1)
    assert TransferOpcode.Read == 0 and TransferOpcode.Write == 1
    assert mooncake_engine.Read == TransferOpcode.Read and mooncake_engine.Write == TransferOpcode.Write
    assert mooncake_engine.SUPPORT_CUDA, "device memory and the *_on_cuda calls are in every build"
    n = TransferNotify()
    assert (n.name, n.msg) == ("", "")
    n = TransferNotify(name="a", msg="b")
    n.msg = "c"
    assert (n.name, n.msg) == ("a", "c") and n == TransferNotify("a", "c")


def test_sync_transfers_move_exact_bytes(pair):
    te, peer = pair
    assert te.get_rpc_port() > 0 and te.get_segment_name() == f"127.0.0.1:{te.get_rpc_port()}"
    assert te.get_engine() is not None and te.get_engine_ptr() != 0
    assert te.get_first_buffer_address(peer.name) == peer.addr
    assert te.send_probe(peer.name) == 0
    local = te.allocate_managed_buffer(4 * MiB)
    assert local != 0
    data = rand(4 * MiB, 1)
    assert te.write_bytes_to_buffer(local, data, len(data)) == 0
    # Mooncake's int addresses: write, read back into zeroed memory, compare.
    assert te.transfer_sync_write(peer.name, local, peer.addr, 4 * MiB) == 0
    assert peer.read(4 * MiB - 100, 100) == data[-100:]
    assert te.write_bytes_to_buffer(local, bytes(4 * MiB), 4 * MiB) == 0
    assert te.transfer_sync_read(peer.name, local, peer.addr, 4 * MiB, transport_hint="tcp") == 0
    assert te.read_bytes_from_buffer(local, 4 * MiB) == data
    # transfer_sync with an opcode (enum or int) and odd offsets and sizes.
    peer.fill(7, b"abcdefghij")
    assert te.transfer_sync(peer.name, local + 3, peer.addr + 7, 10, TransferOpcode.Read) == 0
    assert te.read_bytes_from_buffer(local + 3, 10) == b"abcdefghij"
    assert te.write_bytes_to_buffer(local + 1, "xyz", 3) == 0
    assert te.transfer_sync(peer.name, local + 1, peer.addr + 5 * MiB + 1, 3, 1) == 0
    assert peer.read(5 * MiB + 1, 3) == b"xyz"
    # Batches: three pieces written shuffled, read back in one batch.
    pieces = [rand(1000 + i, 10 + i) for i in range(3)]
    offs = [0, 5000, 9000]
    for p, o in zip(pieces, offs):
        assert te.write_bytes_to_buffer(local + o, p, len(p)) == 0
    remote = [peer.addr + 6 * MiB + o for o in (9000, 0, 5000)]
    lens = [len(p) for p in pieces]
    assert te.batch_transfer_sync_write(peer.name, [local + o for o in offs], remote, lens) == 0
    assert peer.read(6 * MiB + 9000, lens[0]) == pieces[0]
    assert te.write_bytes_to_buffer(local, bytes(16384), 16384) == 0
    assert te.batch_transfer_sync_read(peer.name, [local + o for o in offs], remote, lens) == 0
    assert all(te.read_bytes_from_buffer(local + o, len(p)) == p for p, o in zip(pieces, offs))
    assert te.batch_transfer_sync(peer.name, [local], [peer.addr + 7 * MiB], [16384], TransferOpcode.Write) == 0
    assert peer.read(7 * MiB, 16384) == te.read_bytes_from_buffer(local, 16384)
    # A numpy array as the local buffer (Crescent's buffer-object form).
    arr = np.zeros(MiB, dtype=np.uint8)
    assert te.register_memory(arr, MiB) == 0
    assert te.transfer_sync_read(peer.name, arr, peer.addr, MiB) == 0
    assert arr.tobytes() == peer.read(0, MiB)
    assert te.unregister_memory(arr) == 0
    assert te.free_managed_buffer(local, 4 * MiB) == 0


def test_async_batches_and_submit_check(pair):
    te, peer = pair
    local = te.allocate_managed_buffer(8 * MiB)
    data = rand(8 * MiB, 2)
    assert te.write_bytes_to_buffer(local, data, len(data)) == 0
    # Four batches in flight at once, each of four 512 KiB writes.
    ids = []
    for b in range(4):
        offs = [(b * 4 + i) * 512 * 1024 for i in range(4)]
        bid = te.batch_transfer_async_write(peer.name, [local + o for o in offs], [peer.addr + o for o in offs],
                                            [512 * 1024] * 4)
        assert bid != 0, crescent.last_error()
        ids.append(bid)
    assert len(set(ids)) == 4
    assert te.get_batch_transfer_status(ids) == 0
    assert peer.read(8 * MiB - 64, 64) == data[-64:]
    assert te.get_batch_transfer_status(ids) == -1, "freed once complete"
    assert "unknown batch" in crescent.last_error()
    # Read back asynchronously (both spellings) into a zeroed buffer.
    assert te.write_bytes_to_buffer(local, bytes(8 * MiB), 8 * MiB) == 0
    a = te.batch_transfer_async_read(peer.name, [local], [peer.addr], [4 * MiB])
    b = te.batch_transfer_async(peer.name, [local + 4 * MiB], [peer.addr + 4 * MiB], [4 * MiB], TransferOpcode.Read)
    assert a and b and te.get_batch_transfer_status([a, b]) == 0
    assert te.read_bytes_from_buffer(local, 8 * MiB) == data
    # Submit, then poll.
    assert te.write_bytes_to_buffer(local, b"polled", 6) == 0
    bid = te.transfer_submit_write(peer.name, local, peer.addr + 3, 6)
    assert bid != 0
    end, status = time.time() + 30, 0
    while status == 0 and time.time() < end:
        status = te.transfer_check_status(bid)
    assert status == 1 and peer.read(3, 6) == b"polled"
    assert te.transfer_check_status(bid) == -1, "freed once ended"
    # A failed async transfer: submitted (an id), then -1 from the status.
    bid = te.batch_transfer_async_read(peer.name, [local], [peer.addr + peer.len - 10], [100])
    assert bid != 0 and te.get_batch_transfer_status([bid]) == -1
    assert "outside the registered memory" in crescent.last_error()
    bid = te.transfer_submit_write(peer.name, local, peer.addr + peer.len - 1, 2)
    end, status = time.time() + 30, 0
    while status == 0 and time.time() < end:
        status = te.transfer_check_status(bid)
    assert status == -1
    assert te.free_managed_buffer(local, 8 * MiB) == 0


def test_notifications_arrive_once_after_the_data(pair):
    te, peer = pair
    local = te.allocate_managed_buffer(MiB)
    assert peer.notifies() == []
    assert te.write_bytes_to_buffer(local, b"payload-1", 9) == 0
    assert te.transfer_sync(peer.name, local, peer.addr + 100, 9, TransferOpcode.Write,
                            TransferNotify("agent-a", "kv 1 ready")) == 0
    got = peer.notifies(want=1)
    assert got == [("agent-a", "kv 1 ready")], "delivered exactly once"
    assert peer.read(100, 9) == b"payload-1", "the data was there before the notification"
    assert te.batch_transfer_sync(peer.name, [local, local + 4], [peer.addr, peer.addr + 10], [4, 4],
                                  TransferOpcode.Write, notify=TransferNotify("agent-a", "kv 2 ready")) == 0
    assert te.transfer_sync(peer.name, local, peer.addr, 16, TransferOpcode.Read, TransferNotify("b", "read")) == 0
    assert peer.notifies(want=2) == [("agent-a", "kv 2 ready"), ("b", "read")]
    # A failed transfer sends none.
    assert te.transfer_sync(peer.name, local, peer.addr + peer.len - 1, 2, TransferOpcode.Write,
                            TransferNotify("agent-a", "never")) == -1
    assert peer.notifies() == []
    # Too large a notification (name and message over 4092 bytes): refused, nothing moved.
    assert te.transfer_sync(peer.name, local, peer.addr, 4, TransferOpcode.Write,
                            TransferNotify("a", "x" * 4092)) == -1
    assert "larger than the 4092-byte limit" in crescent.last_error()
    assert te.get_notifies() == []
    assert te.free_managed_buffer(local, MiB) == 0


def test_the_receivers_queue_is_bounded(pair):
    te, peer = pair
    if peer.proc.args[2] != "tcp":
        pytest.skip("the queue does not depend on the data path: tested once, over tcp")
    local = te.allocate_managed_buffer(4096)
    # 4096 notifications are held until taken; the 4097th is refused by the peer (the
    # transfer itself completes) and the queue takes more once drained.
    for i in range(4096 + 3):
        assert te.transfer_sync(peer.name, local, peer.addr, 8, TransferOpcode.Write, TransferNotify("n", str(i))) == 0
    assert "notification was not delivered" in crescent.last_error() and "full" in crescent.last_error()
    got = peer.notifies(want=4096)
    assert len(got) == 4096 and got[0] == ("n", "0") and got[-1] == ("n", "4095")
    assert te.transfer_sync(peer.name, local, peer.addr, 8, TransferOpcode.Write, TransferNotify("n", "again")) == 0
    assert peer.notifies(want=1) == [("n", "again")]
    assert te.free_managed_buffer(local, 4096) == 0


def test_bad_input_gets_mooncakes_codes_and_a_message(pair):
    te, peer = pair
    local = te.allocate_managed_buffer(MiB)
    # Unknown segment: -1 from sync calls, 0 as a batch id, 0 as an address, nonzero probe.
    assert te.transfer_sync_write(UNKNOWN, local, 0, 16) == -1
    assert UNKNOWN in crescent.last_error()
    assert te.batch_transfer_async_write(UNKNOWN, [local], [0], [16]) == 0
    assert te.transfer_submit_write(UNKNOWN, local, 0, 16) == 0
    assert te.get_first_buffer_address(UNKNOWN) == 0
    assert te.send_probe(UNKNOWN) < 0
    assert te.send_probe("no port") == -1
    # Unregistered local memory.
    other = np.zeros(64, dtype=np.uint8)
    assert te.transfer_sync_read(peer.name, other.ctypes.data, peer.addr, 64) == -1
    assert "not registered memory" in crescent.last_error()
    assert te.write_bytes_to_buffer(other.ctypes.data, b"abc", 3) == -1
    assert te.read_bytes_from_buffer(other.ctypes.data, 3) == b""
    # Out of the target's registered memory.
    assert te.transfer_sync_read(peer.name, local, peer.addr + peer.len - 1, 2) == -1
    assert "outside the registered memory" in crescent.last_error()
    # Lists of different lengths.
    assert te.batch_transfer_sync_write(peer.name, [local], [peer.addr, peer.addr], [1, 1]) == -1
    assert "different sizes" in crescent.last_error()
    assert te.batch_transfer_async_read(peer.name, [local], [peer.addr], [1, 2]) == 0
    # Registration: overlap -7, nothing there -3, zero length -1; batches all or nothing.
    x = np.zeros(8192, dtype=np.uint8)
    assert te.register_memory(x.ctypes.data, 8192) == 0
    assert te.register_memory(x.ctypes.data + 4096, 100) == -7
    assert te.batch_register_memory([x.ctypes.data + 100, other.ctypes.data], [10, 64]) == -7
    assert te.register_memory(other.ctypes.data, 64) == 0, "rolled back, so free to register"
    assert te.batch_unregister_memory([x.ctypes.data, other.ctypes.data]) == 0
    assert te.unregister_memory(x.ctypes.data) == -3
    assert te.batch_unregister_memory([x.ctypes.data]) == -3
    assert te.register_memory(x.ctypes.data, 0) == -1
    assert te.batch_register_memory([x.ctypes.data, x.ctypes.data + 4096], [4096, 4096], "cpu:0") == 0
    assert te.batch_unregister_memory([x.ctypes.data, x.ctypes.data + 4096]) == 0
    # Batches that do not exist; managed buffers that are not.
    assert te.get_batch_transfer_status([123456789]) == -1
    assert te.transfer_check_status(123456789) == -1
    assert te.free_managed_buffer(local + 8, 16) == -1
    # Wrong Python arguments raise.
    with pytest.raises(ValueError, match="transport_hint"):
        te.transfer_sync_write(peer.name, local, peer.addr, 1, transport_hint="pigeon")
    with pytest.raises(TypeError):
        te.transfer_sync(peer.name, local, peer.addr, 1, "read")
    with pytest.raises(TypeError):
        te.register_memory("not memory", 10)
    with pytest.raises(ValueError):
        te.write_bytes_to_buffer(local, b"abc", 4)
    assert te.free_managed_buffer(local, MiB) == 0


def test_before_and_at_initialize():
    e = TransferEngine()
    assert e.get_rpc_port() == -1 and "initialize" in crescent.last_error()
    assert e.allocate_managed_buffer(10) == 0
    assert e.transfer_sync_write("127.0.0.1:1", 16, 0, 1) == -1
    assert e.send_probe("127.0.0.1:1") == -1
    assert e.get_notifies() == [] and e.get_engine() is None
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "carrier-pigeon", "") == -1
    assert "carrier-pigeon" in crescent.last_error()
    assert e.initialize_ext("127.0.0.1", "nowhere", "tcp", "", "carrier") == -1
    # Upstream's P2P handshake picks a free port whatever local_hostname says.
    assert e.initialize("127.0.0.1:1", "P2PHANDSHAKE", "tcp", "") == 0
    assert e.get_rpc_port() not in (0, 1)
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == -1, "once"
    f = TransferEngine()
    assert f.initialize_ext("127.0.0.1", "P2PHANDSHAKE", "tcp", "", "etcd") == 0


def test_stubs_cover_the_engine_classes():
    import ast

    stub = pathlib.Path(crescent.__file__).with_name("_crescent.pyi")
    tree = ast.parse(stub.read_text())
    classes = {}
    for n in tree.body:
        if isinstance(n, ast.ClassDef):
            names = {f.name for f in n.body if isinstance(f, ast.FunctionDef)}
            names |= {f.target.id for f in n.body if isinstance(f, ast.AnnAssign)}
            classes[n.name] = names
    for cls in (TransferEngine, TransferNotify, TransferOpcode, mooncake_engine.InnerTransferEngine):
        public = {m for m in dir(cls) if not m.startswith("_")}
        assert public <= classes[cls.__name__], public - classes[cls.__name__]
