"""Per-op checks of debug mode: synchronous execution, NaN/Inf, and CPU numerics.

``after_op`` runs after each eager op when the mode is ``debug`` or a check is on:

- it waits for the op's results, so an error surfaces at the line that caused it;
- with ``settings.check_nan`` (``TORCH_PJRT_CHECK_NAN=1``) it raises at the first op
  that *produces* a NaN (or an infinity) its inputs did not have: a ``masked_fill``
  with ``-inf`` or a softmax over a row of ``-inf`` (NaN from inf) are judged by what
  is new in the output;
- with ``settings.check_numerics`` (``TORCH_PJRT_CHECK_NUMERICS=1``) it runs the op on
  the CPU with copies of the same inputs and warns (:class:`NumericsWarning`) at each
  op and line whose result differs beyond PyTorch's default tolerances for the dtype
  (``torch.testing.assert_close``), with the maximum error. Every divergence is also
  counted in ``metrics.as_dict()["numerics_divergences"]``.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import torch

from torch_pjrt.config import settings
from torch_pjrt.runtime import events as metrics
from torch_pjrt.runtime import executor

__all__ = ["NumericsWarning", "after_op"]


class NumericsWarning(RuntimeWarning):
    """A pjrt op's result differs from the same op on the CPU beyond tolerance."""


# torch.testing.assert_close's defaults (rtol, atol); integers and bool must be exact
_TOLERANCES = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex64: (1.3e-6, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}


def after_op(op, args, kwargs, out, random: bool) -> None:
    leaves = [a for a in jax.tree_util.tree_leaves(out) if isinstance(a, jax.Array)]
    jax.block_until_ready(leaves)
    if settings.check_nan:
        _check_nan(op, args, kwargs, leaves)
    if settings.check_numerics and not random:
        _check_numerics(op, args, kwargs, out)


def _make_nonfinite():
    def nonfinite(a):
        if not (
            jnp.issubdtype(a.dtype, jnp.floating) or jnp.issubdtype(a.dtype, jnp.complexfloating)
        ):
            return jnp.zeros((), bool), jnp.zeros((), bool)
        return jnp.isnan(a).any(), jnp.isinf(a).any()

    return nonfinite


_nonfinite_fn = executor.helper("nonfinite check", _make_nonfinite)


def _nonfinite(a) -> tuple[bool, bool]:
    nan, inf = _nonfinite_fn()(a)
    return bool(nan), bool(inf)


def _input_values(args, kwargs):
    from torch_pjrt.device.tensor import read

    for x in jax.tree_util.tree_leaves((args, kwargs)):
        if isinstance(x, torch.Tensor):
            yield read(x) if x.device.type == "pjrt" else jnp.asarray(x.detach().cpu().numpy())
        elif isinstance(x, (float, complex)):
            yield jnp.asarray(x)


def _check_nan(op, args, kwargs, leaves) -> None:
    found = [(i, *_nonfinite(a)) for i, a in enumerate(leaves)]
    if not any(nan or inf for _, nan, inf in found):
        return
    had_nan = had_inf = False
    for a in _input_values(args, kwargs):
        nan, inf = _nonfinite(a)
        had_nan, had_inf = had_nan or nan, had_inf or inf
    for i, nan, inf in found:
        what = "NaN" if nan and not had_nan else "Inf" if inf and not had_inf else None
        if what is not None:
            raise RuntimeError(
                f"pjrt: {op} produced {what} in its output {i} (its inputs had none), at "
                f"{metrics.user_line()}. TORCH_PJRT_CHECK_NAN=1 checks every op; unset it "
                "to run at full speed."
            )


def _cpu_copy(t: torch.Tensor) -> torch.Tensor:
    from torch_pjrt.device.tensor import argument
    from torch_pjrt.runtime.transfer import from_numpy

    if t.device.type != "pjrt":
        return t
    return from_numpy(np.array(argument(t)), t.dtype)  # (not counted as a user's host read)


def _to_cpu(x):
    from torch_pjrt.ops.registry import retarget

    return retarget(x, "cpu", _cpu_copy)


def _check_numerics(op, args, kwargs, out) -> None:
    try:
        with torch.no_grad():
            expected = op(*_to_cpu(args), **{k: _to_cpu(v) for k, v in kwargs.items()})
    except Exception:  # noqa: BLE001  (the CPU cannot run it: nothing to compare)
        metrics.count("numerics_unchecked")
        return
    expected = expected if isinstance(expected, (list, tuple)) else (expected,)
    got = out if isinstance(out, (list, tuple)) else (out,)
    for i, (e, g) in enumerate(zip(expected, got)):
        if not isinstance(e, torch.Tensor) or g is None:
            continue
        error = _max_error(e, np.asarray(g))
        if error is None:
            continue
        line = metrics.user_line()
        metrics.tally("numerics_divergences", f"{op} at {line}")
        warnings.warn(
            f"pjrt: {op} output {i} differs from the CPU beyond tolerance at {line}: max abs "
            f"error {error[0]:.3g}, max relative error {error[1]:.3g} ({e.dtype}, rtol "
            f"{error[2]:.1e}, atol {error[3]:.1e}).",
            NumericsWarning,
            stacklevel=2,
        )


def _max_error(expected: torch.Tensor, got: np.ndarray):
    """(max abs error, max rel error, rtol, atol) when beyond tolerance, else None."""
    from torch_pjrt.runtime.transfer import to_numpy

    want = to_numpy(expected)
    if want.shape != got.shape:
        return (float("inf"), float("inf"), 0.0, 0.0)
    rtol, atol = _TOLERANCES.get(expected.dtype, (0.0, 0.0))
    kind = np.complex128 if expected.is_complex() else np.float64
    w, g = want.astype(kind), got.astype(kind)
    both_nan = np.isnan(w) & np.isnan(g)
    diff = np.where(both_nan, 0.0, np.abs(w - g))
    same_inf = np.isinf(w) & (w == g)
    diff = np.where(same_inf, 0.0, diff)
    bad = diff > atol + rtol * np.abs(np.where(same_inf, 0.0, w))
    if not bad.any():
        return None
    rel = diff / np.maximum(np.abs(w), np.finfo(np.float64).tiny)
    return float(np.nanmax(diff)), float(np.nanmax(rel)), rtol, atol
