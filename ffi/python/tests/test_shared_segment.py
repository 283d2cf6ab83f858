"""SharedSegment (mooncake.engine): the owner's pages mapped by a rank in another process, the
checks of complete(), supported()'s answers, and the memory registered with an engine."""

import ctypes
import subprocess
import sys
import textwrap

import pytest

import crescent
from crescent.engine import SharedSegment, TransferEngine
from conftest import connect

SIZE = 3 * 4096 + 100


def test_supported_says_what_this_build_shares():
    assert SharedSegment.supported() is True
    assert SharedSegment.supported(mmap=True, host_register=False) is True
    assert SharedSegment.supported(mmap=False) is False  # no VMM / fabric backend
    assert SharedSegment.supported(mmap=True, host_register=True) is False  # no Ascend
    assert SharedSegment.supported(False, True) is False


@pytest.mark.parametrize(
    "kwargs,kind",
    [
        (dict(mmap=False), "NotImplemented"),
        (dict(host_register=True), "NotImplemented"),
        (dict(world_size=0), "InvalidArgument"),
        (dict(rank_id=2), "InvalidArgument"),
        (dict(owner_rank=5), "InvalidArgument"),
        (dict(size=0), "InvalidArgument"),
        (dict(mmap=False, host_register=True), "InvalidArgument"),
    ],
)
def test_create_raises_with_upstreams_status_kind(kwargs, kind):
    args = dict(name="seg", size=SIZE, world_size=2, rank_id=0)
    args.update(kwargs)
    with pytest.raises(RuntimeError, match=f"^{kind}: "):
        SharedSegment.create(**args)


def test_a_single_rank_segment_is_its_owners_memory():
    seg, blob = SharedSegment.create("one", SIZE, 1, 0)
    assert isinstance(blob, bytes) and len(blob) == 160
    assert (seg.ready(), seg.size(), seg.device_addr()) == (False, SIZE, 0)
    seg.complete([blob])
    assert seg.ready() and seg.base_addr() != 0
    ctypes.memmove(seg.base_addr() + SIZE - 5, b"hello", 5)
    assert ctypes.string_at(seg.base_addr() + SIZE - 5, 5) == b"hello"
    with pytest.raises(RuntimeError, match="^InvalidArgument: .*already"):
        seg.complete([blob])


def test_mismatched_blobs_raise_and_leave_the_segment_unready():
    owner, b0 = SharedSegment.create("kv", SIZE, 2, 0)
    peer, b1 = SharedSegment.create("kv", SIZE, 2, 1)
    other, b_other = SharedSegment.create("another", SIZE, 2, 1)
    bigger, b_bigger = SharedSegment.create("kv", 2 * SIZE, 2, 1)
    for blobs in [
        [b0, b_other],  # rank 1 declared another name
        [b0, b_bigger],  # and another size
        [b0],  # one blob short
        [b1, b1],  # rank 1's blob at rank 0's index
        [b0, b1[:-1]],  # truncated
        [b"x" * 160, b1],  # not a blob
    ]:
        with pytest.raises(RuntimeError, match="^InvalidArgument: "):
            peer.complete(blobs)
    assert not peer.ready()
    peer.complete([b0, b1])
    assert peer.ready()
    del owner, other, bigger


PEER = textwrap.dedent(
    """
    import ctypes, sys
    from crescent.engine import SharedSegment

    seg, blob = SharedSegment.create("kv|layout", int(sys.argv[1]), 2, 1)
    print(blob.hex(), flush=True)
    owner_blob = bytes.fromhex(sys.stdin.readline().strip())
    seg.complete([owner_blob, blob])
    print(ctypes.string_at(seg.base_addr(), 5).decode(), flush=True)
    ctypes.memmove(seg.base_addr() + 4096, b"peer!", 5)
    print("written", flush=True)
    sys.stdin.readline()  # keeps the mapping until the owner has looked
    """
)


def test_owner_and_peer_in_two_processes_see_each_others_writes():
    owner, b0 = SharedSegment.create("kv|layout", SIZE, 2, 0)
    proc = subprocess.Popen(
        [sys.executable, "-c", PEER, str(SIZE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        b1 = bytes.fromhex(proc.stdout.readline().strip())
        owner.complete([b0, b1])
        ctypes.memmove(owner.base_addr(), b"owner", 5)
        proc.stdin.write(b0.hex() + "\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "owner"
        assert proc.stdout.readline().strip() == "written"
        assert ctypes.string_at(owner.base_addr() + 4096, 5) == b"peer!"
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_segment_registers_with_an_engine_and_serves_its_reads():
    seg, blob = SharedSegment.create("engine", SIZE, 1, 0)
    seg.complete([blob])
    ctypes.memmove(seg.base_addr(), b"shared bytes", 12)
    target = TransferEngine()
    assert target.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, crescent.last_error()
    assert target.register_memory(seg.base_addr(), seg.size()) == 0, crescent.last_error()
    reader = TransferEngine()
    assert reader.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    local = reader.allocate_managed_buffer(4096)
    assert local != 0
    name = target.get_segment_name()
    assert reader.transfer_sync_read(name, local, seg.base_addr(), 12) == 0, crescent.last_error()
    assert reader.read_bytes_from_buffer(local, 12) == b"shared bytes"
    assert target.unregister_memory(seg.base_addr()) == 0


def test_the_segment_registers_with_a_store(master):
    seg, blob = SharedSegment.create("store", SIZE, 1, 0)
    seg.complete([blob])
    store = connect(master)
    try:
        assert store.register_buffer(seg.base_addr(), seg.size()) == 0, crescent.last_error()
        ctypes.memmove(seg.base_addr(), b"from a shared segment", 21)
        assert store.put_from("shared-segment-key", seg.base_addr(), 21) == 0, crescent.last_error()
        assert store.get("shared-segment-key") == b"from a shared segment"
        assert store.unregister_buffer(seg.base_addr()) == 0
    finally:
        store.close()


def test_the_torch_helper_imports_without_torch():
    from crescent import shared_segment

    assert shared_segment.shared_segment_supported() is True
    assert shared_segment.shared_segment_supported(mmap=False) is False
    mooncake_shared_segment = pytest.importorskip("mooncake.shared_segment")
    assert mooncake_shared_segment.create_shared_segment is shared_segment.create_shared_segment
    try:
        import torch  # noqa: F401
    except ImportError:
        blocks = {"k": dict(count=2, shape=(4,), dtype="float32")}
        with pytest.raises(shared_segment.SharedSegmentError, match="needs torch"):
            shared_segment.create_shared_segment("kv", blocks, world_size=1, rank_id=0)


def test_the_torch_helper_lays_out_blocks_of_shared_tensors():
    torch = pytest.importorskip("torch")
    from crescent.shared_segment import SharedSegmentError, create_shared_segment

    blocks = {"v": dict(count=3, shape=(2, 5), dtype=torch.float16), "k": dict(count=3, shape=(7,), dtype=torch.int32)}
    seg = create_shared_segment("kv", blocks, world_size=1, rank_id=0)
    k, v = seg.tensors("k"), seg.tensors("v")
    assert [t.shape for t in k] == [torch.Size([7])] * 3 and [t.dtype for t in v] == [torch.float16] * 3
    k[1].fill_(42)
    assert ctypes.c_int32.from_address(k[1].data_ptr()).value == 42
    assert seg.tensors("k")[1].tolist() == [42] * 7
    assert seg.total_size() >= 3 * 2 * 4096
    with pytest.raises(SharedSegmentError):
        seg.tensors("q")
    with pytest.raises(SharedSegmentError):
        create_shared_segment("kv", blocks, world_size=1, rank_id=0, mmap=False)
