"""What Mooncake's own transfer-engine tests (mooncake-wheel/tests/transfer_engine_initiator_test.py
against transfer_engine_target.py, upstream 3b5a5941) check, written here against Crescent:
an initiator that names itself host:port with P2P handshake (and learns its real port from
get_rpc_port), a fallback managed buffer when its own segment has none, a target process with
a 64 MiB managed buffer, then

* many rounds of random strings written to the target and read back;
* batches of 100 strings 1 KiB apart, written and read back with the sync batch calls;
* the same with the async batch calls and get_batch_transfer_status;
* async submits to an unknown peer returning the failure sentinel 0 (not 2**64-1);
* send_probe 0 for the target and non-zero for an unknown peer.
"""

import os
import random
import string

import pytest

from crescent.engine import TransferEngine

from test_engine import Peer

CAPACITY = 64 * 1024 * 1024
CIRCLES = int(os.environ.get("CIRCLE", "200"))


def random_text(n: int) -> bytes:
    return "".join(random.choices(string.ascii_letters + string.digits + string.punctuation, k=n)).encode()


@pytest.fixture(scope="module")
def initiator():
    target = Peer(os.environ.get("PROTOCOL", "tcp"), CAPACITY)
    te = TransferEngine()
    assert te.initialize("127.0.0.1:12347", "P2PHANDSHAKE", os.environ.get("PROTOCOL", "tcp"), "") == 0
    own = "127.0.0.1:" + str(te.get_rpc_port())
    # Nothing registered yet: the initiator's own segment has no buffer, so it allocates one.
    src = te.get_first_buffer_address(own)
    fallback = None
    if src == 0:
        fallback = src = te.allocate_managed_buffer(CAPACITY)
    assert src != 0
    dst = te.get_first_buffer_address(target.name)
    assert dst != 0, "the target has a registered buffer"
    yield te, target, src, dst
    if fallback is not None:
        assert te.free_managed_buffer(fallback, CAPACITY) == 0
    target.stop()


def test_random_write_read_rounds(initiator):
    te, target, src, dst = initiator
    for i in range(CIRCLES):
        data = random_text(random.randint(16, 256))
        assert te.write_bytes_to_buffer(src, data, len(data)) == 0, i
        assert te.transfer_sync_write(target.name, src, dst, len(data)) == 0, i
        assert te.write_bytes_to_buffer(src, bytes(len(data)), len(data)) == 0, i
        assert te.transfer_sync_read(target.name, src, dst, len(data)) == 0, i
        assert te.read_bytes_from_buffer(src, len(data)) == data, i


def batch_rounds(te, target, src, dst, write, read):
    srcs = [src + i * 1024 for i in range(100)]
    dsts = [dst + i * 1024 for i in range(100)]
    for i in range(max(2, CIRCLES // 100)):
        data = [random_text(random.randint(32, 128)) for _ in range(100)]
        lens = [len(d) for d in data]
        for a, d in zip(srcs, data):
            assert te.write_bytes_to_buffer(a, d, len(d)) == 0
        write(target.name, srcs, dsts, lens)
        for a, n in zip(srcs, lens):
            assert te.write_bytes_to_buffer(a, bytes(n), n) == 0
        read(target.name, srcs, dsts, lens)
        for j, (a, d) in enumerate(zip(srcs, data)):
            assert te.read_bytes_from_buffer(a, len(d)) == d, (i, j)


def test_batch_write_read(initiator):
    te = initiator[0]

    def write(*args):
        assert te.batch_transfer_sync_write(*args) == 0

    def read(*args):
        assert te.batch_transfer_sync_read(*args) == 0

    batch_rounds(*initiator, write, read)


def test_async_batch_write_read(initiator):
    te = initiator[0]

    def write(*args):
        batch_id = te.batch_transfer_async_write(*args)
        assert batch_id != 0
        assert te.get_batch_transfer_status([batch_id]) == 0

    def read(*args):
        batch_id = te.batch_transfer_async_read(*args)
        assert batch_id != 0
        assert te.get_batch_transfer_status([batch_id]) == 0

    batch_rounds(*initiator, write, read)


def test_async_submit_to_unknown_peer_returns_zero(initiator):
    te = initiator[0]
    assert te.batch_transfer_async_write("unreachable_peer:9", [0], [0], [16]) == 0
    assert te.transfer_submit_write("unreachable_peer:9", 0, 0, 16) == 0


def test_send_probe(initiator):
    te, target = initiator[0], initiator[1]
    assert te.send_probe(target.name) == 0
    assert te.send_probe("unreachable_peer:9") != 0
