"""Hugging Face model families on pjrt against CPU PyTorch: forward, gradients, AdamW step.

Every comparison is ``torch.testing.assert_close`` with rtol=1e-4 and atol=1e-4 times the
tensor's largest magnitude (float32).
The models and batches are described in ``tests/hf_families.py``; expected failures are in
``tests/expectations.py`` (``XFAIL_HF_FAMILIES``).
"""

from __future__ import annotations

import copy

import pytest
import torch

import torch_pjrt
from tests import expectations, hf_families

RTOL = 1e-4


def _params():
    params = []
    for name in hf_families.FAMILIES:
        marks = [] if name in hf_families.FAST else [pytest.mark.slow]
        marks += expectations.marks(expectations.XFAIL_HF_FAMILIES, name)
        params.append(pytest.param(name, marks=marks, id=name))
    return params


def test_xfail_table_names_families():
    unknown = set(expectations.XFAIL_HF_FAMILIES) - set(hf_families.FAMILIES)
    assert not unknown, f"XFAIL_HF_FAMILIES: no such family: {sorted(unknown)}"


def _close(actual, expected, msg):
    # atol scales with the tensor, so a small gradient gets as strict a check as a large
    # one; the floor is for tensors that are zero in exact arithmetic (float32 noise)
    expected = expected.detach()
    atol = RTOL * max(expected.abs().max().item(), 1e-3)
    torch.testing.assert_close(actual.detach().cpu(), expected, rtol=RTOL, atol=atol, msg=msg)


@pytest.mark.parametrize("name", _params())
def test_family_matches_cpu(name):
    cpu = hf_families.build(name)
    dev = copy.deepcopy(cpu).to("pjrt")
    out = {}
    for model, device in ((cpu, "cpu"), (dev, "pjrt")):
        with torch_pjrt.config(fallback="error"):  # every op runs on pjrt
            result = model(**hf_families.batch(name, device))
            result.loss.backward()
        out[device] = result
    output = hf_families.FAMILIES[name].output

    # (a) forward: the main output, the loss, and buffers a train-mode forward updates
    _close(getattr(out["pjrt"], output), getattr(out["cpu"], output), f"{name}: {output}")
    _close(out["pjrt"].loss, out["cpu"].loss, f"{name}: loss")
    for (n, b_dev), b_cpu in zip(dev.named_buffers(), cpu.buffers()):
        if b_cpu.is_floating_point():
            _close(b_dev, b_cpu, f"{name}: buffer {n}")
        else:
            assert torch.equal(b_dev.cpu(), b_cpu), f"{name}: buffer {n}"

    # (b) gradients of the loss, every parameter
    pairs = list(zip(dev.named_parameters(), cpu.parameters()))
    assert pairs
    for (n, p_dev), p_cpu in pairs:
        assert (p_dev.grad is None) == (p_cpu.grad is None), f"{name}: grad of {n}"
        if p_cpu.grad is not None:
            _close(p_dev.grad, p_cpu.grad, f"{name}: grad of {n}")

    # (c) one AdamW step, both sides from the CPU gradients. Adam's first step is
    # lr * g / (|g| + eps): a gradient that is zero in exact arithmetic (an attention key
    # bias, since softmax ignores a shift) comes out as float32 noise of about eps, which
    # the step turns into an update of order lr. (b) has already checked the gradients.
    for (_, p_dev), p_cpu in pairs:
        if p_cpu.grad is not None:
            p_dev.grad.copy_(p_cpu.grad)
    for model in (cpu, dev):
        with torch_pjrt.config(fallback="error"):
            torch.optim.AdamW(model.parameters(), lr=1e-3).step()
    for (n, p_dev), p_cpu in pairs:
        _close(p_dev, p_cpu, f"{name}: {n} after AdamW step")
