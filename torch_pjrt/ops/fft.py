"""FFT lowerings: ATen's three primitive transforms (``torch.fft`` decomposes into them)."""

from __future__ import annotations

import math

import jax.numpy as jnp
import torch

from torch_pjrt.ops.registry import lowers

aten = torch.ops.aten


def _scale(x, n: int, normalization: int):
    """ATen's ``normalization``: 0 none, 1 by 1/sqrt(n), 2 by 1/n."""
    if normalization == 1:
        return x * (1 / math.sqrt(n))
    if normalization == 2:
        return x * (1 / n)
    return x


def _complex(x):
    return x if jnp.iscomplexobj(x) else x.astype(jnp.result_type(x.dtype, jnp.complex64))


@lowers(aten._fft_r2c.default)
def _fft_r2c(self, dim, normalization, onesided):
    axes = tuple(dim)
    n = math.prod(self.shape[d] for d in axes)
    if onesided:
        out = jnp.fft.rfftn(self, axes=axes)
    else:
        out = jnp.fft.fftn(_complex(self), axes=axes)
    return _scale(out, n, normalization)


@lowers(aten._fft_c2c.default)
def _fft_c2c(self, dim, normalization, forward):
    axes = tuple(dim)
    if not axes:
        return self
    n = math.prod(self.shape[d] for d in axes)
    # unscaled transforms both ways; ATen's normalization is applied once, below
    if forward:
        out = jnp.fft.fftn(self, axes=axes, norm="backward")
    else:
        out = jnp.fft.ifftn(self, axes=axes, norm="forward")
    return _scale(out, n, normalization)


@lowers(aten._fft_c2r.default)
def _fft_c2r(self, dim, normalization, last_dim_size):
    axes = tuple(dim)
    sizes = [self.shape[d] for d in axes[:-1]] + [last_dim_size]
    out = jnp.fft.irfftn(self, s=sizes, axes=axes, norm="forward")
    return _scale(out, math.prod(sizes), normalization)
