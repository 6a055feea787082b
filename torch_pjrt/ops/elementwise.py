"""Elementwise lowerings: arithmetic, comparison, logic, unary math."""

from __future__ import annotations

import jax.numpy as jnp
import torch

from torch_pjrt.ops._promote import KIND, promote
from torch_pjrt.ops.registry import lowers

aten = torch.ops.aten


@lowers(aten.add.Tensor, aten.add.Scalar)
@promote(n=2)
def add(self, other, alpha=1):
    if not (isinstance(alpha, (int, float)) and alpha == 1):
        other = other * jnp.asarray(alpha, other.dtype)
    return self + other


@lowers(aten.sub.Tensor, aten.sub.Scalar)
@promote(n=2)
def sub(self, other, alpha=1):
    if not (isinstance(alpha, (int, float)) and alpha == 1):
        other = other * jnp.asarray(alpha, other.dtype)
    return self - other


@lowers(aten.mul.Tensor, aten.mul.Scalar)
@promote()
def mul(self, other):
    return self * other


@lowers(aten.fill.Scalar)
def fill(self, value):
    return jnp.full(self.shape, value, self.dtype)


@lowers(aten.zero.default)
def zero(self):
    return jnp.zeros(self.shape, self.dtype)
