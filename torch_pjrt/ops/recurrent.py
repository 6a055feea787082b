"""Fused recurrent cells: the LSTM and GRU cell ops that ``nn.LSTM`` and ``nn.GRU`` call on
non-CPU devices, with their backward ops."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from torch_pjrt.ops._promote import opmath as _opmath
from torch_pjrt.ops._promote import upcast
from torch_pjrt.ops.registry import lowers

aten = torch.ops.aten


# --- fused recurrent cells (nn.LSTM / nn.GRU use them on non-CPU devices) -------------


def _gates(input_gates, hidden_gates, input_bias, hidden_bias):
    gates = upcast(input_gates) + upcast(hidden_gates)
    if input_bias is not None:
        gates = gates + upcast(input_bias)
    if hidden_bias is not None:
        gates = gates + upcast(hidden_bias)
    return gates


@lowers(aten._thnn_fused_lstm_cell.default)
def _thnn_fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    gates = _gates(input_gates, hidden_gates, input_bias, hidden_bias)
    i, f, g, o = jnp.split(gates, 4, axis=-1)
    i, f, g, o = jax.nn.sigmoid(i), jax.nn.sigmoid(f), jnp.tanh(g), jax.nn.sigmoid(o)
    cy = f * upcast(cx) + i * g
    hy = o * jnp.tanh(cy)
    # the workspace holds the activated gates, as the CUDA kernel's does
    workspace = jnp.concatenate([i, f, g, o], axis=-1)
    dtype = input_gates.dtype
    return hy.astype(dtype), cy.astype(dtype), workspace.astype(dtype)


def _zeros_if_none(grad, like):
    return jnp.zeros(like.shape, _opmath(like.dtype)) if grad is None else upcast(grad)


@lowers(aten._thnn_fused_lstm_cell_backward_impl.default)
def _thnn_fused_lstm_cell_backward_impl(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    i, f, g, o = jnp.split(upcast(workspace), 4, axis=-1)
    grad_hy, grad_cy = _zeros_if_none(grad_hy, cx), _zeros_if_none(grad_cy, cx)
    tanh_cy = jnp.tanh(upcast(cy))
    grad_c = grad_cy + grad_hy * o * (1 - tanh_cy * tanh_cy)
    grad_gates = jnp.concatenate(
        [
            grad_c * g * i * (1 - i),
            grad_c * upcast(cx) * f * (1 - f),
            grad_c * i * (1 - g * g),
            grad_hy * tanh_cy * o * (1 - o),
        ],
        axis=-1,
    )
    dtype = workspace.dtype
    grad_bias = None
    if has_bias:
        grad_bias = jnp.sum(grad_gates.reshape(-1, grad_gates.shape[-1]), 0).astype(dtype)
    return grad_gates.astype(dtype), (grad_c * f).astype(cx.dtype), grad_bias


@lowers(aten._thnn_fused_gru_cell.default)
def _thnn_fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    ig, hg = upcast(input_gates), upcast(hidden_gates)
    if input_bias is not None:
        ig = ig + upcast(input_bias)
    if hidden_bias is not None:
        hg = hg + upcast(hidden_bias)
    ir, ii, in_ = jnp.split(ig, 3, axis=-1)
    hr, hi, hn = jnp.split(hg, 3, axis=-1)
    r = jax.nn.sigmoid(ir + hr)
    z = jax.nn.sigmoid(ii + hi)
    n = jnp.tanh(in_ + r * hn)
    h = upcast(hx)
    hy = n + z * (h - n)
    workspace = jnp.concatenate([r, z, n, h, hn], axis=-1)
    dtype = input_gates.dtype
    return hy.astype(dtype), workspace.astype(dtype)


@lowers(aten._thnn_fused_gru_cell_backward.default)
def _thnn_fused_gru_cell_backward(grad_hy, workspace, has_bias):
    r, z, n, h, hn = jnp.split(upcast(workspace), 5, axis=-1)
    g = upcast(grad_hy)
    grad_n = g * (1 - z) * (1 - n * n)
    grad_r = grad_n * hn * r * (1 - r)
    grad_z = g * (h - n) * z * (1 - z)
    grad_input = jnp.concatenate([grad_r, grad_z, grad_n], axis=-1)
    grad_hidden = jnp.concatenate([grad_r, grad_z, grad_n * r], axis=-1)
    dtype = workspace.dtype
    grad_ib = grad_hb = None
    if has_bias:
        grad_ib = jnp.sum(grad_input.reshape(-1, grad_input.shape[-1]), 0).astype(dtype)
        grad_hb = jnp.sum(grad_hidden.reshape(-1, grad_hidden.shape[-1]), 0).astype(dtype)
    return (
        grad_input.astype(dtype),
        grad_hidden.astype(dtype),
        (g * z).astype(dtype),
        grad_ib,
        grad_hb,
    )
