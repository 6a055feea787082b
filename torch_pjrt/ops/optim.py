"""Fused optimizer steps (``torch.optim.Adam`` / ``AdamW`` with ``fused=True``) and the
two ops of ``torch.amp.GradScaler`` (unscale with an inf check, scale update).

The Hugging Face Trainer's default optimizer (``adamw_torch_fused``) calls
``_fused_adamw_``: one op updating every parameter, gradient and moment in place. Here it
is one program over the whole parameter list (recorded like any op in fused mode), with
the math of PyTorch's CPU kernel:

- the gradient is divided by ``grad_scale`` when given, and negated with ``maximize``;
- weight decay shrinks the parameter (AdamW) or is added to the gradient (Adam);
- moments: ``m += (g - m) * (1 - beta1)``, ``v = v * beta2 + (1 - beta2) * g * g``;
- ``p -= lr / (1 - beta1**t) * m / (sqrt(v_or_max_v) / sqrt(1 - beta2**t) + eps)``, the
  bias corrections from each parameter's step count ``t`` (already incremented);
- with ``found_inf`` set to 1 nothing changes (a skipped AMP step).

Half-precision tensors are updated in float32 and rounded once, as the CPU kernel does.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import torch

from torch_pjrt.config import settings
from torch_pjrt.device.tensor import argument, replace, write
from torch_pjrt.modes import fused
from torch_pjrt.ops._promote import opmath
from torch_pjrt.ops.registry import implements
from torch_pjrt.runtime import executor

aten = torch.ops.aten


def _make_adam(decoupled, amsgrad, maximize, beta1, beta2, weight_decay, eps, scaled):
    def one(p, g, m, v, vmax, t, lr, scale, inf):
        dtype = opmath(p.dtype)
        p32, g32, m32, v32 = (x.astype(dtype) for x in (p, g, m, v))
        if scaled:
            g32 = g32 / scale.astype(dtype)
        unscaled = g32
        if maximize:
            g32 = -g32
        lr = jnp.asarray(lr, jnp.float64)
        if weight_decay != 0:
            if decoupled:
                p32 = p32 * (1 - lr * weight_decay).astype(dtype)
            else:
                g32 = g32 + p32 * weight_decay
        m32 = m32 + (g32 - m32) * (1 - beta1)
        v32 = v32 * beta2 + g32 * g32 * (1 - beta2)
        t = t.astype(jnp.float64)
        step_size = (lr / (1 - beta1**t)).astype(dtype)
        bc2_sqrt = jnp.sqrt(1 - beta2**t).astype(dtype)
        vmax_in = vmax
        if amsgrad:
            vmax = jnp.maximum(vmax.astype(dtype), v32)
            denom = jnp.sqrt(vmax) / bc2_sqrt + eps
        else:
            denom = jnp.sqrt(v32) / bc2_sqrt + eps
        p32 = p32 - step_size * m32 / denom
        pairs = [(p32, p), (unscaled, g), (m32, m), (v32, v)]
        if amsgrad:
            pairs.append((vmax, vmax_in))
        if inf is not None:  # a skipped step (AMP found an inf): everything as it was
            skip = inf.astype(jnp.float32) == 1
            pairs = [(jnp.where(skip, o.astype(dtype), n), o) for n, o in pairs]
        return [n.astype(o.dtype) for n, o in pairs] + ([] if amsgrad else [None])

    def step(params, grads, avgs, sqs, maxs, steps, lr, scale, inf):
        maxs = maxs if amsgrad else [None] * len(params)
        out = [
            one(p, g, m, v, vm, t, lr, scale, inf)
            for p, g, m, v, vm, t in zip(params, grads, avgs, sqs, maxs, steps)
        ]
        columns = [list(column) for column in zip(*out)]
        return columns[:4] + [columns[4] if amsgrad else []]

    return step


_adam_program = executor.helper("fused adam", _make_adam, maxsize=256)


def _check(name, params, *lists):
    for what, tensors in lists:
        if len(tensors) != len(params):
            raise RuntimeError(
                f"{name}: expected {what} to have {len(params)} tensors (one per parameter), "
                f"got {len(tensors)}"
            )
    for t in params:
        if t.device.type != "pjrt" or t.device != params[0].device:
            raise RuntimeError(
                f"{name}: expected every tensor on {params[0].device}, got one on {t.device}"
            )


def _fused_adam(decoupled: bool):
    name = "_fused_adamw_" if decoupled else "_fused_adam_"

    def kernel(
        self,
        grads,
        exp_avgs,
        exp_avg_sqs,
        max_exp_avg_sqs,
        state_steps,
        *,
        lr,
        beta1,
        beta2,
        weight_decay,
        eps,
        amsgrad,
        maximize,
        grad_scale=None,
        found_inf=None,
    ):
        params = list(self)
        if not params:
            return None
        lists = [("grads", grads), ("exp_avgs", exp_avgs), ("exp_avg_sqs", exp_avg_sqs)]
        lists.append(("state_steps", state_steps))
        if amsgrad:
            lists.append(("max_exp_avg_sqs", max_exp_avg_sqs))
        _check(name, params, *lists)
        get = _getter()

        def arrays(tensors):
            return [get(t) for t in tensors]

        if isinstance(lr, torch.Tensor):
            lr = get(lr) if lr.device.type == "pjrt" else lr.item()
        program = _adam_program(
            decoupled,
            bool(amsgrad),
            bool(maximize),
            float(beta1),
            float(beta2),
            float(weight_decay),
            float(eps),
            grad_scale is not None,
        )
        args = (
            arrays(params),
            arrays(grads),
            arrays(exp_avgs),
            arrays(exp_avg_sqs),
            arrays(max_exp_avg_sqs) if amsgrad else [],
            arrays(state_steps),
            lr,
            None if grad_scale is None else get(grad_scale),
            None if found_inf is None else get(found_inf),
        )
        index = params[0].device.index or 0
        new = fused.apply(program, args, index, name)
        targets = [params, grads if grad_scale is not None else [], exp_avgs, exp_avg_sqs]
        targets.append(max_exp_avg_sqs if amsgrad else [])
        for tensors, values in zip(targets, new):
            for t, value in zip(tensors, values):
                _store(t, value)
        return None

    return kernel


def _store(t: torch.Tensor, value) -> None:
    """Store a program's new value (each goes to one tensor, which owns it)."""
    if not replace(t, value, owned=True):
        write(t, value, owned=True)


def _getter():
    """How the kernels read their tensors: as program arguments (pending in fused mode),
    so their storages keep owning the arrays they update."""
    if settings.mode == "fused":
        return functools.partial(argument, lazy=True)
    return argument


def _make_unscale():
    def unscale(grads, found_inf, inv_scale):
        bad = jnp.zeros((), bool)
        out = []
        for g in grads:
            bad = bad | ~jnp.all(jnp.isfinite(g))
            out.append((g.astype(opmath(g.dtype)) * inv_scale).astype(g.dtype))
        return out, jnp.where(bad, jnp.ones_like(found_inf), found_inf)

    return unscale


_unscale_program = executor.helper("amp unscale", _make_unscale)


@implements(aten._amp_foreach_non_finite_check_and_unscale_.default)
def amp_unscale_(self, found_inf, inv_scale):
    """GradScaler's unscale: every gradient times ``inv_scale``; ``found_inf`` set to 1
    when any gradient holds an inf or a NaN."""
    grads = list(self)
    if not grads:
        return None
    get = _getter()
    index = found_inf.device.index or 0
    args = ([get(g) for g in grads], get(found_inf), get(inv_scale))
    new_grads, new_found = fused.apply(_unscale_program(), args, index, "amp_unscale")
    for g, value in zip(grads, new_grads):
        _store(g, value)
    _store(found_inf, new_found)
    return None


def _make_update_scale(growth: float, backoff: float, interval: int):
    def update(scale, tracker, found_inf):
        found = found_inf.astype(jnp.float32) != 0
        successful = tracker + 1
        grow = successful >= interval
        grown = scale * growth
        grown = jnp.where(jnp.isfinite(grown), grown, scale)
        new_scale = jnp.where(found, scale * backoff, jnp.where(grow, grown, scale))
        zero = jnp.zeros_like(tracker)
        new_tracker = jnp.where(found | grow, zero, successful)
        return new_scale.astype(scale.dtype), new_tracker.astype(tracker.dtype)

    return update


_update_scale_program = executor.helper("amp update scale", _make_update_scale, maxsize=64)


@implements(aten._amp_update_scale_.default)
def amp_update_scale_(
    self, growth_tracker, found_inf, scale_growth_factor, scale_backoff_factor, growth_interval
):
    """GradScaler's scale update: back off after an inf, grow after ``growth_interval``
    clean steps in a row (a grown scale that overflows is not taken)."""
    get = _getter()
    program = _update_scale_program(
        float(scale_growth_factor), float(scale_backoff_factor), int(growth_interval)
    )
    args = (get(self), get(growth_tracker), get(found_inf))
    scale, tracker = fused.apply(program, args, self.device.index or 0, "amp_update_scale")
    _store(self, scale)
    _store(growth_tracker, tracker)
    return self


implements(aten._fused_adamw_.default, aten._fused_adamw_.tensor_lr)(_fused_adam(True))
implements(aten._fused_adam_.default, aten._fused_adam_.tensor_lr)(_fused_adam(False))
