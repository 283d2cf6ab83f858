"""Fixtures: a real crescent-master process and store clients connected to it.

The binaries come from $CRESCENT_BIN_DIR, else $CARGO_TARGET_DIR/debug, else target/debug of
the repository (`cargo build --workspace` builds them).
"""

import os
import pathlib
import subprocess
import threading

import numpy as np
import pytest

import crescent

REPO = pathlib.Path(__file__).resolve().parents[3]
MiB = 1 << 20


def bin_dir() -> pathlib.Path:
    if os.environ.get("CRESCENT_BIN_DIR"):
        return pathlib.Path(os.environ["CRESCENT_BIN_DIR"])
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    return target / "debug"


class Process:
    """The binary `name` of `bin_dir()` with `args`, ready once it prints a line that starts
    with `ready` (the first such line is kept as `ready_line`; `not_ready` is the error when
    none comes within 60 s). Its output is read to the end; `stop` kills it."""

    def __init__(self, name: str, args: list, ready: str, not_ready: str):
        exe = bin_dir() / name
        if not exe.exists():
            raise RuntimeError(f"{exe} is not built: run `cargo build --workspace` first")
        self.proc = subprocess.Popen([str(exe), *args], stdout=subprocess.PIPE, text=True)
        self.ready_line = None
        found = threading.Event()

        def read():
            for line in self.proc.stdout:
                if line.startswith(ready) and self.ready_line is None:
                    self.ready_line = line
                    found.set()

        threading.Thread(target=read, daemon=True).start()
        if not found.wait(60):
            self.stop()
            raise RuntimeError(not_ready)

    def stop(self):
        self.proc.kill()
        self.proc.wait()


class Master(Process):
    """A crescent-master on a free loopback port, killed at teardown."""

    def __init__(self, *extra: str):
        super().__init__(
            "crescent-master",
            ["--rpc-address", "127.0.0.1:0", "--admin-address", "", *extra],
            "master: ",
            "crescent-master did not print its address",
        )
        self.addr = self.ready_line.split(" ", 1)[1].strip()


def master_fixture(*extra: str):
    """A module-scoped fixture: a `Master(*extra)`, stopped after the module's tests."""

    @pytest.fixture(scope="module")
    def master():
        m = Master(*extra)
        yield m
        m.stop()

    return master


def pattern(n: int, seed: int) -> np.ndarray:
    """`n` bytes of a pattern fixed by `seed`."""
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def registered(store, n: int, fill: int = 0) -> np.ndarray:
    """`n` bytes filled with `fill`, registered with `store`."""
    a = np.full(n, fill, dtype=np.uint8)
    assert store.register_buffer(a.ctypes.data, a.nbytes) == 0
    return a


def connect(master: Master, segment: int = 64 * MiB, buffer: int = 16 * MiB) -> crescent.MooncakeDistributedStore:
    s = crescent.MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", "P2PHANDSHAKE", segment, buffer, "tcp", "", master.addr)
    assert rc == 0, f"setup failed: {rc} {crescent.last_error()}"
    return s


# Read leases of 30 s: a read that takes long (the first contact, a debug build, 20 MiB)
# still ends within its lease, and a removal right after a get is refused (no test here
# needs a lease to lapse; the keys are unique and fit the segments without eviction);
# local-first placement so that a client's puts land in its own segment and the other
# client's gets cross the (loopback) network.
master = master_fixture("--lease-ttl-ms", "30000", "--allocation-strategy", "local-first")


@pytest.fixture(scope="module")
def store_a(master):
    s = connect(master)
    yield s
    s.close()


@pytest.fixture(scope="module")
def store_b(master):
    s = connect(master)
    yield s
    s.close()
