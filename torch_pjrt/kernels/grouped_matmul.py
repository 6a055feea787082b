"""Grouped matmul: the mixture-of-experts matmul, each group of rows times its own matrix.

``lhs`` [M, K] holds its rows sorted by group, ``group_sizes`` [G] how many rows each
group has (summing to M), ``rhs`` [G, K, N] one matrix per group:
``out[rows of g] = lhs[rows of g] @ rhs[g]``. A loop over experts would launch G small
matmuls, or compute all G products of every row and mask them (the reference here).

Paths (``impl=``):
    - ``"megablox"``: JAX's Pallas TPU kernels (``jax.experimental.pallas.ops.tpu.
      megablox``): ``gmm`` forward and for ``d_lhs``, ``tgmm`` for ``d_rhs``. Mosaic
      (TPU) only; on the CPU it runs in Pallas's interpret mode (for tests). It needs
      bfloat16 or float32 and M a multiple of 8 (its row tile divides M); its tiles are
      megablox's defaults (128 a side, smaller where a dimension is), not tuned per chip.
    - ``"ragged_dot"``: ``jax.lax.ragged_dot``, XLA's ragged dot, and JAX's rules for
      its gradients: every platform.
    - ``"auto"``: ``"megablox"`` on TPU where it applies, else ``"ragged_dot"`` (GPU, CPU
      and the rest).

Group sizes are checked on the device (non-negative, summing to M): a bad one raises at
the next host sync, as PyTorch's device-side asserts do.

Op: ``torch.ops.pjrt.grouped_matmul(lhs, rhs, group_sizes, *, impl="auto")``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax

from torch_pjrt.kernels.decorator import kernel as pjrt_kernel
from torch_pjrt.runtime import asserts
from torch_pjrt.runtime.platform import current_platform

__all__ = ["grouped_matmul", "grouped_matmul_reference"]

_IMPLS = ("auto", "ragged_dot", "megablox")
_MEGABLOX_DTYPES = (jnp.bfloat16, jnp.float32)
_ROW_TILES = (128, 64, 32, 16, 8)  # megablox's row tile must divide M


def _check_inputs(lhs, rhs, group_sizes, impl: str) -> None:
    """Shapes and dtypes (of JAX arrays or torch tensors), PyTorch's kind of errors."""
    if impl not in _IMPLS:
        raise ValueError(f"grouped_matmul: impl must be one of {_IMPLS}, got {impl!r}")
    if lhs.ndim != 2 or rhs.ndim != 3 or group_sizes.ndim != 1:
        raise ValueError(
            f"grouped_matmul: expected lhs [M, K], rhs [G, K, N] and group_sizes [G], got "
            f"lhs {list(lhs.shape)}, rhs {list(rhs.shape)}, group_sizes "
            f"{list(group_sizes.shape)}"
        )
    if lhs.shape[1] != rhs.shape[1]:
        raise ValueError(
            f"grouped_matmul: lhs {list(lhs.shape)} and rhs {list(rhs.shape)} cannot be "
            f"multiplied: lhs has K={lhs.shape[1]} columns, rhs[g] K={rhs.shape[1]} rows"
        )
    if group_sizes.shape[0] != rhs.shape[0]:
        raise ValueError(
            f"grouped_matmul: group_sizes has {group_sizes.shape[0]} groups but rhs has "
            f"{rhs.shape[0]} (rhs is [G, K, N], one matrix per group)"
        )
    if lhs.dtype != rhs.dtype:
        raise TypeError(
            f"grouped_matmul: expected lhs and rhs to have the same dtype, got {lhs.dtype} "
            f"and {rhs.dtype}"
        )


def _sizes_message(m: int) -> str:
    return f"grouped_matmul: group_sizes sum to {{}}, but lhs has {m} rows; they must sum to M"


def _check_group_sizes(sizes, m: int) -> None:
    """Non-negative sizes summing to M, read at the next host sync."""
    asserts.check(
        sizes >= 0,
        RuntimeError,
        "grouped_matmul: group_sizes must be non-negative, got {}",
        asserts.first_bad(sizes, sizes >= 0),
    )
    total = jnp.sum(sizes)
    asserts.check(total == m, RuntimeError, _sizes_message(m), total)


def _path(impl: str, lhs) -> str:
    if impl != "auto":
        return impl
    fits = lhs.dtype in _MEGABLOX_DTYPES and lhs.shape[0] % 8 == 0 and lhs.shape[0] > 0
    return "megablox" if fits and current_platform() == "tpu" else "ragged_dot"


def _tiling(m: int, k: int, n: int) -> tuple[int, int, int]:
    """megablox's default (128, 128, 128), shrunk to small dimensions; the row tile
    divides m."""
    tm = next((t for t in _ROW_TILES if m % t == 0), None)
    if tm is None:
        raise ValueError(
            f"grouped_matmul: impl='megablox' needs M (lhs rows) a multiple of 8, got {m}; "
            "pad the rows or use impl='ragged_dot'"
        )
    return tm, min(k, 128), min(n, 128)


def _megablox(kernel: str, lhs, rhs, sizes, tiling, **kwargs):
    """megablox's ``gmm`` or ``tgmm``, traced with 64-bit types off: megablox is written
    for JAX's default 32-bit mode (under x64 its grid size, a sum of int32, widens to
    int64 and its kernels fail to trace; Mosaic has no 64-bit integers anyway)."""
    # (the module, not the package's gmm: that name is rebound to ops.gmm there)
    from jax.experimental.pallas.ops.tpu.megablox.gmm import gmm, tgmm

    if lhs.dtype not in _MEGABLOX_DTYPES:
        raise TypeError(
            f"grouped_matmul: impl='megablox' takes bfloat16 or float32, got {lhs.dtype}; "
            "use impl='ragged_dot'"
        )
    with jax.enable_x64(False):
        return {"gmm": gmm, "tgmm": tgmm}[kernel](
            lhs, rhs, sizes, jnp.float32, tiling, interpret=current_platform() == "cpu", **kwargs
        )


def _ragged(lhs, rhs, sizes):
    return lax.ragged_dot(lhs, rhs, sizes, preferred_element_type=jnp.float32)


def grouped_matmul_reference(lhs, rhs, group_sizes):
    """The plain JAX reference: every group's product of every row, masked to its rows."""
    ends = jnp.cumsum(group_sizes)
    rows = jnp.arange(lhs.shape[0])[:, None]
    mask = (rows >= ends - group_sizes) & (rows < ends)  # [M, G]
    products = jnp.einsum("mk,gkn->gmn", lhs, rhs, preferred_element_type=jnp.float32)
    return jnp.einsum("mg,gmn->mn", mask.astype(jnp.float32), products).astype(lhs.dtype)


# --- the op ----------------------------------------------------------------------------


def _backward(lhs, rhs, group_sizes, grad, *, impl: str = "auto"):
    sizes = group_sizes.astype(jnp.int32)
    if _path(impl, lhs) == "megablox":
        m, k, n = lhs.shape[0], lhs.shape[1], rhs.shape[2]
        d_lhs = _megablox("gmm", grad, rhs, sizes, _tiling(m, n, k), transpose_rhs=True)
        d_rhs = _megablox("tgmm", lhs.T, grad, sizes, _tiling(m, k, n))
    else:
        _, pullback = jax.vjp(lambda a, b: _ragged(a, b, sizes), lhs, rhs)
        d_lhs, d_rhs = pullback(grad.astype(jnp.float32))
    return d_lhs.astype(lhs.dtype), d_rhs.astype(rhs.dtype), None


def _reference(lhs, rhs, group_sizes, *, impl: str = "auto"):
    _check_inputs(lhs, rhs, group_sizes, impl)
    sizes = group_sizes.tolist()
    if any(s < 0 for s in sizes):
        raise RuntimeError(f"grouped_matmul: group_sizes must be non-negative, got {sizes}")
    if sum(sizes) != lhs.shape[0]:
        raise RuntimeError(_sizes_message(lhs.shape[0]).format(sum(sizes)))
    pieces = [rows @ matrix for rows, matrix in zip(lhs.split(sizes), rhs)]
    return torch.cat(pieces) if pieces else lhs.new_zeros(0, rhs.shape[2])


@pjrt_kernel("pjrt::grouped_matmul", backward=_backward, reference=_reference)
def grouped_matmul(lhs, rhs, group_sizes, *, impl: str = "auto"):
    """``out[rows of g] = lhs[rows of g] @ rhs[g]`` for the groups of ``group_sizes``.

    Args:
        lhs: [M, K], rows sorted by group.
        rhs: [G, K, N], one matrix per group.
        group_sizes: [G] integer, non-negative, summing to M (empty groups allowed).
        impl: "auto", "ragged_dot" or "megablox" (see the module docstring).

    Returns:
        [M, N] in lhs's dtype (float32 accumulation).

    Example:
        >>> lhs = torch.randn(6, 4, device="pjrt")
        >>> rhs = torch.randn(3, 4, 5, device="pjrt")
        >>> sizes = torch.tensor([2, 0, 4], device="pjrt")
        >>> torch.ops.pjrt.grouped_matmul(lhs, rhs, sizes).shape
        torch.Size([6, 5])
    """
    _check_inputs(lhs, rhs, group_sizes, impl)
    if not jnp.issubdtype(group_sizes.dtype, jnp.integer):
        raise TypeError(f"grouped_matmul: group_sizes must be integers, got {group_sizes.dtype}")
    sizes = group_sizes.astype(jnp.int32)
    _check_group_sizes(sizes, lhs.shape[0])
    if _path(impl, lhs) == "megablox":
        tiling = _tiling(lhs.shape[0], lhs.shape[1], rhs.shape[2])
        out = _megablox("gmm", lhs, rhs, sizes, tiling)
    else:
        out = _ragged(lhs, rhs, sizes)
    return out.astype(lhs.dtype)
