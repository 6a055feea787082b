"""Convolution lowerings: ``convolution`` (every rank, transposed and grouped) and its
backward."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from torch_pjrt.ops._helpers import check, ntuple, vjp
from torch_pjrt.ops._promote import opmath as _opmath
from torch_pjrt.ops._promote import upcast
from torch_pjrt.ops.linalg import matmul_precision
from torch_pjrt.ops.registry import declined, lowers

aten = torch.ops.aten


# --- convolution ---------------------------------------------------------------------


def _conv_numbers(n: int):
    spatial = "DHW"[-n:] if n <= 3 else None
    if spatial is None:
        raise declined(f"{n}-d convolution")
    return ("NC" + spatial, "OI" + spatial, "NC" + spatial)


def _conv(input, weight, stride, padding, dilation, transposed, output_padding, groups, acc=False):
    """The convolution in ``input``'s dtype, or (``acc``) in the dtype it accumulates in
    (float32 for half types, so that a bias is added before the one rounding)."""
    n = weight.ndim - 2
    stride, padding, dilation = ntuple(stride, n), ntuple(padding, n), ntuple(dilation, n)
    output_padding = ntuple(output_padding, n)
    numbers = jax.lax.conv_dimension_numbers(input.shape, weight.shape, _conv_numbers(n))
    common = {
        "dimension_numbers": numbers,
        "feature_group_count": groups,
        "precision": matmul_precision(),
        "preferred_element_type": _opmath(input.dtype),
    }
    if not transposed:
        out = jax.lax.conv_general_dilated(
            input, weight, stride, [(p, p) for p in padding], rhs_dilation=dilation, **common
        )
        return out if acc else out.astype(input.dtype)
    # A transposed convolution is the gradient of a convolution with respect to its
    # input: a stride-1 convolution of the stride-dilated input with the flipped kernel,
    # in/out channels swapped within each group.
    cin, cout_g, *kernel = weight.shape
    w = weight.reshape(groups, cin // groups, cout_g, *kernel).swapaxes(1, 2)
    w = jnp.flip(w.reshape(groups * cout_g, cin // groups, *kernel), tuple(range(2, 2 + n)))
    pads = [
        (d * (k - 1) - p, d * (k - 1) - p + op)
        for k, p, d, op in zip(kernel, padding, dilation, output_padding)
    ]
    numbers = jax.lax.conv_dimension_numbers(input.shape, w.shape, _conv_numbers(n))
    common["dimension_numbers"] = numbers
    out = jax.lax.conv_general_dilated(
        input, w, (1,) * n, pads, lhs_dilation=stride, rhs_dilation=dilation, **common
    )
    return out if acc else out.astype(input.dtype)


def _expanded(values, name: str, n: int) -> tuple:
    values = ntuple(values, n)
    check(
        len(values) == n,
        lambda: (
            f"expected {name} to be a single integer value or a list of {n} values to "
            f"match the convolution dimensions, but got {name}={list(values)}"
        ),
    )
    return values


def _check_convolution(
    input, weight, bias, stride, padding, dilation, transposed, output_padding, groups
):
    """ATen's checks of ``_convolution``'s arguments, in its words (its Meta kernel checks
    fewer, and words them otherwise)."""
    n = weight.ndim - 2
    check(n > 0, "weight should have at least three dimensions")
    check(groups > 0, "non-positive groups is not supported")
    stride, padding = _expanded(stride, "stride", n), _expanded(padding, "padding", n)
    dilation = _expanded(dilation, "dilation", n)
    output_padding = _expanded(output_padding, "output_padding", n)
    check(min(padding) >= 0, "negative padding is not supported")
    check(min(output_padding) >= 0, "negative output_padding is not supported")
    check(min(stride) > 0, "non-positive stride is not supported")
    check(min(dilation) > 0, "dilation should be greater than zero")
    w, x = list(weight.shape), list(input.shape)
    check(
        input.ndim == weight.ndim,
        lambda: (
            f"Expected {weight.ndim}-dimensional input for {weight.ndim}-dimensional "
            f"weight {w}, but got {input.ndim}-dimensional input of size {x} instead"
        ),
    )
    check(
        w[0] >= groups,
        lambda: (
            f"Given groups={groups}, expected weight to be at least {groups} at "
            f"dimension 0, but got weight of size {w} instead"
        ),
    )
    check(
        w[0] % groups == 0,
        lambda: (
            f"Given groups={groups}, expected weight to be divisible by {groups} at "
            f"dimension 0, but got weight of size [{w}] instead"
        ),
    )
    b = None if bias is None else list(bias.shape)
    if transposed:
        check(
            x[1] == w[0],
            lambda: (
                f"Given transposed=1, weight of size {w}, expected input{x} to have "
                f"{w[0]} channels, but got {x[1]} channels instead"
            ),
        )
        check(
            b is None or b == [w[1] * groups],
            lambda: (
                f"Given transposed=1, weight of size {w}, expected bias to be "
                f"1-dimensional with {w[1] * groups} elements, but got bias of size {b} instead"
            ),
        )
        return
    check(
        x[1] == w[1] * groups,
        lambda: (
            f"Given groups={groups}, weight of size {w}, expected input{x} to have "
            f"{w[1] * groups} channels, but got {x[1]} channels instead"
        ),
    )
    check(
        b is None or b == [w[0]],
        lambda: (
            f"Given weight of size {w}, expected bias to be 1-dimensional with {w[0]} "
            f"elements, but got bias of size {b} instead"
        ),
    )
    padded = [size + 2 * p for size, p in zip(x[2:], padding)]
    kernel = [d * (k - 1) + 1 for k, d in zip(w[2:], dilation)]
    check(
        all(p >= k for p, k in zip(padded, kernel)),
        lambda: (
            "Calculated padded input size per channel: ("
            + " x ".join(map(str, padded))
            + "). Kernel size: ("
            + " x ".join(map(str, kernel))
            + "). Kernel size can't be greater than actual input size"
        ),
    )


def _bias_shape(bias, ndim):
    return bias.reshape((1, -1) + (1,) * (ndim - 2))


@lowers(aten.convolution.default, aten.convolution_overrideable.default)
def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    _check_convolution(
        input, weight, bias, stride, padding, dilation, transposed, output_padding, groups
    )
    # (ATen's CPU kernels add the bias to the float32 sums of half types: one rounding)
    args = (stride, padding, dilation, transposed, output_padding, groups)
    out = _conv(input, weight, *args, acc=bias is not None)
    if bias is not None:
        out = (out + upcast(_bias_shape(bias, out.ndim))).astype(input.dtype)
    return out


@lowers(aten.convolution_backward.default, aten.convolution_backward_overrideable.default)
def convolution_backward(
    grad_output,
    input,
    weight,
    bias_sizes=None,
    stride=(1,),
    padding=(0,),
    dilation=(1,),
    transposed=False,
    output_padding=(0,),
    groups=1,
    output_mask=(True, True, True),
):
    def conv(x, w):
        return _conv(x, w, stride, padding, dilation, transposed, output_padding, groups)

    grad_input, grad_weight = vjp(conv, (input, weight), grad_output, output_mask[:2])
    grad_bias = None
    if output_mask[2]:
        dims = (0,) + tuple(range(2, grad_output.ndim))
        grad_bias = jnp.sum(upcast(grad_output), dims).astype(grad_output.dtype)
    return grad_input, grad_weight, grad_bias
