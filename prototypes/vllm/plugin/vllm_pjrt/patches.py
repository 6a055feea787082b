"""Workarounds for torch_pjrt gaps that vLLM's shared code runs into.

Seeded requests (SamplingParams(seed=...)): vLLM makes one
torch.Generator(device=<device>) per request
(vllm/v1/worker/gpu_model_runner.py, GPUModelRunner._update_states) and draws
the request's exponential noise with q[i].exponential_(generator=g)
(vllm/v1/sample/ops/topk_topp_sampler.py, random_sample). torch_pjrt has no
device generator ("You should register `PrivateUse1HooksInterface`by
`RegisterPrivateUse1HooksInterface` and implement `getNewGenerator` at the
same time for PrivateUse1.") and refuses CPU generators for pjrt tensors.
So: seeded requests get CPU generators, and their noise rows are drawn on the
host and copied to the device (one small H2D copy per seeded request a step).
"""

import contextlib

import torch

_RealGenerator = torch.Generator


class _GeneratorMeta(type):
    # isinstance(x, torch.Generator) must keep working while the shim is
    # installed (torch_pjrt's argument checks use it).
    def __instancecheck__(cls, obj):
        return isinstance(obj, _RealGenerator)

    def __call__(cls, device=None):
        if device is not None and torch.device(device).type == "pjrt":
            device = "cpu"
        return _RealGenerator() if device is None else _RealGenerator(device=device)


class _generator_factory(metaclass=_GeneratorMeta):
    """Stands in for torch.Generator: a pjrt device gives a CPU generator."""


@contextlib.contextmanager
def cpu_generators_for_pjrt():
    torch.Generator = _generator_factory
    try:
        yield
    finally:
        torch.Generator = _RealGenerator


def _random_sample(probs, generators, use_fp64_gumbel=False):
    from vllm.v1.sample.ops import topk_topp_sampler as tts

    q = tts.empty_exponential_noise_like(probs, use_fp64_gumbel)
    if len(generators) != probs.shape[0]:
        q.exponential_()
    for i, generator in generators.items():
        if generator.device.type == "cpu" and q.device.type != "cpu":
            row = torch.empty(q.shape[1:], dtype=q.dtype).exponential_(generator=generator)
            q[i] = row.to(q.device)
        else:
            q[i].exponential_(generator=generator)
    return tts.sample_with_exponential_noise(probs, q)


_applied = False


def apply() -> None:
    global _applied
    if _applied:
        return
    _applied = True
    from vllm.v1.sample.ops import topk_topp_sampler as tts

    tts.random_sample = _random_sample
