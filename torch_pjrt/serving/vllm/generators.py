"""Seeded requests on pjrt: a generator with the seed and offset vLLM relies on.

vLLM gives each request with ``SamplingParams(seed=...)`` its own
``torch.Generator(device=...)``, draws that request's sampling noise with
``q[i].exponential_(generator=g)``, and when a step's token is thrown away (a prefill
chunk) rewinds it with ``g.set_offset(g.get_offset() - 4)``, counting on CUDA's
Philox generator. pjrt's own ``torch.Generator`` moves its offset on by one a random op
(docs/device_api.md), not by Philox's 4, so here a request gets a :class:`PjrtGenerator`:
a (seed, offset) pair that counts as vLLM does. A draw runs on the device with the
device RNG set to that pair for the one op (the pjrt RNG takes
``fold_in(key(seed), offset)``), then the pair advances by 4, so a rewind of 4 replays
the same noise, as on CUDA.
"""

from __future__ import annotations

import contextlib

import torch

from torch_pjrt.device import random as pjrt_random

_RealGenerator = torch.Generator
_MASK = (1 << 64) - 1
_DRAW = 4  # the offset one draw takes, as vLLM counts it


class PjrtGenerator:
    """The part of ``torch.Generator`` vLLM uses, for one request on a pjrt device."""

    def __init__(self, device):
        self.device = torch.device(device)
        self._seed = pjrt_random.DEFAULT_SEED
        self._offset = 0

    def manual_seed(self, seed: int) -> PjrtGenerator:
        self._seed = int(seed) & _MASK
        self._offset = 0
        return self

    def initial_seed(self) -> int:
        return self._seed

    def get_offset(self) -> int:
        return self._offset

    def set_offset(self, offset: int) -> PjrtGenerator:
        self._offset = int(offset)
        return self

    def exponential_(self, out: torch.Tensor) -> torch.Tensor:
        """Fill the pjrt tensor ``out`` with Exp(1) noise from this generator's state."""
        index = out.device.index or 0
        saved = pjrt_random.get_rng_state(index)
        pjrt_random.manual_seed(self._seed, index)
        pjrt_random.set_offset(index, self._offset)
        try:
            out.exponential_()
        finally:
            pjrt_random.set_rng_state(saved, index)
        self._offset += _DRAW
        return out


class _GeneratorMeta(type):
    # isinstance(x, torch.Generator) must keep its meaning while the stand-in is in place
    def __instancecheck__(cls, obj):
        return isinstance(obj, _RealGenerator | PjrtGenerator)

    def __call__(cls, device=None):
        if device is not None and torch.device(device).type == "pjrt":
            return PjrtGenerator(device)
        return _RealGenerator() if device is None else _RealGenerator(device=device)


class _Generator(metaclass=_GeneratorMeta):
    """Stands in for torch.Generator: a pjrt device gives a PjrtGenerator."""


@contextlib.contextmanager
def pjrt_generators():
    """``torch.Generator(device="pjrt...")`` makes a PjrtGenerator inside the block."""
    torch.Generator = _Generator
    try:
        yield
    finally:
        torch.Generator = _RealGenerator


def _random_sample(probs, generators, use_fp64_gumbel=False):
    # vLLM's random_sample, drawing the seeded rows with their PjrtGenerators
    from vllm.v1.sample.ops import topk_topp_sampler as sampler

    q = sampler.empty_exponential_noise_like(probs, use_fp64_gumbel)
    if len(generators) != probs.shape[0]:
        q.exponential_()
    for i, generator in generators.items():
        if isinstance(generator, PjrtGenerator):
            generator.exponential_(q[i])
        else:
            q[i].exponential_(generator=generator)
    return sampler.sample_with_exponential_noise(probs, q)


def install() -> None:
    """Route vLLM's sampling noise through :func:`_random_sample` (idempotent)."""
    from vllm.v1.sample.ops import topk_topp_sampler as sampler

    sampler.random_sample = _random_sample
