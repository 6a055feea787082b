"""Device RNG state: a (seed, offset) pair per device; every random op takes a fresh key.

A random lowering gets ``jax.random.fold_in(key(seed), offset)`` and the offset then
advances, so no two calls reuse a key and ``torch.manual_seed`` replays a run.
"""

from __future__ import annotations

import struct

import torch

# the current device is the device guard's (per thread); the RNG state is kept per device
from torch_pjrt.device.guard import current_device, set_current_device  # noqa: F401

__all__ = ["current_device", "get_rng_state", "initial_seed", "manual_seed", "set_rng_state"]

DEFAULT_SEED = 67280421310721

_default_seed = [DEFAULT_SEED]
_seeds: dict[int, int] = {}
_offsets: dict[int, int] = {}


def index_of(device=None) -> int:
    """The index a ``torch.pjrt`` function's ``device`` argument names (an int, a
    ``torch.device`` or a string; None: the current device)."""
    if device is None:
        return current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "pjrt":
        raise ValueError(f"Expected a pjrt device, got {device}")
    return device.index if device.index is not None else current_device()


def manual_seed(seed: int, index: int) -> None:
    _seeds[index] = int(seed) & 0xFFFF_FFFF_FFFF_FFFF
    _offsets[index] = 0


def manual_seed_all(seed: int) -> None:
    _default_seed[0] = int(seed) & 0xFFFF_FFFF_FFFF_FFFF
    _seeds.clear()
    _offsets.clear()


def initial_seed(index: int) -> int:
    return _seeds.get(index, _default_seed[0])


def _signed(seed: int) -> int:
    """jax.random.key takes a signed 64-bit seed."""
    return seed - (1 << 64) if seed >= 1 << 63 else seed


def next_key_parts(index: int) -> tuple[int, int]:
    """The (seed, offset) of the next random op on a device, advancing the offset."""
    offset = _offsets.get(index, 0)
    _offsets[index] = offset + 1
    return _signed(initial_seed(index)), offset


def generator_key_parts(generator: torch.Generator) -> tuple[int, int]:
    """The (seed, offset) of the next random op drawing from a pjrt ``torch.Generator``
    (``generator=``; the C++ extension makes them: device/guard.cpp), advancing its
    offset: the generator's own stream, apart from the device's."""
    offset = generator.get_offset()
    generator.set_offset(offset + 1)
    return _signed(generator.initial_seed()), offset


def offset(index: int) -> int:
    """How many random ops device ``index`` has run since it was seeded."""
    return _offsets.get(index, 0)


def set_offset(index: int, value: int) -> None:
    _offsets[index] = value


def advance(index: int, n: int) -> tuple[int, int]:
    """(seed, offset) for ``n`` random ops run together (a graph replay), advancing the
    offset past them: each gets offset + its place among them."""
    seed, start = next_key_parts(index)
    _offsets[index] = start + n
    return seed, start


def get_rng_state(index: int) -> torch.Tensor:
    raw = struct.pack("<QQ", initial_seed(index), _offsets.get(index, 0))
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).clone()


def set_rng_state(state: torch.Tensor, index: int) -> None:
    raw = bytes(state.cpu().to(torch.uint8).tolist())
    if len(raw) != 16:
        raise RuntimeError(
            f"pjrt RNG state must be a uint8 tensor of 16 bytes (from get_rng_state), "
            f"got {len(raw)} bytes"
        )
    seed, offset = struct.unpack("<QQ", raw)
    _seeds[index] = seed
    _offsets[index] = offset
