"""Convolution lowerings: ``convolution`` (every rank, transposed and grouped) and its
backward."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from torch_pjrt.ops._helpers import ntuple, vjp
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


def _conv(input, weight, stride, padding, dilation, transposed, output_padding, groups):
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
        return out.astype(input.dtype)
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
    return out.astype(input.dtype)


def _bias_shape(bias, ndim):
    return bias.reshape((1, -1) + (1,) * (ndim - 2))


@lowers(aten.convolution.default, aten.convolution_overrideable.default)
def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    out = _conv(input, weight, stride, padding, dilation, transposed, output_padding, groups)
    if bias is not None:
        out = (upcast(out) + _bias_shape(bias, out.ndim)).astype(out.dtype)
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
