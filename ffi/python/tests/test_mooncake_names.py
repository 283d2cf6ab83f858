"""Every name upstream's ``mooncake.store`` and ``mooncake.engine`` have — module level, on
``MooncakeDistributedStore`` and on ``TransferEngine`` — exists under Crescent's ``mooncake``
alias. The names are those of upstream's wheel, kept in ``data/mooncake_names.json``; to take
them again from a newer wheel (in a venv of its own, never beside the alias):

    python -c 'import json, mooncake.store as s, mooncake.engine as e; pub = lambda o: sorted(
        n for n in dir(o) if not n.startswith("__") and n != "_pybind11_conduit_v1_"); print(json.dumps({
        "mooncake.store": pub(s), "mooncake.store.MooncakeDistributedStore": pub(s.MooncakeDistributedStore),
        "mooncake.engine": pub(e), "mooncake.engine.TransferEngine": pub(e.TransferEngine)}, indent=1))'
"""

import json
import pathlib

import pytest

import mooncake.engine
import mooncake.store

UPSTREAM = json.loads((pathlib.Path(__file__).parent / "data" / "mooncake_names.json").read_text())

OBJECTS = {
    "mooncake.store": mooncake.store,
    "mooncake.store.MooncakeDistributedStore": mooncake.store.MooncakeDistributedStore,
    "mooncake.engine": mooncake.engine,
    "mooncake.engine.TransferEngine": mooncake.engine.TransferEngine,
}


@pytest.mark.parametrize("where", sorted(OBJECTS))
def test_every_upstream_name_exists(where):
    assert UPSTREAM[where], f"the snapshot lists no names for {where}"
    missing = [name for name in UPSTREAM[where] if not hasattr(OBJECTS[where], name)]
    assert not missing, f"{where} lacks upstream's {missing}"


def test_the_buffer_pool_module_and_package_names():
    import mooncake
    import mooncake.buffer_pool

    assert mooncake.BufferPool is mooncake.buffer_pool.BufferPool is mooncake.store.BufferPool
    assert mooncake.RegisteredBufferPool is mooncake.BufferPool
