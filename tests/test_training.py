"""Training on pjrt matches CPU: 20 steps, same initial weights, same data."""

from __future__ import annotations

import copy

import pytest
import torch

import torch_pjrt  # noqa: F401
from tests.models import CNN, MODELS, TinyTransformer

OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-3),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.01),
}
STEPS = 20


def _to(batch, device):
    return tuple(t.to(device) for t in batch)


def _train(model, optimizer_name, device, steps=STEPS):
    model = model.to(device)
    optimizer = OPTIMIZERS[optimizer_name](model.parameters())
    g = torch.Generator().manual_seed(1)
    batches = [_to(model.batch(g), device) for _ in range(2)]
    losses = []
    for step in range(steps):
        batch = batches[step % 2]
        optimizer.zero_grad()
        loss = model.loss(batch)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, model


@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_training_matches_cpu(model_name, optimizer_name):
    torch.manual_seed(0)
    reference = MODELS[model_name]()
    candidate = copy.deepcopy(reference)
    cpu_losses, cpu_model = _train(reference, optimizer_name, "cpu")
    pjrt_losses, pjrt_model = _train(candidate, optimizer_name, "pjrt")
    torch.testing.assert_close(
        torch.tensor(pjrt_losses), torch.tensor(cpu_losses), rtol=1e-4, atol=1e-6
    )
    assert cpu_losses[-2] < cpu_losses[0]  # it really trained (same batch, 20 steps on)
    for (name, a), b in zip(cpu_model.state_dict().items(), pjrt_model.state_dict().values()):
        assert b.device.type == "pjrt", name
        # NOTE: Adam divides by sqrt(v): a parameter whose true gradient is zero (the key
        # bias of attention, say) moves by +-lr on rounding noise, differently on each
        # backend; its weights are compared through the losses only.
        if optimizer_name == "sgd":
            torch.testing.assert_close(b.cpu(), a, rtol=1e-3, atol=1e-4, msg=name)


@pytest.mark.parametrize("model_cls", [CNN, TinyTransformer])
def test_dropout_trains_and_is_reproducible(model_cls):
    def run():
        torch.manual_seed(0)
        model = model_cls(dropout=0.3)
        return _train(model, "adam", "pjrt", steps=5)[0]

    first, second = run(), run()
    assert first == second  # torch.manual_seed seeds pjrt dropout
    assert all(torch.isfinite(torch.tensor(first)))


# --- fused optimizer steps (torch.optim.Adam/AdamW(fused=True): the HF Trainer default) ---

FUSED_OPTIONS = {
    "plain": {},
    "amsgrad": {"amsgrad": True},
    "maximize": {"maximize": True},
    "weight_decay": {"weight_decay": 0.1},
    "tensor_lr": {"lr": torch.tensor(0.02)},
}


def _fused_run(device, cls, options, dtype=torch.float32):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2)).to(device, dtype)
    options = {"lr": 0.02, **options}
    optimizer = cls(model.parameters(), fused=True, **options)
    for i in range(4):
        x = torch.randn(5, 4, generator=torch.Generator().manual_seed(i)).to(device, dtype)
        model(x).pow(2).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    moments = [[s[k].cpu() for k in ("exp_avg", "exp_avg_sq")] for s in optimizer.state.values()]
    return [p.detach().cpu() for p in model.parameters()], moments


@pytest.mark.parametrize("mode", ["eager", "fused"])
@pytest.mark.parametrize("option", sorted(FUSED_OPTIONS))
@pytest.mark.parametrize("cls", [torch.optim.Adam, torch.optim.AdamW], ids=lambda c: c.__name__)
def test_fused_adam_matches_cpu(cls, option, mode):
    """``_fused_adam(w)_`` runs on pjrt (not the CPU fallback) and updates parameters and
    moments as CPU PyTorch's fused kernel does."""
    ref_params, ref_moments = _fused_run("cpu", cls, FUSED_OPTIONS[option])
    torch_pjrt.metrics.reset()
    with torch_pjrt.mode(mode), torch_pjrt.config(fallback="error"):
        params, moments = _fused_run("pjrt", cls, FUSED_OPTIONS[option])
    assert not torch_pjrt.metrics.as_dict()["fallbacks"]
    for a, b in zip(params, ref_params):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(moments, ref_moments):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_fused_adamw_in_bfloat16_and_with_amp_scale():
    ref, _ = _fused_run("cpu", torch.optim.AdamW, {}, torch.bfloat16)
    got, _ = _fused_run("pjrt", torch.optim.AdamW, {}, torch.bfloat16)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b)  # bfloat16 tolerance: one rounding each

    def step(device, found_inf):
        p = torch.ones(3, device=device)
        p.grad = torch.full((3,), 8.0, device=device)
        zeros = [torch.zeros(3, device=device) for _ in range(2)]
        torch._fused_adamw_(
            [p], [p.grad], [zeros[0]], [zeros[1]], [], [torch.ones((), device=device)],
            lr=0.1, beta1=0.9, beta2=0.999, weight_decay=0.0, eps=1e-8, amsgrad=False,
            maximize=False, grad_scale=torch.tensor(4.0, device=device),
            found_inf=torch.tensor(found_inf, device=device),
        )  # fmt: skip
        return p.cpu(), p.grad.cpu(), zeros[0].cpu()

    for found_inf in (0.0, 1.0):  # 1: AMP found an inf, the step is skipped
        for a, b in zip(step("pjrt", found_inf), step("cpu", found_inf)):
            torch.testing.assert_close(a, b)


def test_fallback_writes_back_tensor_lists():
    """An op with no lowering that updates tensor lists in place (run on the CPU) writes
    every element back: `_foreach_` ops' fallback used to drop list updates silently."""
    xs = [torch.ones(3, device="pjrt"), torch.ones(2, device="pjrt")]
    lib = torch.library.Library("pjrttest_lists", "DEF")
    lib.define("bump_(Tensor(a!)[] xs) -> ()")

    def bump_cpu(xs):
        for x in xs:
            x.add_(1)

    lib.impl("bump_", bump_cpu, "CPU")
    with pytest.warns(UserWarning, match="no pjrt lowering"):
        torch.ops.pjrttest_lists.bump_(xs)
    assert [x.cpu().tolist() for x in xs] == [[2.0] * 3, [2.0] * 2]


@pytest.mark.parametrize("mode", ["eager", "fused"])
def test_grad_scaler_matches_cpu(mode):
    """torch.amp.GradScaler's two ops run on pjrt: unscale with the inf check, and the
    scale update (backoff after an inf step, growth after growth_interval clean steps)."""

    def run(device):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler(device, init_scale=2.0**8, growth_interval=2)
        scales = []
        for i in range(6):
            x = torch.randn(3, 4, generator=torch.Generator().manual_seed(i)).to(device)
            if i == 2:
                x = x * float("inf")  # an overflowing step: skipped, scale backs off
            scaler.scale(model(x).pow(2).sum()).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            scales.append(scaler.get_scale())
        return scales, [p.detach().cpu() for p in model.parameters()]

    ref_scales, ref_params = run("cpu")
    torch_pjrt.metrics.reset()
    with torch_pjrt.mode(mode), torch_pjrt.config(fallback="error"):
        scales, params = run("pjrt")
    assert scales == ref_scales and len(set(scales)) > 1
    for a, b in zip(params, ref_params):
        torch.testing.assert_close(a, b)
