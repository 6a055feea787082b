"""Run CUDA-only code on pjrt: CUDA calls mapped at run time, and a receipt of them.

``torch-pjrt run --cuda-compat script.py`` calls :func:`install` before running the
script. Nothing on disk changes: the mapping is a set of run-time patches, undone by
:func:`uninstall`:

- ``torch.cuda.*`` functions become their ``torch.pjrt`` counterparts (availability,
  devices, synchronize, memory figures, seeds and RNG state); streams and events become
  synchronous stand-ins; every other public ``torch.cuda`` function is counted as
  unsupported and left as it is.
- ``"cuda"``/``"cuda:N"`` device strings and ``torch.device("cuda")`` objects passed to
  torch functions and tensor methods become ``pjrt``/``pjrt:N``, through a
  :class:`torch.overrides.TorchFunctionMode` entered for the whole program;
  ``Tensor.cuda()``, ``Module.cuda()`` and ``Module.to("cuda")`` move to pjrt.
- ``torch.autocast("cuda")``, ``torch.amp.autocast("cuda")``, ``torch.cuda.amp.autocast``
  become pjrt autocast; ``torch.amp.GradScaler("cuda")`` and ``torch.cuda.amp.GradScaler``
  a pjrt GradScaler.
- ``torch.backends.cudnn`` flags are accepted and recorded; they change nothing.
- the ``"nccl"`` backend of ``torch.distributed`` becomes ``"pjrt"``.

The :class:`Receipt` counts each mapped call made by the program (calls that PyTorch
makes internally are mapped but not counted), what it became, and whether the mapping
is exact, approximate or unsupported.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import sys
import threading

import torch
from torch.overrides import TorchFunctionMode

from torch_pjrt.device import memory, streams
from torch_pjrt.migrate.cuda_calls import APPROX, CUDA_CALLS, EXACT, UNSUPPORTED, pjrt_call

__all__ = ["MAPPINGS", "Receipt", "install", "installed", "receipt", "uninstall"]

# call -> (what it became, exactness, note). The receipt and docs/migrating.md use these:
# the torch.cuda calls from the table torch-pjrt migrate shares (migrate/cuda_calls.py),
# then what is not a torch.cuda call.
MAPPINGS: dict[str, tuple[str, str, str]] = {
    f"torch.cuda.{name}": (pjrt_call(name), call.mapping, call.pjrt_note)
    for name, call in CUDA_CALLS.items()
}


def _m(call: str, became: str, exactness: str, note: str = "") -> None:
    MAPPINGS[call] = (became, exactness, note)


_m("Tensor.record_stream", "nothing", EXACT, "one queue: nothing to record")
_m('"cuda" device string', '"pjrt"', EXACT)
_m('"cuda:N" device string', '"pjrt:N"', EXACT)
_m('torch.device("cuda")', 'torch.device("pjrt")', EXACT,
   "device.type is then 'pjrt': code comparing it with 'cuda' takes the other branch")  # fmt: skip
_m('torch.device("cuda") argument', 'torch.device("pjrt")', EXACT,
   "a cuda device object made before install (rare), rewritten where it is passed")  # fmt: skip
_m("Tensor.cuda", 'Tensor.to("pjrt")', EXACT)
_m("Tensor.is_cuda", "True for pjrt tensors", APPROX,
   "only where the program reads it; PyTorch's own code still sees False")  # fmt: skip
_m("Module.cuda", 'Module.to("pjrt")', EXACT)
_m('Module.to("cuda")', 'Module.to("pjrt")', EXACT)
_m("torch.set_default_device", 'torch.set_default_device("pjrt")', EXACT)
_m("torch.load(map_location=cuda)", 'torch.load(map_location="pjrt")', EXACT)
_m('torch.autocast("cuda")', 'torch.autocast("pjrt")', EXACT,
   "CUDA's op lists, op for op (docs/precision.md)")  # fmt: skip
_m('torch.amp.GradScaler("cuda")', 'torch.amp.GradScaler("pjrt")', EXACT)
_m("torch.backends.cudnn.benchmark", "accepted, no effect", APPROX,
   "XLA picks its own algorithms; values are unchanged")  # fmt: skip
_m("torch.backends.cudnn.enabled", "accepted, no effect", APPROX, "there is no cuDNN")
_m("torch.backends.cudnn.allow_tf32", "accepted, no effect", APPROX,
   "use torch.set_float32_matmul_precision (docs/precision.md)")  # fmt: skip
_m("torch.backends.cudnn.deterministic", "accepted, not enforced", UNSUPPORTED,
   "XLA on the CPU is deterministic; on GPUs it needs --xla_gpu_deterministic_ops")  # fmt: skip
_m('init_process_group("nccl")', 'init_process_group("pjrt")', EXACT)
_m('new_group(backend="nccl")', 'new_group(backend="pjrt")', EXACT)
_m("torch.distributed.is_nccl_available", "True (the pjrt backend)", APPROX)
# Any other public torch.cuda function: counted, and called unchanged.
UNSUPPORTED_NOTE = "not mapped: called unchanged (raises on a build without CUDA)"


class Receipt:
    """Counts of mapped calls: ``{call: count}`` with :data:`MAPPINGS` for the rest."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def record(self, call: str) -> None:
        with self._lock:
            self.counts[call] = self.counts.get(call, 0) + 1

    def rows(self) -> list[dict]:
        out = []
        for call, count in self.counts.items():
            became, exactness, note = MAPPINGS.get(call, ("unchanged", UNSUPPORTED, ""))
            if call not in MAPPINGS:
                note = UNSUPPORTED_NOTE
            out.append(
                {
                    "call": call,
                    "count": count,
                    "became": became,
                    "mapping": exactness,
                    "note": note,
                }  # fmt: skip
            )
        order = {EXACT: 0, APPROX: 1, UNSUPPORTED: 2}
        return sorted(out, key=lambda r: (order[r["mapping"]], r["call"]))

    def as_dict(self) -> dict:
        rows = self.rows()
        totals = {
            k: sum(r["count"] for r in rows if r["mapping"] == k)
            for k in (EXACT, APPROX, UNSUPPORTED)
        }
        return {"calls": rows, "totals": totals}

    def format(self) -> str:
        rows = self.rows()
        lines = ["torch-pjrt run --cuda-compat: CUDA calls mapped at run time"]
        if not rows:
            lines.append("  (the program made no CUDA call)")
            return "\n".join(lines)
        w = max(len("call"), *(len(r["call"]) for r in rows))
        wb = max(len("became"), *(len(r["became"]) for r in rows))
        lines.append(f"  {'call':<{w}}  {'count':>5}  {'became':<{wb}}  mapping")
        for r in rows:
            lines.append(
                f"  {r['call']:<{w}}  {r['count']:>5}  {r['became']:<{wb}}  {r['mapping']}"
            )
        totals = self.as_dict()["totals"]
        lines.append("  " + ", ".join(f"{n} {k}" for k, n in totals.items()) + " (calls)")
        notes: dict[str, list[str]] = {}
        for r in rows:
            if r["mapping"] != EXACT and r["note"]:
                notes.setdefault(r["note"], []).append(r["call"])
        for note, calls in notes.items():
            lines.append(f"  note ({', '.join(calls)}): {note}")
        return "\n".join(lines)

    def write_json(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.as_dict(), f, indent=2)
            f.write("\n")


_receipt = Receipt()
_state: dict = {"installed": False, "patches": [], "mode": None, "atexit": None}
_local = threading.local()  # .quiet > 0 while a counted call maps its inner calls
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_PJRT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # torch_pjrt/
_CUDA_STR = re.compile(r"cuda(:\d+)?")


def receipt() -> Receipt:
    """The receipt of this process's mapped calls."""
    return _receipt


def installed() -> bool:
    return _state["installed"]


def _from_program(depth: int) -> bool:
    """Whether the frame ``depth`` levels up is the program's (not torch's, not ours)."""
    try:
        name = sys._getframe(depth + 1).f_code.co_filename
    except ValueError:
        return True
    return not (name.startswith(_TORCH_DIR) or name.startswith(_PJRT_DIR))


def _quiet() -> bool:
    return getattr(_local, "quiet", 0) > 0


@contextlib.contextmanager
def _quietly():
    _local.quiet = getattr(_local, "quiet", 0) + 1
    try:
        yield
    finally:
        _local.quiet -= 1


def _record(call: str, depth: int = 2) -> None:
    if not _quiet() and _from_program(depth):
        _receipt.record(call)


# -- device strings -------------------------------------------------------------------


def _map_device(v):
    """(mapped value, receipt entry or None)."""
    if isinstance(v, str) and _CUDA_STR.fullmatch(v):
        return "pjrt" + v[4:], ('"cuda" device string' if v == "cuda" else '"cuda:N" device string')
    if isinstance(v, torch.device) and v.type == "cuda":
        return torch.device("pjrt", v.index), 'torch.device("cuda") argument'
    return v, None


def _pjrt_device(device=None) -> torch.device:
    if device is None:
        return torch.device("pjrt", torch.pjrt.current_device())
    if isinstance(device, int):
        return torch.device("pjrt", device)
    mapped, _ = _map_device(device)
    mapped = torch.device(mapped)
    if mapped.type != "pjrt":
        raise ValueError(f"Expected a cuda device, got {device}")
    return mapped


_IS_CUDA = torch.Tensor.is_cuda  # the descriptor: its __get__ is what the mode sees


class _CudaDevices(TorchFunctionMode):
    """Rewrites cuda devices in the arguments of every torch function and method."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            _record("Tensor.cuda")
            self_, *rest = args
            device = rest[0] if rest else kwargs.pop("device", None)
            return self_.to(_pjrt_device(device), **kwargs)
        if getattr(func, "__self__", None) is _IS_CUDA:
            value = func(*args, **kwargs)
            if not value and args[0].device.type == "pjrt" and _from_program(1):
                _receipt.record("Tensor.is_cuda")
                return True
            return value
        if func is torch.Tensor.record_stream:
            _record("Tensor.record_stream")
            return None
        hits = None
        new_args = args
        for i, a in enumerate(args):
            m, hit = _map_device(a)
            if hit:
                if hits is None:
                    hits, new_args = [], list(args)
                new_args[i] = m
                hits.append(hit)
        for k, v in kwargs.items():
            m, hit = _map_device(v)
            if hit:
                if hits is None:
                    hits = []
                kwargs[k] = m
                hits.append(hit)
        if hits:
            if not _quiet():
                if func is torch.device:
                    hits = ['torch.device("cuda")']
                for h in hits:
                    _receipt.record(h)
            return func(*new_args, **kwargs)
        return func(*args, **kwargs)


# -- torch.cuda -----------------------------------------------------------------------


class Stream(streams.Stream):
    """``torch.cuda.Stream`` on pjrt (torch_pjrt.device.streams): cuda devices mean pjrt ones."""

    def __init__(self, device=None, priority=0, **kwargs):
        super().__init__(_pjrt_device(device), priority)


def _default_stream(device=None):
    return Stream(device)


def _on_pjrt(fn):
    """A torch.pjrt function taking a device: cuda devices are mapped first."""

    def call(*args, **kwargs):
        args = tuple(_map_device(a)[0] for a in args)
        kwargs = {k: _map_device(v)[0] for k, v in kwargs.items()}
        return fn(*args, **kwargs)

    return call


def _cuda_targets() -> dict:
    """torch.cuda function -> what runs instead: torch.pjrt's function of the same name
    where the table says so (``CudaCall.pjrt`` None), else a stand-in below. (The classes
    ``device``, ``Stream``, ``Event``, ``graph`` and ``CUDAGraph`` and ``torch.cuda.amp``
    are patched by install.)"""
    p = torch.pjrt
    t = {
        name: _on_pjrt(getattr(p, name))
        for name, call in CUDA_CALLS.items()
        if call.pjrt is None and name not in ("init", "device")
    }
    t["init"] = lambda: p._lazy_init()
    t["get_rng_state"] = lambda device="cuda": p.get_rng_state(_pjrt_device(device))
    t["set_rng_state"] = lambda state, device="cuda": p.set_rng_state(state, _pjrt_device(device))
    for name in memory.__all__:  # torch.pjrt.memory has torch.cuda's names
        t[name] = _on_pjrt(getattr(memory, name))
    t["is_bf16_supported"] = lambda including_emulation=True: True
    t["current_stream"] = _default_stream
    t["default_stream"] = _default_stream
    t["stream"] = streams.stream
    t["set_stream"] = streams.set_stream
    return t


def _counted(call: str, fn):
    def wrapper(*args, **kwargs):
        _record(call)
        with _quietly():
            return fn(*args, **kwargs)

    wrapper.__name__ = getattr(fn, "__name__", call.rsplit(".", 1)[-1])
    wrapper.__doc__ = f"{call} mapped to pjrt by torch_pjrt.migrate.cuda_compat."
    wrapper.__wrapped__ = fn
    return wrapper


def _counted_class(call: str, cls):
    class Counted(cls):
        def __init__(self, *args, **kwargs):
            _record(call)
            super().__init__(*args, **kwargs)

    Counted.__name__ = Counted.__qualname__ = cls.__name__
    return Counted


# -- autocast, GradScaler -------------------------------------------------------------

_Autocast = torch.amp.autocast_mode.autocast
_GradScaler = torch.amp.grad_scaler.GradScaler


class _PjrtAutocast(_Autocast):
    """``torch.autocast``, with ``device_type="cuda"`` running on pjrt."""

    def __init__(self, device_type, *args, **kwargs):
        if device_type == "cuda":
            _record('torch.autocast("cuda")')
            device_type = "pjrt"
        super().__init__(device_type, *args, **kwargs)


class _CudaAmpAutocast(_Autocast):
    """``torch.cuda.amp.autocast``: pjrt autocast."""

    def __init__(self, enabled=True, dtype=torch.float16, cache_enabled=True):
        _record("torch.cuda.amp.autocast")
        super().__init__("pjrt", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


class _PjrtGradScaler(_GradScaler):
    """``torch.amp.GradScaler``, with the device ``"cuda"`` (its default) on pjrt."""

    def __init__(self, device="cuda", *args, **kwargs):
        if device == "cuda":
            _record('torch.amp.GradScaler("cuda")')
            device = "pjrt"
        super().__init__(device, *args, **kwargs)


class _CudaAmpGradScaler(_GradScaler):
    """``torch.cuda.amp.GradScaler``: a pjrt GradScaler."""

    def __init__(self, *args, **kwargs):
        _record("torch.cuda.amp.GradScaler")
        super().__init__("pjrt", *args, **kwargs)


# -- modules, cudnn, distributed, misc ------------------------------------------------


def _module_cuda(self, device=None):
    _record("Module.cuda")
    with _quietly():
        return self.to(_pjrt_device(device))


def _patched_module_to(original):
    def to(self, *args, **kwargs):
        mapped_args = [_map_device(a)[0] for a in args]
        mapped_kwargs = {k: _map_device(v)[0] for k, v in kwargs.items()}
        if mapped_args != list(args) or mapped_kwargs != kwargs:
            _record('Module.to("cuda")')
            with _quietly():
                return original(self, *mapped_args, **mapped_kwargs)
        return original(self, *args, **kwargs)

    to.__wrapped__ = original
    return to


def _cudnn_class(cls):
    flags = {"benchmark", "enabled", "allow_tf32", "deterministic"}

    class Recording(cls):
        def __setattr__(self, name, value):
            if name in flags:
                _record(f"torch.backends.cudnn.{name}")
            super().__setattr__(name, value)

    Recording.__name__ = Recording.__qualname__ = cls.__name__
    return Recording


def _nccl(backend):
    if not isinstance(backend, str) or "nccl" not in backend:
        return backend, False
    import torch.distributed as dist

    target = "pjrt" if "pjrt" in dist.Backend.backend_list else "gloo"
    if backend == "nccl":
        return target, True
    # "cpu:gloo,cuda:nccl"
    return backend.replace("cuda:nccl", f"pjrt:{target}").replace("nccl", target), True


def _patched_init_pg(original):
    def init_process_group(backend=None, *args, **kwargs):
        backend, hit = _nccl(backend)
        if hit:
            _record('init_process_group("nccl")')
        return original(backend, *args, **kwargs)

    return init_process_group


def _patched_new_group(original):
    def new_group(*args, **kwargs):
        if len(args) >= 3:
            args = list(args)
            args[2], hit = _nccl(args[2])
        else:
            kwargs["backend"], hit = _nccl(kwargs.get("backend"))
        if hit:
            _record('new_group(backend="nccl")')
        return original(*args, **kwargs)

    return new_group


def _patched_set_default_device(original):
    def set_default_device(device):
        mapped, hit = _map_device(device)
        if hit:
            _record("torch.set_default_device")
        return original(mapped)

    return set_default_device


def _patched_load(original):
    def load(*args, **kwargs):
        loc = kwargs.get("map_location")
        mapped, hit = _map_device(loc)
        if hit:
            _record("torch.load(map_location=cuda)")
            kwargs["map_location"] = mapped
        return original(*args, **kwargs)

    return load


def _patch(obj, name, value) -> None:
    _state["patches"].append((obj, name, getattr(obj, name, None)))
    setattr(obj, name, value)


def install(*, report_at_exit: bool = True) -> Receipt:
    """Map CUDA calls to pjrt for the rest of the process; returns the receipt.

    Args:
        report_at_exit: print the receipt to stderr when the process exits.
    """
    if _state["installed"]:
        return _receipt
    torch.pjrt._lazy_init()
    cuda = torch.cuda
    targets = _cuda_targets()
    for name, fn in targets.items():
        _patch(cuda, name, _counted(f"torch.cuda.{name}", fn))
    _patch(cuda, "device", _counted_class("torch.cuda.device", torch.pjrt.device))
    _patch(cuda, "Event", _counted_class("torch.cuda.Event", streams.Event))
    _patch(cuda, "Stream", _counted_class("torch.cuda.Stream", Stream))
    _patch(cuda, "graph", _counted_class("torch.cuda.graph", torch.pjrt.graph))
    _patch(cuda, "CUDAGraph", _counted_class("torch.cuda.CUDAGraph", torch.pjrt.Graph))
    # every other public torch.cuda function: counted as unsupported, called unchanged
    for name in dir(cuda):
        fn = getattr(cuda, name)
        if (
            name.startswith("_")
            or name in targets
            or isinstance(fn, type)
            or not callable(fn)
            or not getattr(fn, "__module__", "").startswith("torch.cuda")
        ):
            continue
        _patch(cuda, name, _counted(f"torch.cuda.{name}", fn))

    _patch(torch, "autocast", _PjrtAutocast)
    _patch(torch.amp, "autocast", _PjrtAutocast)
    _patch(torch.amp.autocast_mode, "autocast", _PjrtAutocast)
    _patch(torch.amp, "GradScaler", _PjrtGradScaler)
    _patch(torch.amp.grad_scaler, "GradScaler", _PjrtGradScaler)
    _patch(cuda.amp, "autocast", _CudaAmpAutocast)
    _patch(cuda.amp, "GradScaler", _CudaAmpGradScaler)

    _patch(torch.nn.Module, "cuda", _module_cuda)
    _patch(torch.nn.Module, "to", _patched_module_to(torch.nn.Module.to))
    _patch(torch, "set_default_device", _patched_set_default_device(torch.set_default_device))
    _patch(torch, "load", _patched_load(torch.load))

    cudnn = torch.backends.cudnn
    _state["cudnn_class"] = type(cudnn)
    cudnn.__class__ = _cudnn_class(type(cudnn))

    import torch.distributed as dist

    if dist.is_available():
        _patch(dist, "init_process_group", _patched_init_pg(dist.init_process_group))
        _patch(dist, "new_group", _patched_new_group(dist.new_group))
        _patch(dist, "is_nccl_available", _counted("torch.distributed.is_nccl_available",
                                                   lambda: True))  # fmt: skip

    mode = _CudaDevices()
    mode.__enter__()
    _state["mode"] = mode
    if report_at_exit:
        _state["atexit"] = _print_at_exit
        atexit.register(_print_at_exit)
    _state["installed"] = True
    return _receipt


def _print_at_exit() -> None:
    print(_receipt.format(), file=sys.stderr)


def uninstall() -> None:
    """Undo :func:`install` (the receipt keeps its counts)."""
    if not _state["installed"]:
        return
    _state["mode"].__exit__(None, None, None)
    for obj, name, old in reversed(_state["patches"]):
        setattr(obj, name, old)
    _state["patches"].clear()
    torch.backends.cudnn.__class__ = _state.pop("cudnn_class")
    if _state["atexit"] is not None:
        atexit.unregister(_state["atexit"])
        _state["atexit"] = None
    _state["installed"] = False
