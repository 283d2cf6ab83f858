"""The CUDA driver API through ctypes: enough to make, fill and read device memory in tests,
and two tiny arrays over it that hand out their device pointer the ways torch and cupy do
(`__cuda_array_interface__`, DLPack) without either framework.

The driver is the fake one of the Rust tests (tests/fake-cuda, built by `cargo build` of
crescent-tests): there device memory is a PROT_NONE mapping, so any CPU touch of it kills the
process. The engine loads the library `CRESCENT_CUDA_DRIVER` names; ctypes loads the same file,
which the dynamic loader maps once, so both see the same allocations. A real libcuda works too.
"""

import ctypes
import glob
import os
import pathlib

import pytest

from conftest import bin_dir

ENV = "CRESCENT_FAKE_CUDA_DRIVER"


def fake_driver_path():
    """The fake driver: $CRESCENT_FAKE_CUDA_DRIVER, else the newest one in the cargo build tree
    of the binaries' directory; None when there is none."""
    named = os.environ.get(ENV)
    if named:
        path = pathlib.Path(named)
        if not path.exists():
            raise RuntimeError(f"{ENV}={named} does not exist")
        return path
    found = glob.glob(str(bin_dir() / "build" / "crescent-tests-*" / "out" / "libfake_cuda.so"))
    return pathlib.Path(max(found, key=os.path.getmtime)) if found else None


class CudaError(RuntimeError):
    pass


class Driver:
    """The driver library at `path`, with device 0's primary context current on this thread."""

    def __init__(self, path):
        self.lib = ctypes.CDLL(str(path))
        L = self.lib
        L.cuMemcpyAsync.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p]
        L.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
        L.cuMemFree_v2.argtypes = [ctypes.c_uint64]
        L.cuStreamSynchronize.argtypes = [ctypes.c_void_p]
        L.cuStreamCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
        self.check("cuInit", L.cuInit(0))
        dev = ctypes.c_int()
        self.check("cuDeviceGet", L.cuDeviceGet(ctypes.byref(dev), 0))
        ctx = ctypes.c_void_p()
        self.check("cuDevicePrimaryCtxRetain", L.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))
        self.check("cuCtxSetCurrent", L.cuCtxSetCurrent(ctx))
        self.stream = self.stream_create()

    @staticmethod
    def check(call, rc):
        if rc != 0:
            raise CudaError(f"{call} failed: CUDA error {rc}")

    def alloc(self, n: int) -> int:
        p = ctypes.c_uint64()
        self.check("cuMemAlloc", self.lib.cuMemAlloc_v2(ctypes.byref(p), n))
        return p.value

    def free(self, ptr: int) -> None:
        self.check("cuMemFree", self.lib.cuMemFree_v2(ptr))

    def stream_create(self) -> int:
        s = ctypes.c_void_p()
        self.check("cuStreamCreate", self.lib.cuStreamCreate(ctypes.byref(s), 1))
        return s.value

    def synchronize(self, stream: int) -> None:
        self.check("cuStreamSynchronize", self.lib.cuStreamSynchronize(stream))

    def htod(self, dst: int, data: bytes) -> None:
        buf = ctypes.create_string_buffer(bytes(data), len(data))
        self.check("cuMemcpyAsync", self.lib.cuMemcpyAsync(dst, ctypes.addressof(buf), len(data), self.stream))
        self.synchronize(self.stream)

    def dtoh(self, src: int, n: int) -> bytes:
        buf = ctypes.create_string_buffer(n)
        self.check("cuMemcpyAsync", self.lib.cuMemcpyAsync(ctypes.addressof(buf), src, n, self.stream))
        self.synchronize(self.stream)
        return buf.raw


class CudaArray:
    """`nbytes` of device memory offered as torch and cupy offer theirs: through
    `__cuda_array_interface__` (version 3), as a (rows, nbytes // rows) array of bytes."""

    def __init__(self, driver: Driver, nbytes: int, rows: int = 1, readonly: bool = False):
        self.driver, self.nbytes, self.rows, self.readonly = driver, nbytes, rows, readonly
        self.ptr = driver.alloc(nbytes)
        self.strides = None

    @property
    def __cuda_array_interface__(self):
        return {
            "shape": (self.rows, self.nbytes // self.rows),
            "typestr": "|u1",
            "data": (self.ptr, self.readonly),
            "strides": self.strides,
            "version": 3,
        }

    def write(self, data: bytes, off: int = 0) -> None:
        self.driver.htod(self.ptr + off, data)

    def read(self, off: int = 0, n=None) -> bytes:
        return self.driver.dtoh(self.ptr + off, self.nbytes - off if n is None else n)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
    ]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class DLPackArray:
    """`nbytes` of device memory (or `ptr`'s) offered only through DLPack (`__dlpack__` /
    `__dlpack_device__`, a legacy 'dltensor' capsule), as float32 items in one dimension; the
    capsule's tensor lives as long as this object."""

    def __init__(self, driver: Driver, nbytes: int, device_type: int = 2, ptr=None, byte_offset: int = 0):
        self.driver, self.nbytes, self.device_type = driver, nbytes, device_type
        self.ptr = driver.alloc(nbytes) if ptr is None else ptr
        self._shape = (ctypes.c_int64 * 1)((nbytes - byte_offset) // 4)
        self._tensor = _DLManagedTensor(
            data=self.ptr,
            device=_DLDevice(device_type, 0),
            ndim=1,
            dtype=_DLDataType(2, 32, 1),
            shape=self._shape,
            strides=None,
            byte_offset=byte_offset,
        )

    def __dlpack_device__(self):
        return (self.device_type, 0)

    def __dlpack__(self, stream=None):
        return _capsule_new(ctypes.addressof(self._tensor), b"dltensor", None)


@pytest.fixture(scope="module")
def driver():
    """The fake driver, named by CRESCENT_CUDA_DRIVER for the module's engines and clients (loaded
    by each one's first device registration) and their peers. A module imports it to use it."""
    path = fake_driver_path()
    if path is None:
        if os.environ.get("CRESCENT_NO_SKIP") == "1":
            pytest.fail("the fake CUDA driver is not built (cargo build -p crescent-tests builds it)")
        pytest.skip("the fake CUDA driver is not built (cargo build -p crescent-tests builds it)")
    before = os.environ.get("CRESCENT_CUDA_DRIVER")
    os.environ["CRESCENT_CUDA_DRIVER"] = str(path)
    yield Driver(path)
    if before is None:
        del os.environ["CRESCENT_CUDA_DRIVER"]
    else:
        os.environ["CRESCENT_CUDA_DRIVER"] = before
