"""Saving and loading pjrt tensors: bit-exact round trips."""

from __future__ import annotations

import io

import pytest
import torch

import torch_pjrt  # noqa: F401

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.bool]


def _sample(dtype):
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(0)) * 1e3
    return x.to(dtype)


def _bits_equal(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    if a.dtype.is_floating_point:
        width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        assert torch.equal(a.cpu().view(width), b.cpu().view(width))
    else:
        assert torch.equal(a.cpu(), b.cpu())


def _round_trip(obj, **load_kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kwargs)


@pytest.mark.parametrize("dtype", DTYPES)
def test_save_pjrt_tensor_load_on_pjrt_and_cpu(dtype):
    x = _sample(dtype)
    on_device = x.to("pjrt")
    back = _round_trip(on_device)
    assert back.device == torch.device("pjrt:0")
    _bits_equal(back, x)
    _bits_equal(_round_trip(on_device, map_location="cpu"), x)


def test_views_share_storage_after_load():
    base = torch.arange(12.0).to("pjrt")
    a, b = base[:6].view(2, 3), base[3:]
    la, lb = _round_trip((a, b), map_location="pjrt")
    la[1, 0] = -1.0  # element 3 of the shared storage
    assert lb[0].item() == -1.0


def test_state_dict_round_trips():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).to("pjrt")
    state = _round_trip(model.state_dict(), map_location="pjrt")
    for key, value in model.state_dict().items():
        assert state[key].device.type == "pjrt"
        _bits_equal(state[key], value)
    cpu_state = _round_trip(model.state_dict(), map_location="cpu")
    assert all(v.device.type == "cpu" for v in cpu_state.values())


def test_cpu_checkpoint_into_pjrt_model():
    source = torch.nn.Linear(5, 2)
    target = torch.nn.Linear(5, 2).to("pjrt")
    target.load_state_dict(_round_trip(source.state_dict()))
    _bits_equal(target.weight, source.weight.detach())


@pytest.mark.devices(2)
def test_checkpoint_onto_a_named_device():
    source = torch.nn.Linear(5, 2)
    loaded = _round_trip(source.state_dict(), map_location="pjrt:1")
    assert loaded["weight"].device == torch.device("pjrt:1")
    _bits_equal(loaded["bias"], source.bias.detach())


def test_safetensors_round_trip(tmp_path):
    from safetensors.torch import load_file, save_file

    tensors = {f"t{i}": _sample(d).to("pjrt") for i, d in enumerate(DTYPES)}
    path = tmp_path / "weights.safetensors"
    save_file(tensors, str(path))
    # NOTE: safetensors' own device parser rejects device="pjrt" (docs/semantics.md):
    # load on the CPU, then move.
    loaded = {k: v.to("pjrt") for k, v in load_file(str(path)).items()}
    for key, value in tensors.items():
        assert loaded[key].device.type == "pjrt"
        _bits_equal(loaded[key], value)


def test_safetensors_model_round_trip(tmp_path):
    from safetensors.torch import load_model, save_model

    source = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2)).to("pjrt")
    path = tmp_path / "model.safetensors"
    save_model(source, str(path))
    target = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2)).to("pjrt")
    load_model(target, str(path))
    for a, b in zip(source.parameters(), target.parameters()):
        assert b.device.type == "pjrt"
        _bits_equal(a.detach(), b.detach())
