"""pjrt's device guard: the current device, and the C++ guard PyTorch asks about devices.

PyTorch asks a device type's C++ guard (``c10::impl::DeviceGuardImplInterface``) which
device is current, how many there are, and how to record, wait for and time events. The
guard a backend registers from Python (``torch._C._acc.DeviceGuard``) answers one device
and no events: the autograd engine then keeps no queue for ``pjrt:1`` (a backward pass
there fails an internal assert), and ``torch.Event`` cannot synchronize or time.

``install()`` builds ``guard.cpp`` with the C++ compiler (``$CXX``, else ``c++``) against
PyTorch's headers, libc10 and libtorch_cpu (a few seconds, once per source and torch
version; the library
is kept beside this file, or in ``~/.cache/torch_pjrt`` where that is read-only), loads it
with ctypes and registers it for PrivateUse1. Where there is no compiler the Python guard
stays, with its limits, and :func:`native` says why (``torch_pjrt.diagnostics`` reports it).

The current device lives in the C++ guard, per thread as CUDA's: ``torch.pjrt.set_device``
and ``torch.accelerator.set_device_index`` set it, and so do the autograd engine's
device threads. Before ``install()``, and without the C++ guard, it is one Python value.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

import torch

__all__ = ["current_device", "install", "native", "set_current_device", "set_sdpa_overrideable"]

_SOURCE = Path(__file__).with_name("guard.cpp")
_lock = threading.Lock()


class _State:
    library = None  # the loaded C++ guard, once installed
    reason = "not installed yet"  # why there is none
    python_current = 0  # the current device without it
    callbacks = ()  # ctypes callbacks, kept alive for the library


def current_device() -> int:
    library = _State.library
    return library.pjrt_guard_current_device() if library is not None else _State.python_current


def set_current_device(index: int) -> None:
    library = _State.library
    if library is not None:
        library.pjrt_guard_set_current_device(index)
    else:
        _State.python_current = index


# this thread's current stream id per device without the C++ guard
_python_streams = threading.local()


def current_stream_id(index: int) -> int:
    """This thread's current stream of ``pjrt:index`` (0, the default, until one is set)."""
    library = _State.library
    if library is not None:
        return library.pjrt_guard_current_stream(index)
    return getattr(_python_streams, "ids", {}).get(index, 0)


def set_current_stream_id(index: int, stream_id: int) -> None:
    library = _State.library
    if library is not None:
        library.pjrt_guard_set_current_stream(index, stream_id)
    else:
        if not hasattr(_python_streams, "ids"):
            _python_streams.ids = {}
        _python_streams.ids[index] = stream_id


def set_sdpa_overrideable(on: bool) -> bool:
    """Whether F.scaled_dot_product_attention's C++ choice sends the calls pjrt's kernel
    takes to the OVERRIDEABLE backend (``kernels/attention.py``) or every call to
    PyTorch's math; returns False where there is no C++ guard (then PyTorch's math runs
    every call)."""
    library = _State.library
    if library is None:
        return False
    library.pjrt_guard_set_sdpa(int(on))
    return True


def native() -> tuple[bool, str]:
    """(whether the C++ guard is installed, and if not, why)."""
    return _State.library is not None, _State.reason


def _library_path() -> Path:
    """Where the built guard for this source, torch and ABI lives."""
    key = hashlib.sha256(_SOURCE.read_bytes())
    key.update(f"{torch.__version__} {torch._C._GLIBCXX_USE_CXX11_ABI}".encode())
    name = f"_guard-{key.hexdigest()[:16]}.so"
    here = _SOURCE.parent
    if os.access(here, os.W_OK):
        return here / name
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "torch_pjrt"
    return cache / name


def _build(target: Path) -> None:
    """Compile guard.cpp into ``target`` (atomically: concurrent builds each write a
    temporary file and rename it)."""
    root = Path(torch.__file__).parent
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    command = [
        os.environ.get("CXX", "c++"), "-O2", "-std=c++17", "-shared", "-fPIC",
        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
        f"-I{root / 'include'}", str(_SOURCE), "-o", temporary,
        f"-L{root / 'lib'}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{root / 'lib'}",
    ]  # fmt: skip
    try:
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired as e:
            raise OSError(
                f"building the C++ device guard: {command[0]} took more than {e.timeout} s"
            ) from e
        if done.returncode != 0:
            raise OSError(
                f"building the C++ device guard: {command[0]} failed: {done.stderr.strip()[-2000:]}"
            )
        os.replace(temporary, target)
        for stale in target.parent.glob("_guard-*.so"):  # builds of an older source
            if stale != target:
                stale.unlink(missing_ok=True)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


# The device count before the device is first used. PyTorch's autograd engine sizes its
# per-device queues once, at the process's first backward pass, by the guards' counts;
# answering the real count there would start the PJRT client (on a GPU host, JAX would
# take the GPUs' memory from a program that never uses pjrt), so the guard answers a
# bound instead: the engine then keeps an idle queue for each pjrt device index up to it.
UNINITIALIZED_COUNT = 16


def _count() -> int:
    """The guard's device count (0 without a platform; C++ asks it noexcept)."""
    from torch_pjrt import runtime

    if not runtime.is_initialized():
        return UNINITIALIZED_COUNT
    try:
        return runtime.visible_device_count()
    except Exception:  # noqa: BLE001 (no platform: no devices)
        return 0


def _wait(index: int) -> int:
    try:
        torch.pjrt.synchronize(index)
        return 0
    except Exception as e:  # noqa: BLE001 (reported to C++, which raises it)
        kind = "" if type(e) is RuntimeError else f"{type(e).__name__}: "
        _State.library.pjrt_guard_fail(f"{kind}{e}".encode())
        return 1


def install() -> None:
    """Build (if needed), load and register the C++ guard; idempotent. Without a
    compiler, the Python guard stays and :func:`native` says why."""
    with _lock:
        if _State.library is not None:
            return
        try:
            path = _library_path()
            if not path.exists():
                _build(path)
            library = ctypes.CDLL(str(path))
        except OSError as e:
            _State.reason = f"the C++ device guard could not be built or loaded: {e}"
            return
        count = ctypes.CFUNCTYPE(ctypes.c_int)(_count)
        wait = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)(_wait)
        library.pjrt_guard_current_device.restype = ctypes.c_int
        library.pjrt_guard_current_device.argtypes = []
        library.pjrt_guard_set_current_device.argtypes = [ctypes.c_int]
        library.pjrt_guard_current_stream.restype = ctypes.c_int64
        library.pjrt_guard_current_stream.argtypes = [ctypes.c_int]
        library.pjrt_guard_set_current_stream.argtypes = [ctypes.c_int, ctypes.c_int64]
        library.pjrt_guard_fail.argtypes = [ctypes.c_char_p]
        library.pjrt_guard_set_sdpa.argtypes = [ctypes.c_int]
        library.pjrt_guard_install(count, wait)
        # NOTE: torch.Generator(device="pjrt") reaches the extension's generator through
        # a PyTorch path it calls deprecated (a Python backend cannot take the new one:
        # guard.cpp says why); the warning is about PyTorch's internals, not the caller's
        warnings.filterwarnings(
            "ignore", message=r"GetGeneratorForPrivateuse1\(\) is deprecated",
            category=DeprecationWarning,
        )  # fmt: skip
        library.pjrt_guard_set_current_device(_State.python_current)
        _State.callbacks = (count, wait)
        _State.library = library
        _State.reason = ""
