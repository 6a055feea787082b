"""Host <-> device transfers and the torch <-> JAX dtype map."""

from __future__ import annotations

import contextlib
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import torch

from torch_pjrt.runtime import asserts, platform, profiling
from torch_pjrt.runtime import events as metrics

TORCH_TO_JAX = {
    torch.float32: jnp.float32,
    torch.float64: jnp.float64,
    torch.float16: jnp.float16,
    torch.bfloat16: jnp.bfloat16,
    torch.int8: jnp.int8,
    torch.int16: jnp.int16,
    torch.int32: jnp.int32,
    torch.int64: jnp.int64,
    torch.uint8: jnp.uint8,
    torch.uint16: jnp.uint16,
    torch.uint32: jnp.uint32,
    torch.uint64: jnp.uint64,
    torch.bool: jnp.bool_,
    torch.complex64: jnp.complex64,
    torch.complex128: jnp.complex128,
    torch.float8_e4m3fn: jnp.float8_e4m3fn,
    torch.float8_e5m2: jnp.float8_e5m2,
}
JAX_TO_TORCH = {np.dtype(v): k for k, v in TORCH_TO_JAX.items()}


def jax_dtype(dtype: torch.dtype):
    try:
        return TORCH_TO_JAX[dtype]
    except KeyError:
        raise unsupported_dtype(dtype) from None


def unsupported_dtype(dtype: torch.dtype) -> TypeError:
    """The error of a dtype pjrt tensors cannot hold, naming those they can."""
    return TypeError(
        f"dtype {dtype} is not supported on pjrt devices (platform "
        f"'{platform.current_platform()}'); supported: "
        f"{', '.join(str(d).replace('torch.', '') for d in TORCH_TO_JAX)}"
    )


def torch_dtype(dtype) -> torch.dtype:
    return JAX_TO_TORCH[np.dtype(dtype)]


# dtypes numpy lacks: (same-size torch integer dtype, its numpy twin, the ml_dtypes type)
_NUMPY_VIEW = {
    torch.bfloat16: (torch.int16, np.int16, ml_dtypes.bfloat16),
    torch.float8_e4m3fn: (torch.uint8, np.uint8, ml_dtypes.float8_e4m3fn),
    torch.float8_e5m2: (torch.uint8, np.uint8, ml_dtypes.float8_e5m2),
}


_NUMPY_MAX_DIMS = 64


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor as a numpy array (a view where numpy has the dtype)."""
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if t.dtype in _NUMPY_VIEW:
        as_int, _, np_dtype = _NUMPY_VIEW[t.dtype]
        return t.contiguous().view(as_int).numpy().view(np_dtype)
    return t.numpy()


def from_numpy(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    if dtype in _NUMPY_VIEW:
        _, np_int, _ = _NUMPY_VIEW[dtype]
        return torch.from_numpy(np.ascontiguousarray(a).view(np_int)).view(dtype)
    return torch.from_numpy(np.ascontiguousarray(a))


_NONE = contextlib.nullcontext()  # (no profiler span)
# the last array copied to a device, as a callable that returns it or None (what an
# Event waits for): held while it is small, so that a copy whose array is dropped at
# once (a step's small inputs, read by one program) still marks the copy; weakly above
# _HOLD_BYTES, so that a large one does not outlive its tensor
uploaded = None
_HOLD_BYTES = 1 << 20


def from_host(t: torch.Tensor, device) -> jax.Array:
    """Copy a CPU tensor to a JAX device."""
    if t.dim() > _NUMPY_MAX_DIMS:  # (numpy's limit, not PyTorch's or XLA's: copied flat)
        return from_host(t.reshape(-1), device).reshape(t.shape)
    a = to_numpy(t)
    metrics.count("transfers_to_device")
    metrics.count("bytes_to_device", a.nbytes)
    if device.platform == "cpu":
        # NOTE: on the CPU platform device_put aliases the numpy buffer, which is the
        # CPU tensor's memory (even with may_alias=False): a later in-place op on the
        # CPU tensor would change the device copy, and a donated buffer would be
        # written into the CPU tensor. Copy it: the device array must own its bytes.
        a = a.copy()
    traced = profiling.span("pjrt::to_device", bytes=a.nbytes) if profiling.active() else _NONE
    global uploaded
    with traced:
        out = _put(a, device)
    uploaded = weakref.ref(out) if a.nbytes > _HOLD_BYTES else (lambda: out)
    return out


_shardings: dict = {}  # device -> its SingleDeviceSharding (for _put)


def _put(a: np.ndarray, device) -> jax.Array:
    """``jax.device_put(a, device)`` with 64-bit types kept, through the C++ call that
    device_put ends in for a host array (``batched_device_put``): about 5 us a call,
    against about 28 for device_put's Python around it, which small copies (a step's
    inputs) pay each time. Where that call is not there (another jaxlib), device_put."""
    global _put_fast
    if _put_fast:
        sharding = _shardings.get(device)
        if sharding is None:
            sharding = _shardings[device] = jax.sharding.SingleDeviceSharding(device)
        try:
            aval = jax.core.ShapedArray(a.shape, a.dtype)
            return _xc.batched_device_put(aval, sharding, [a], [device], True, enable_x64=True)
        except (AttributeError, TypeError):
            _put_fast = False
    with jax.enable_x64(True):
        return jax.device_put(a, device)


try:
    from jax._src.lib import xla_client as _xc

    _put_fast = hasattr(_xc, "batched_device_put")
except ImportError:  # (another jax)
    _put_fast = False


def to_host(a: jax.Array, dtype: torch.dtype) -> torch.Tensor:
    """Copy a JAX array to a new CPU tensor (waits for it: a host sync, where the device's
    value checks are read; the result of a failed check is refused)."""
    host_wait()  # (the copies issued before this one are done before it)
    asserts.refuse_read(a)
    out = torch.empty(tuple(a.shape), dtype=dtype)
    if out.numel():
        nbytes = out.numel() * out.element_size()
        with profiling.span("pjrt::to_host", bytes=nbytes) if profiling.active() else _NONE:
            _fill(a, out)
    metrics.count("transfers_to_host")
    metrics.count("bytes_to_host", out.numel() * out.element_size())
    return out


# --- copies to the host that do not wait (``non_blocking=True``) ----------------------

_copies_lock = threading.Lock()
_copier: ThreadPoolExecutor | None = None  # one thread: copies end in the order issued
_copies: list = []  # (sequence number, future, array) not yet waited for
_copies_issued = 0  # copies issued so far (an Event remembers this number at its record)


def to_host_async(a: jax.Array, dtype: torch.dtype, out: torch.Tensor | None = None):
    """A new CPU tensor (or ``out``: contiguous, of ``a``'s shape and ``dtype``) that the
    value of ``a`` is copied into without waiting for it, as a CUDA copy to pinned memory
    with ``non_blocking=True``: the tensor is returned at once and holds the value after
    the next synchronization point that follows the copy (``torch.pjrt.synchronize()``,
    an Event recorded after it, its stream's ``synchronize()``: :func:`wait_host_copies`;
    also a copy that waits, such as a value read or ``.cpu()``). A helper thread fills it
    as soon as the device has computed ``a``, so the host goes on with other work."""
    global _copier, _copies_issued
    if out is None:
        out = torch.empty(tuple(a.shape), dtype=dtype)
    metrics.count("transfers_to_host")
    metrics.count("bytes_to_host", out.numel() * out.element_size())
    if not out.numel():
        return out
    a.copy_to_host_async()
    with _copies_lock:
        if _copier is None:
            _copier = ThreadPoolExecutor(1, thread_name_prefix="pjrt-to-host")
        future = _copier.submit(_fill, a, out)
        _copies.append((_copies_issued, future, a))
        _copies_issued += 1
    return out


def _fill(a: jax.Array, out: torch.Tensor) -> None:
    if a.ndim > _NUMPY_MAX_DIMS:
        a, out = a.reshape(-1), out.view(-1)
    to_numpy(out)[...] = np.asarray(a)


def host_copies_issued() -> int:
    """How many asynchronous copies to the host were issued so far (what an Event
    waits for when it synchronizes)."""
    return _copies_issued


def host_copies_done(upto: int) -> bool:
    """Whether the asynchronous copies to the host issued before ``upto`` are done."""
    with _copies_lock:
        return all(f.done() for n, f, _ in _copies if n < upto)


def wait_host_copies(upto: int | None = None, refuse: bool = True) -> None:
    """Wait for the asynchronous copies to the host issued before copy number ``upto``
    (all of them: None). Called after a host sync (``metrics.host_sync``: the device's
    value checks read): a copy of a value that a failed check computed raises that
    check's error here (``refuse``), as a CUDA device-side assert surfaces at the next
    synchronization; every copy waited for is done with either way."""
    with _copies_lock:
        n = len(_copies) if upto is None else sum(1 for c in _copies if c[0] < upto)
        done, _copies[:n] = _copies[:n], []
    error = None
    for _, future, a in done:
        try:
            future.result()
            if refuse:
                asserts.refuse_read(a)
        except Exception as exc:  # noqa: BLE001  (the first is raised, after the rest)
            error = error or exc
    if error is not None:
        raise error


def host_wait(upto: int | None = None, partial: bool = False) -> None:
    """The host waits: a host sync (``partial``: for part of the device's work, see
    ``metrics.host_sync``), then the asynchronous copies to the host issued before copy
    number ``upto`` (all: None), which are done with even when a check's error is
    raised."""
    try:
        metrics.host_sync(partial)
    except BaseException:
        if _copies:
            wait_host_copies(upto, refuse=False)
        raise
    if _copies:
        wait_host_copies(upto)


def module_on_cpu(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``module`` with its parameters and buffers on the CPU (one transfer each;
    tied weights stay tied; same mode); ``module`` itself is left as it was."""
    import copy

    memo: dict = {}
    for p in module.parameters():
        memo.setdefault(id(p), torch.nn.Parameter(p.detach().to("cpu"), p.requires_grad))
    for b in module.buffers():
        memo.setdefault(id(b), b.detach().to("cpu"))
    return copy.deepcopy(module, memo)


def tree_on_cpu(value):
    """``value`` (tensors in lists, tuples, dicts) with every tensor detached and on the
    CPU."""
    return torch.utils._pytree.tree_map(
        lambda v: v.detach().to("cpu") if isinstance(v, torch.Tensor) else v, value
    )
