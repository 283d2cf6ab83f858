"""RpcInterface (mooncake.engine's message interface): bytes and tensors between two interfaces,
the callbacks' shapes, the async forms, and what a bad peer, a missing server or a missing
cluster secret do."""

import asyncio
import socket
import struct
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import crescent
from crescent.engine import (
    CoroRPCInterface,
    ReceivedTensor,
    RpcInterface,
    create_rpc_client,
    create_rpc_server,
)

MiB = 1 << 20
SECRET = "0123456789abcdef0123456789abcdef"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """An interface serving on a free loopback port, recording what its callbacks got."""

    def __init__(self, timeout_seconds: int = 30):
        self.address = f"127.0.0.1:{free_port()}"
        self.rpc = RpcInterface()
        assert self.rpc.initialize_server(self.address, timeout_seconds=timeout_seconds)
        self.data = []
        self.tensors = []
        self.rpc.set_data_receive_callback(self.data.append)
        self.rpc.set_tensor_receive_callback(self.tensors.append)
        assert self.rpc.start_server_async(), crescent.last_error()

    def stop(self):
        self.rpc.stop_server()


@pytest.fixture
def server():
    s = Server()
    yield s
    s.stop()


@pytest.fixture
def client():
    c = RpcInterface()
    assert c.initialize_client(timeout_seconds=5)
    return c


def test_names_and_factories():
    assert CoroRPCInterface is RpcInterface
    assert isinstance(create_rpc_client(), RpcInterface)
    assert isinstance(create_rpc_server(local_rank=0, world_size=1), RpcInterface)


@pytest.mark.parametrize("size", [5, 3 * MiB + 7])
def test_data_reaches_the_data_callback_as_upstreams_dict(server, client, size):
    payload = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    assert client.send_data(server.address, payload) == 0, crescent.last_error()
    # The send returns once the callback has.
    assert len(server.data) == 1
    got = server.data[0]
    assert set(got) == {"source", "data"}
    assert got["data"] == payload
    assert got["source"].startswith("127.0.0.1:")
    assert server.tensors == []


def test_any_buffer_is_sent(server, client):
    assert client.send_data(server.address, bytearray(b"abc")) == 0
    assert client.send_data(server.address, memoryview(b"xyzw")[1:3]) == 0
    assert [d["data"] for d in server.data] == [b"abc", b"yz"]


@pytest.mark.parametrize("dtype,shape", [("float32", (3, 4)), ("int64", (5,)), ("uint8", (2, 1, 3)), ("bool", (0,))])
def test_numpy_tensors_arrive_with_dtype_and_shape(server, client, dtype, shape):
    a = (np.arange(int(np.prod(shape))) % 2).astype(dtype).reshape(shape)
    assert client.send_tensor(server.address, a) == 0, crescent.last_error()
    assert server.data == []
    (t,) = server.tensors
    assert isinstance(t, ReceivedTensor)
    assert (t.dtype, list(t.shape), t.total_bytes, t.get_data_size()) == (dtype, list(shape), a.nbytes, a.nbytes)
    assert t.source_address.startswith("127.0.0.1:")
    rebuilt = np.frombuffer(t.get_data_as_bytes(), dtype=t.dtype).reshape(t.shape)
    assert np.array_equal(rebuilt, a)
    assert bytes(t.get_memory_view()) == a.tobytes()


def test_torch_tensors_arrive_with_dtype_and_shape(server, client):
    torch = pytest.importorskip("torch")
    t = torch.arange(12, dtype=torch.float16).reshape(3, 4)
    assert client.send_tensor(server.address, t) == 0, crescent.last_error()
    (got,) = server.tensors
    assert (got.dtype, list(got.shape)) == ("float16", [3, 4])
    rebuilt = torch.frombuffer(bytearray(got.get_data_as_bytes()), dtype=getattr(torch, got.dtype)).reshape(got.shape)
    assert torch.equal(rebuilt, t)
    assert client.send_tensor(server.address, t.t()) == -1  # not contiguous


def test_what_is_not_a_tensor_is_refused(server, client):
    assert client.send_tensor(server.address, b"not a tensor") == -1
    assert client.send_tensor(server.address, np.arange(12.0).reshape(3, 4)[:, ::2]) == -1  # not contiguous
    assert server.tensors == [] and server.data == []


def test_async_sends_resolve_their_futures(server, client):
    async def main():
        loop = asyncio.get_running_loop()
        sent = await client.send_data_async(server.address, b"async bytes", loop)
        tensor = await client.send_tensor_async(server.address, np.ones((2, 2), dtype=np.float64), loop)
        with pytest.raises(RuntimeError):
            await client.send_data_async(f"127.0.0.1:{free_port()}", b"x", loop)
        with pytest.raises(RuntimeError):
            await client.send_tensor_async(server.address, b"not a tensor", loop)
        return sent, tensor

    assert asyncio.run(main()) == (0, 0)
    assert [d["data"] for d in server.data] == [b"async bytes"]
    assert [t.shape for t in server.tensors] == [[2, 2]]


def test_calls_before_initialize_fail_as_upstream():
    rpc = RpcInterface()
    assert rpc.send_data("127.0.0.1:1", b"x") == -1
    assert rpc.send_tensor("127.0.0.1:1", np.zeros(2)) == -1
    assert rpc.start_server_async() is False

    async def main():
        with pytest.raises(RuntimeError, match="not initialized"):
            await rpc.send_data_async("127.0.0.1:1", b"x", asyncio.get_running_loop())

    asyncio.run(main())
    client_only = RpcInterface()
    assert client_only.initialize_client()
    assert client_only.start_server_async() is False  # no listen address


def test_nothing_listening_returns_minus_one(client):
    target = f"127.0.0.1:{free_port()}"
    assert client.send_data(target, b"x") == -1
    assert target in crescent.last_error()
    assert client.send_tensor(target, np.zeros(3)) == -1


def test_a_raising_callback_is_logged_and_the_server_goes_on(server, client):
    calls = []

    def bad(received):
        calls.append(received)
        raise ValueError("callback bug")

    server.rpc.set_data_receive_callback(bad)
    assert client.send_data(server.address, b"one") == 0
    assert client.send_data(server.address, b"two") == 0
    assert [c["data"] for c in calls] == [b"one", b"two"]


def test_garbage_and_oversized_frames_are_dropped_and_the_server_goes_on(server, client):
    host, port = server.address.split(":")
    with socket.create_connection((host, int(port))) as garbage:
        garbage.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 10)
        garbage.settimeout(10)
        try:
            assert garbage.recv(100) == b""  # closed without an answer
        except ConnectionResetError:
            pass  # closed with the rest of the garbage unread
    with socket.create_connection((host, int(port))) as oversized:
        # Crescent's rpc header announcing a 4 GiB - 1 payload: refused before any allocation.
        oversized.sendall(b"CRPC" + bytes([1, 1, 0, 0]) + struct.pack("<II", 0, 0xFFFFFFFF))
        oversized.settimeout(10)
        answer = b""
        while chunk := oversized.recv(4096):
            answer += chunk
        assert answer[:6] == b"CRPC\x01\x04"  # an error frame, then the close
    assert client.send_data(server.address, b"still serving") == 0
    assert [d["data"] for d in server.data] == [b"still serving"]


def test_with_a_cluster_secret_a_peer_without_it_is_refused(monkeypatch):
    monkeypatch.setenv("CRESCENT_CLUSTER_SECRET", SECRET)
    server = Server()
    member = RpcInterface()
    assert member.initialize_client(timeout_seconds=5)
    monkeypatch.delenv("CRESCENT_CLUSTER_SECRET")
    outsider = RpcInterface()
    assert outsider.initialize_client(timeout_seconds=5)
    try:
        assert outsider.send_data(server.address, b"intruder") == -1
        assert outsider.send_tensor(server.address, np.zeros(4)) == -1
        assert member.send_data(server.address, b"member") == 0, crescent.last_error()
        assert [d["data"] for d in server.data] == [b"member"]
        assert server.tensors == []
    finally:
        server.stop()


def test_stop_server_stops_and_it_starts_again(client):
    server = Server()
    assert client.send_data(server.address, b"before") == 0
    server.stop()
    assert client.send_data(server.address, b"while stopped") == -1
    assert server.rpc.start_server_async()
    try:
        assert client.send_data(server.address, b"after") == 0
        assert [d["data"] for d in server.data] == [b"before", b"after"]
    finally:
        server.stop()


PEER = textwrap.dedent(
    """
    import sys, threading
    from crescent.engine import RpcInterface

    rpc = RpcInterface()
    assert rpc.initialize_server(sys.argv[1], thread_count=2)
    rpc.set_data_receive_callback(lambda d: print(len(d["data"]), d["data"][:4].hex(), flush=True))

    def stop_on_request():
        sys.stdin.readline()
        rpc.stop_server()

    threading.Thread(target=stop_on_request).start()
    print("started", rpc.start_server(), flush=True)
    """
)


def test_a_server_in_another_process_blocks_in_start_server_until_stopped(client):
    address = f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen(
        [sys.executable, "-c", PEER, address], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        big = bytes(range(256)) * (8 * 1024)  # 2 MiB
        for _ in range(100):
            if client.send_data(address, big) == 0:
                break
            threading.Event().wait(0.1)  # the peer is still starting
        else:
            pytest.fail(f"the peer never served: {crescent.last_error()}")
        assert client.send_data(address, b"more") == 0
        assert proc.poll() is None  # start_server still blocks
        out, _ = proc.communicate("stop\n", timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert out.splitlines() == [f"{len(big)} 00010203", "4 6d6f7265", "started True"]
    assert proc.returncode == 0
    assert client.send_data(address, b"gone") == -1


def test_mooncake_alias_offers_the_same_names():
    mooncake_engine = pytest.importorskip("mooncake.engine")
    for name in ["RpcInterface", "CoroRPCInterface", "ReceivedData", "ReceivedTensor", "create_rpc_client",
                 "create_rpc_server", "SharedSegment"]:
        assert getattr(mooncake_engine, name) is getattr(crescent.engine, name)

