"""The one table of ``torch.cuda`` calls: what each becomes on pjrt, and in device-generic code.

Both ways of running CUDA code on pjrt read it:

- ``torch-pjrt run --cuda-compat`` (``migrate/cuda_compat.py``) maps the call at run time
  to ``pjrt`` (the receipt's "became"), as exactly as ``mapping`` says;
- ``torch-pjrt migrate`` (``migrate/rules.py``, ``migrate/rewrite.py``) rewrites it in the
  file to ``generic``, a Python expression in which ``{D}`` stands for the module-level
  device the rewrite adds, with ``risk``; a name with no ``risk`` is, to migrate,
  CUDA-only (``rules.CUDA_API_DEFAULT``).

NOTE: the ``torch.accelerator`` memory functions and ``synchronize`` work on pjrt
(device/accelerator.py answers them) but need a C++ caching allocator on other backends
registered from Python, and raise on the CPU without an accelerator. Those calls go through
``torch.get_device_module(device)`` instead, which is ``torch.cuda`` on CUDA, ``torch.pjrt``
on pjrt, ``torch.xpu`` on XPU, and works the same on each.
"""

from __future__ import annotations

import dataclasses

__all__ = ["APPROX", "CUDA_CALLS", "EXACT", "UNSUPPORTED", "CudaCall", "pjrt_call"]

# how exactly a run-time mapping reproduces the CUDA call
EXACT, APPROX, UNSUPPORTED = "exact", "approximate", "unsupported"
# migrate's risk of a rewrite
LOW, MEDIUM = "low", "medium"


@dataclasses.dataclass(frozen=True)
class CudaCall:
    """``torch.cuda.<name>`` (``name`` may be dotted: ``amp.autocast``).

    Args:
        pjrt: what the call becomes at run time (the receipt's words); None:
            ``torch.pjrt.<name>``, the same function of the pjrt device module.
        mapping: how exact that is: :data:`EXACT`, :data:`APPROX` or :data:`UNSUPPORTED`.
        pjrt_note: why it is not exact (the receipt's note).
        generic: the device-generic code migrate writes (``{D}``: the device), None:
            the call is reported, not rewritten.
        risk: migrate's risk (``"low"``, ``"medium"``); None: migrate treats the call as
            CUDA-only.
        note: migrate's note on the rewrite.
    """

    pjrt: str | None = None
    mapping: str = EXACT
    pjrt_note: str = ""
    generic: str | None = None
    risk: str | None = None
    note: str = ""


_MOD = "torch.get_device_module({D})."
_NO_CPU = "torch.cpu has none: guard it with torch.accelerator.is_available()"
_MEMORY_NOTE = (
    "figures of the device's allocator (torch.accelerator's memory functions raise on "
    "backends registered from Python that lack a C++ allocator); " + _NO_CPU
)
_PJRT_MEMORY_NOTE = "figures from the PJRT allocator, or the live arrays where it reports none"
_STAND_IN = "synchronous stand-in"
_STAND_IN_NOTE = (
    "one in-order queue per device (torch.pjrt.Stream); a timing event's record() "
    "synchronizes, so its elapsed_time is host time around synchronized work"
)
_RESEEDS = "also reseeds the CPU generator (and every device's)"


def _memory(name: str, pjrt: str | None = None, migrate: bool = True) -> CudaCall:
    """A memory figure: approximate at run time, the device module's in a rewrite."""
    if not migrate:
        return CudaCall(pjrt, APPROX, _PJRT_MEMORY_NOTE)
    return CudaCall(pjrt, APPROX, _PJRT_MEMORY_NOTE, _MOD + name, MEDIUM, _MEMORY_NOTE)


def _same(name: str, risk: str = MEDIUM, note: str = _MEMORY_NOTE, **pjrt) -> CudaCall:
    """The device module's function of the same name, at run time and in the rewrite."""
    return CudaCall(generic=_MOD + name, risk=risk, note=note, **pjrt)


# torch.cuda.<name>: what it becomes
CUDA_CALLS: dict[str, CudaCall] = {
    # availability, devices
    "is_available": CudaCall(generic="torch.accelerator.is_available", risk=LOW),
    "is_initialized": CudaCall(risk=MEDIUM, note="use torch.accelerator.is_available()"),
    "init": CudaCall(),
    "device_count": CudaCall(generic="torch.accelerator.device_count", risk=LOW),
    "current_device": _same(
        "current_device",
        LOW,
        "'cpu' on the CPU; torch.accelerator.current_device_index raises without an accelerator",
    ),
    "set_device": _same(
        "set_device",
        LOW,
        "a no-op on the CPU; torch.accelerator.set_device_index raises without an accelerator",
    ),
    "device": CudaCall(),
    "synchronize": _same(
        "synchronize",
        LOW,
        "torch.accelerator.synchronize() raises on the CPU without an accelerator",
    ),
    # random numbers
    "manual_seed": CudaCall(generic="torch.manual_seed", risk=MEDIUM, note=_RESEEDS),
    "manual_seed_all": CudaCall(generic="torch.manual_seed", risk=MEDIUM, note=_RESEEDS),
    "seed": CudaCall(generic="torch.seed", risk=MEDIUM, note="also reseeds the CPU generator"),
    "seed_all": CudaCall(generic="torch.seed", risk=MEDIUM, note="also reseeds the CPU generator"),
    "initial_seed": CudaCall(generic="torch.initial_seed", risk=LOW),
    "get_rng_state": _same("get_rng_state", MEDIUM, "the device's RNG state format"),
    "set_rng_state": _same("set_rng_state", MEDIUM, "the device's RNG state format"),
    "get_rng_state_all": CudaCall(),
    "set_rng_state_all": CudaCall(),
    # properties
    "get_device_name": _same("get_device_name", MEDIUM, "the device's own name; " + _NO_CPU),
    "get_device_properties": _same(
        "get_device_properties", MEDIUM, "fields differ between devices (no SM count)"
    ),
    "get_device_capability": _same(
        "get_device_capability",
        MEDIUM,
        "(0, 0) on pjrt: there is no compute capability",
        mapping=APPROX,
        pjrt_note="pjrt has no compute capability: (0, 0)",
    ),
    "is_bf16_supported": CudaCall(
        "True",
        risk=MEDIUM,
        note="answers for CUDA only; bfloat16 works on pjrt (TPUs, recent GPUs) and the CPU: "
        "True, or a test of _DEVICE.type",
    ),
    # memory
    "memory_allocated": _memory("memory_allocated"),
    "max_memory_allocated": _memory("max_memory_allocated"),
    "memory_reserved": _memory("memory_reserved"),
    "max_memory_reserved": _memory("max_memory_reserved"),
    "memory_stats": _memory("memory_stats"),
    "memory_summary": _memory("memory_summary"),
    "reset_peak_memory_stats": _memory("reset_peak_memory_stats"),
    "reset_max_memory_allocated": _memory("reset_max_memory_allocated", migrate=False),
    "reset_accumulated_memory_stats": _memory("reset_accumulated_memory_stats"),
    "mem_get_info": _memory("mem_get_info"),
    "empty_cache": CudaCall(
        "nothing",
        APPROX,
        "XLA frees buffers itself",
        _MOD + "empty_cache",
        MEDIUM,
        "XLA frees buffers itself (a no-op on pjrt); " + _NO_CPU,
    ),
    # streams and events
    "Stream": CudaCall(
        _STAND_IN,
        APPROX,
        _STAND_IN_NOTE,
        risk=MEDIUM,
        note="use torch.Stream(device=...); XLA devices run one in-order queue",
    ),
    "Event": CudaCall(
        _STAND_IN,
        APPROX,
        _STAND_IN_NOTE,
        risk=MEDIUM,
        note="use torch.Event(device=..., enable_timing=True), or time with "
        "torch.get_device_module(device).synchronize() and time.perf_counter()",
    ),
    "current_stream": CudaCall(
        _STAND_IN, APPROX, _STAND_IN_NOTE, "torch.accelerator.current_stream", LOW
    ),
    "default_stream": CudaCall(_STAND_IN, APPROX, _STAND_IN_NOTE),
    "stream": CudaCall(
        _STAND_IN,
        APPROX,
        _STAND_IN_NOTE,
        risk=MEDIUM,
        note="use torch.get_device_module(device).stream(...)",
    ),
    "set_stream": CudaCall(_STAND_IN, APPROX, _STAND_IN_NOTE),
    # graphs: capture and replay (device/graphs.py)
    "graph": CudaCall("torch.pjrt.graph", pjrt_note="captures the ops of every thread"),
    "CUDAGraph": CudaCall("torch.pjrt.Graph", pjrt_note="its pool is a token pjrt ignores"),
    "make_graphed_callables": CudaCall(),
    "graph_pool_handle": CudaCall(),
    "is_current_stream_capturing": CudaCall(),
    # mixed precision
    "amp.autocast": CudaCall(
        'torch.autocast("pjrt")',
        generic="torch.autocast({D}.type, ...)",
        risk=LOW,
        note="torch.cuda.amp.autocast is deprecated",
    ),
    "amp.GradScaler": CudaCall(
        'torch.amp.GradScaler("pjrt")',
        generic="torch.amp.GradScaler({D}.type, ...)",
        risk=LOW,
        note="torch.cuda.amp.GradScaler is deprecated",
    ),
}


def pjrt_call(name: str) -> str:
    """What ``torch.cuda.<name>`` becomes at run time (``torch.pjrt.<name>`` unless the
    table says otherwise)."""
    found = CUDA_CALLS[name].pjrt
    return found if found is not None else f"torch.pjrt.{name}"
