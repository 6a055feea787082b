"""Eager ``_c10d_functional`` ops (functional collectives) on pjrt tensors.

``torch.distributed._functional_collectives`` (what DTensor calls) runs the
``_c10d_functional`` ops, whose one C++ kernel (CompositeExplicitAutograd) resolves the
group by name and calls its C++ methods. For a Python process group those reach Python
only where PyTorch's pybind trampoline forwards them (``allreduce``, ``broadcast``,
``all_to_all_single``); ``all_gather_single``/``_allgather_base`` and
``reduce_scatter_single``/``_reduce_scatter_base`` are not forwarded, so the C++ default
dispatches ``c10d::_allgather_base_`` on the pjrt device, which looks for a per-device
backend and fails (``No backend type associated with device type pjrt``).

So these kernels, registered for the PrivateUse1 key, take the pjrt tensors' calls
first: they resolve the group, make the output and call the pjrt group's Python
collective. The collectives are dispatched to JAX and the outputs hold the future
values, so ``wait_tensor`` (left to PyTorch's kernel) has nothing to wait for.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions

__all__ = ["register"]

_library = None

_REDUCE_OPS = {
    "sum": dist.ReduceOp.SUM,
    "avg": dist.ReduceOp.AVG,
    "product": dist.ReduceOp.PRODUCT,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
    "band": dist.ReduceOp.BAND,
    "bor": dist.ReduceOp.BOR,
    "bxor": dist.ReduceOp.BXOR,
}


def _group(group_name):
    """The pjrt process group a functional collective names (a name or the group)."""
    from torch_pjrt.distributed.backend import PjrtProcessGroup

    if isinstance(group_name, str):
        group = torch._C._distributed_c10d._resolve_process_group(group_name)
    else:
        group = group_name
    if not isinstance(group, PjrtProcessGroup):
        raise RuntimeError(
            "pjrt: a functional collective on pjrt tensors needs a pjrt process group, "
            f"got {type(group).__name__} ({group_name!r})"
        )
    return group


def _reduce_op(name: str):
    op = _REDUCE_OPS.get(name.lower())
    if op is None:
        raise RuntimeError(f"pjrt: functional collectives do not support reduce_op {name!r}")
    return op


def _size_check(group, group_size: int, what: str) -> None:
    if group_size != group.size():
        raise RuntimeError(
            f"pjrt: {what} got group_size={group_size} for a group of {group.size()} ranks"
        )


def _all_reduce_(input, reduce_op, group_name):  # noqa: A002
    opts = dist.AllreduceOptions()
    opts.reduceOp = _reduce_op(reduce_op)
    _group(group_name).allreduce([input], opts)
    return input


def _all_reduce(input, reduce_op, group_name):  # noqa: A002
    return _all_reduce_(input.clone(), reduce_op, group_name)


def _all_reduce_coalesced_(inputs, reduce_op, group_name):
    for t in inputs:
        _all_reduce_(t, reduce_op, group_name)
    return inputs


def _all_reduce_coalesced(inputs, reduce_op, group_name):
    return [_all_reduce(t, reduce_op, group_name) for t in inputs]


def _all_gather_into_tensor_out(input, group_size, group_name, *, out):  # noqa: A002
    group = _group(group_name)
    _size_check(group, group_size, "all_gather_into_tensor")
    group._allgather_base(out, input.contiguous(), AllgatherOptions())
    return out


def _all_gather_into_tensor(input, group_size, group_name):  # noqa: A002
    shape = (input.shape[0] * group_size, *input.shape[1:]) if input.dim() else (group_size,)
    out = input.new_empty(shape)
    return _all_gather_into_tensor_out(input, group_size, group_name, out=out)


def _all_gather_into_tensor_coalesced(inputs, group_size, group_name):
    return [_all_gather_into_tensor(t, group_size, group_name) for t in inputs]


def _reduce_scatter_tensor_out(input, reduce_op, group_size, group_name, *, out):  # noqa: A002
    group = _group(group_name)
    _size_check(group, group_size, "reduce_scatter_tensor")
    opts = dist.ReduceScatterOptions()
    opts.reduceOp = _reduce_op(reduce_op)
    group._reduce_scatter_base(out, input.contiguous(), opts)
    return out


def _reduce_scatter_tensor(input, reduce_op, group_size, group_name):  # noqa: A002
    if input.dim() == 0 or input.shape[0] % group_size:
        raise RuntimeError(
            f"pjrt: reduce_scatter_tensor needs dim 0 of the input ({tuple(input.shape)}) "
            f"divisible by the group size {group_size}"
        )
    out = input.new_empty((input.shape[0] // group_size, *input.shape[1:]))
    return _reduce_scatter_tensor_out(input, reduce_op, group_size, group_name, out=out)


def _reduce_scatter_tensor_coalesced(inputs, reduce_op, group_size, group_name):
    return [_reduce_scatter_tensor(t, reduce_op, group_size, group_name) for t in inputs]


def _all_to_all_single(input, output_split_sizes, input_split_sizes, group_name):  # noqa: A002
    group = _group(group_name)
    rows = sum(int(s) for s in output_split_sizes) if output_split_sizes else input.shape[0]
    out = input.new_empty((rows, *input.shape[1:]))
    group.all_to_all_single(
        out,
        input.contiguous(),
        [int(s) for s in output_split_sizes],
        [int(s) for s in input_split_sizes],
        dist.AllToAllOptions(),
    )
    return out


def _broadcast_(input, src, group_name):  # noqa: A002
    opts = dist.BroadcastOptions()
    opts.rootRank = src
    _group(group_name).broadcast([input], opts)
    return input


def _broadcast(input, src, group_name):  # noqa: A002
    return _broadcast_(input.clone(), src, group_name)


_KERNELS = {
    "all_reduce": _all_reduce,
    "all_reduce_": _all_reduce_,
    "all_reduce_coalesced": _all_reduce_coalesced,
    "all_reduce_coalesced_": _all_reduce_coalesced_,
    "all_gather_into_tensor": _all_gather_into_tensor,
    "all_gather_into_tensor_out": _all_gather_into_tensor_out,
    "all_gather_into_tensor_coalesced": _all_gather_into_tensor_coalesced,
    "reduce_scatter_tensor": _reduce_scatter_tensor,
    "reduce_scatter_tensor_out": _reduce_scatter_tensor_out,
    "reduce_scatter_tensor_coalesced": _reduce_scatter_tensor_coalesced,
    "all_to_all_single": _all_to_all_single,
    "broadcast": _broadcast,
    "broadcast_": _broadcast_,
}


def register() -> None:
    """Register the kernels for the pjrt device (PrivateUse1); idempotent."""
    global _library
    if _library is not None:
        return
    import torch.distributed._functional_collectives  # noqa: F401 (defines the ops' autograd)

    lib = torch.library.Library("_c10d_functional", "IMPL")
    for name, kernel in _KERNELS.items():
        lib.impl(name, kernel, "PrivateUse1")
    _library = lib
