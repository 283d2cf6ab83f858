"""Replica tasks through the `mooncake` alias package, as a Mooncake scheduler calls them:
create_copy_task / create_move_task, polling query_task until SUCCESS or FAILED, bad input with
upstream's codes, batch_replica_clear, and the module-level TaskType / TaskStatus names."""

import time
import uuid

import pytest

import mooncake.store as ms
from mooncake.store import MooncakeDistributedStore, QueryTaskResponse, TaskStatus, TaskType

from conftest import connect, master_fixture

INVALID_PARAMS, OBJECT_NOT_FOUND, TASK_NOT_FOUND = -600, -704, -1400


master = master_fixture("--lease-ttl-ms", "300", "--allocation-strategy", "local-first")


@pytest.fixture(scope="module")
def stores(master):
    a, b = connect(master), connect(master)
    yield a, b
    a.close()
    b.close()


def key(tag: str) -> str:
    return f"{tag}/{uuid.uuid4().hex}"


def ended(store, task_id, timeout=30.0) -> QueryTaskResponse:
    end = time.monotonic() + timeout
    while True:
        resp, rc = store.query_task(task_id)
        assert rc == 0, rc
        if resp.status in (TaskStatus.SUCCESS, TaskStatus.FAILED) or time.monotonic() > end:
            return resp
        time.sleep(0.05)


def holders(store, k) -> list[str]:
    return sorted(r.get_memory_descriptor().buffer_descriptor.transport_endpoint for r in store.get_replica_desc(k))


def test_enums_and_response_match_mooncake():
    assert [int(v) for v in (TaskStatus.PENDING, TaskStatus.PROCESSING, TaskStatus.FAILED, TaskStatus.SUCCESS)] == [0, 1, 2, 3]
    assert [int(v) for v in (TaskType.REPLICA_COPY, TaskType.REPLICA_MOVE)] == [0, 1]
    # pybind's export_values, TaskStatus last, as upstream's module leaves them.
    assert ms.PENDING == TaskStatus.PENDING and ms.PROCESSING == TaskStatus.PROCESSING
    assert ms.SUCCESS == TaskStatus.SUCCESS and ms.REPLICA_MOVE == TaskType.REPLICA_MOVE
    r = QueryTaskResponse()
    assert (r.id, r.type, r.status, r.created_at_ms_epoch, r.message) == ((0, 0), TaskType.REPLICA_COPY, TaskStatus.PENDING, 0, "")
    assert repr(r).startswith("QueryTaskResponse(id=0-0")


def test_copy_then_move_between_clients(stores):
    a, b = stores
    k, value = key("copy"), b"x" * 100_000
    assert a.put(k, value) == 0
    (sa, sb) = (a.get_hostname(), b.get_hostname())
    task_id, rc = b.create_copy_task(k, [sb])
    assert rc == 0 and isinstance(task_id, tuple) and len(task_id) == 2
    resp = ended(b, task_id)
    assert resp.status == TaskStatus.SUCCESS, resp
    assert resp.type == TaskType.REPLICA_COPY and resp.id == task_id
    assert holders(b, k) == sorted([sa, sb])
    k2 = key("move")
    assert a.put(k2, value) == 0
    task_id, rc = a.create_move_task(k2, sa, sb)
    assert rc == 0
    resp = ended(a, task_id)
    assert resp.status == TaskStatus.SUCCESS and resp.type == TaskType.REPLICA_MOVE, resp
    assert holders(a, k2) == [sb]
    assert a.get(k2) == value


def test_bad_input_gets_upstreams_codes(stores):
    a, b = stores
    k = key("bad")
    assert a.put(k, b"v" * 1000) == 0
    (sa, sb) = (a.get_hostname(), b.get_hostname())
    assert a.create_copy_task(k, []) == ((0, 0), INVALID_PARAMS)
    assert a.create_copy_task(k, ["10.0.0.1:1"]) == ((0, 0), INVALID_PARAMS)
    assert a.create_copy_task(key("missing"), [sb]) == ((0, 0), OBJECT_NOT_FOUND)
    assert a.create_move_task(k, sa, sa) == ((0, 0), INVALID_PARAMS)
    assert a.create_move_task(k, sb, sa) == ((0, 0), INVALID_PARAMS)
    assert a.create_move_task(key("missing"), sa, sb) == ((0, 0), OBJECT_NOT_FOUND)
    assert a.query_task((1, 2)) == (None, TASK_NOT_FOUND)
    with pytest.raises(TypeError):
        a.query_task("not an id")
    unset = MooncakeDistributedStore()
    assert unset.create_copy_task(k, [sb]) == ((0, 0), INVALID_PARAMS)
    assert unset.query_task((1, 2)) == (None, INVALID_PARAMS)
    assert unset.batch_replica_clear([k]) == []


def test_batch_replica_clear_takes_the_callers_objects(stores):
    a, b = stores
    mine, theirs = key("clear"), key("clear")
    assert a.put(mine, b"m" * 1000) == 0
    assert b.put(theirs, b"t" * 1000) == 0
    time.sleep(0.4)  # past any read lease
    assert a.batch_replica_clear([mine, theirs, key("missing")], b.get_hostname()) == []
    assert a.batch_replica_clear([mine, theirs, key("missing")]) == [mine]
    assert a.is_exist(mine) == 0 and b.is_exist(theirs) == 1
