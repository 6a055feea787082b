"""PyTorch's contract for an out-of-tree (PrivateUse1) backend, checked on pjrt.

PyTorch states what a complete PrivateUse1 backend supports through its reference
backend, OpenReg, and OpenReg's tests (device, memory, events, streams, RNG, storage,
autocast, autograd, profiler, SDPA, compile, distributed, IPC). ``CONTRACT`` below is our
list of those points, each with the test that checks it on pjrt: most are here, a few
where their feature is tested at length. Points that do not hold yet are expected
failures in tests/expectations.py (``XFAIL_BACKEND_CONTRACT``), each with its reason;
docs/device_api.md lists every point and its status. Every multi-process case runs under
a timeout: none may hang.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

from tests import expectations

ROOT = Path(__file__).resolve().parents[1]

# point -> the test that checks it ("module::test", the module's tests/ file)
CONTRACT = {
    "device module: availability, count, names, properties, init": "test_device_module",
    "current device through torch.accelerator, torch.pjrt.device and torch.device": (
        "test_current_device_everywhere"
    ),
    "streams and events of pjrt:1 are on pjrt:1": "test_streams_and_events_on_a_second_device",
    "autograd on pjrt:1": "test_autograd_on_a_second_device",
    "torch.accelerator.synchronize": "test_accelerator_synchronize",
    "events: record, query, wait, synchronize, elapsed_time": "test_events",
    "streams: distinct ids": "test_stream_ids",
    "streams: ordering through wait_event and wait_stream": "test_stream_ordering",
    "storages: constructors, is_pjrt, .pjrt()": "test_storages",
    "no crash from storage constructors": "test_interop::test_storages_made_by_pytorch",
    "pinned memory, DataLoader(pin_memory=True)": "test_pinned_memory",
    "torch.multiprocessing: a pjrt tensor fails at once in the receiver": (
        "test_sending_a_tensor_to_another_process"
    ),
    "JAX interop and DLPack without copies": "test_interop::test_dlpack",
    "a JAX function inside a training step": (
        "test_interop::test_a_jax_function_inside_a_training_step"
    ),
    "torch.Generator(device='pjrt') for random ops": "test_generator",
    "RNG: seeds, states, offsets": "test_rng_state_and_offsets",
    "init_process_group('pjrt') under torch.multiprocessing.spawn, file:// or tcp://": (
        "test_distributed::test_spawn_with_a_file_init_method"
    ),
    "profiler: pjrt's events, non-negative times": "test_profiler_times",
    "Dynamo's device interface": "test_dynamo_device_interface",
    "SDPA: the overrideable fused path": "test_sdpa_overrideable",
    "autocast: dtypes and messages": "test_autocast",
    "named tensors: as on the CPU": "test_named_tensors",
    "quantized tensors: a clear error": "test_quantized_tensors",
}


def test_every_point_has_its_test():
    for point, where in CONTRACT.items():
        module, _, name = where.rpartition("::")
        path = ROOT / "tests" / f"{module or Path(__file__).stem}.py"
        assert f"def {name}(" in path.read_text(), (point, where)
    unknown = set(expectations.XFAIL_BACKEND_CONTRACT) - set(CONTRACT.values())
    assert not unknown, f"XFAIL_BACKEND_CONTRACT: no such point's test: {sorted(unknown)}"


contract = expectations.expected(expectations.XFAIL_BACKEND_CONTRACT)


# --- the device ---------------------------------------------------------------------------


@contract
def test_device_module():
    torch.pjrt.init()
    assert torch.pjrt.is_initialized() and torch.pjrt.is_available()
    assert torch.pjrt.device_count() == torch.accelerator.device_count() >= 2
    assert torch.accelerator.current_accelerator() == torch.device("pjrt")
    assert isinstance(torch.pjrt.get_device_name(1), str)
    assert torch.pjrt.get_device_properties(1).total_memory > 0


@contract
@pytest.mark.devices(2)
def test_current_device_everywhere():
    assert torch.accelerator.current_device_index() == 0
    torch.accelerator.set_device_index(1)
    try:
        assert torch.pjrt.current_device() == 1
        assert torch.empty(1, device="pjrt").device == torch.device("pjrt", 1)
    finally:
        torch.accelerator.set_device_index(0)
    with torch.accelerator.device_index(1):
        assert torch.accelerator.current_device_index() == 1
    with torch.pjrt.device(1):
        assert torch.ones(1, device="pjrt").device.index == 1
    with torch.device("pjrt:1"):
        assert torch.zeros(2).device == torch.device("pjrt", 1)
    assert torch.accelerator.current_device_index() == 0


@contract
@pytest.mark.devices(2)
def test_streams_and_events_on_a_second_device():
    stream = torch.Stream(device="pjrt:1")
    assert stream.device == torch.device("pjrt", 1) and stream.device_index == 1
    event = torch.Event(device="pjrt:1")
    event.record(stream)
    assert event.device == torch.device("pjrt", 1)
    assert torch.pjrt.Stream(device=1).device_index == 1


@contract
@pytest.mark.devices(2)
def test_autograd_on_a_second_device():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    x = torch.randn(3, 4)
    model(x).sum().backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.to("pjrt:1")(x.to("pjrt:1")).sum().backward()
    for p, w in zip(model.parameters(), want):
        assert p.grad.device == torch.device("pjrt", 1)
        torch.testing.assert_close(p.grad.cpu(), w, rtol=1e-5, atol=1e-6)


@contract
def test_accelerator_synchronize():
    x = torch.randn(64, 64, device="pjrt")
    y = x @ x
    torch.accelerator.synchronize()
    torch.testing.assert_close(y.cpu(), x.cpu() @ x.cpu(), rtol=1e-5, atol=1e-4)


# --- events and streams -------------------------------------------------------------------


@contract
def test_events():
    start, end = (torch.Event(device="pjrt", enable_timing=True) for _ in range(2))
    start.record()
    x = torch.randn(128, 128, device="pjrt")
    y = (x @ x).sum()
    end.record()
    end.synchronize()
    assert start.query() and end.query()
    assert end.elapsed_time(start) <= 0 <= start.elapsed_time(end)
    plain = torch.Event(device="pjrt")
    plain.record()
    plain.wait()
    plain.synchronize()
    assert plain.query() and plain.event_id != 0 and plain.event_id != start.event_id
    assert torch.isfinite(y).item()


@contract
def test_stream_ids():
    first, second = torch.Stream(device="pjrt"), torch.Stream(device="pjrt")
    assert first.stream_id != second.stream_id
    assert torch.accelerator.current_stream().stream_id not in (first.stream_id, second.stream_id)


@contract
def test_stream_ordering():
    side = torch.pjrt.Stream()
    x = torch.ones(256, device="pjrt")
    done = torch.pjrt.Event()
    with torch.pjrt.stream(side):
        y = x * 2
        done.record(side)
    torch.pjrt.current_stream().wait_event(done)
    torch.pjrt.current_stream().wait_stream(side)
    assert torch.equal((y + 1).cpu(), torch.full((256,), 3.0))


# --- storages, pinning, processes ---------------------------------------------------------


@contract
def test_storages():
    storage = torch.arange(4.0, device="pjrt").untyped_storage()
    assert storage.is_pjrt and storage.device.type == "pjrt"
    assert not torch.ones(1).untyped_storage().is_pjrt
    moved = torch.arange(3.0).untyped_storage().pjrt()
    assert moved.is_pjrt and torch.equal(
        torch.tensor([], device="pjrt").set_(moved).cpu(), torch.arange(3.0)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # (TypedStorage is deprecated)
        typed = torch.TypedStorage([1.0, 2.0], dtype=torch.float32).pjrt()
        assert typed.is_pjrt and typed.tolist() == [1.0, 2.0]
    made = torch.UntypedStorage(8, device="pjrt")  # PyTorch's own constructor
    assert made.is_pjrt and made.nbytes() == 8


@contract
def test_pinned_memory():
    pinned = torch.arange(4.0).pin_memory()
    assert pinned.is_pinned() and pinned.pin_memory() is pinned
    dataset = torch.utils.data.TensorDataset(torch.arange(8.0))
    batches = list(torch.utils.data.DataLoader(dataset, batch_size=4, pin_memory=True))
    assert [b[0].is_pinned() for b in batches] == [True, True]
    assert torch.equal(batches[1][0].to("pjrt", non_blocking=True).cpu(), torch.arange(4.0, 8.0))


_SENDER = textwrap.dedent(
    """
    import queue
    import torch, torch_pjrt
    import torch.multiprocessing as mp


    def receive(q, answers):
        try:
            q.get(timeout=60)
            answers.put("received")
        except queue.Empty:
            answers.put("hung")
        except Exception as e:
            answers.put(f"{type(e).__name__}: {e}")


    if __name__ == "__main__":
        ctx = mp.get_context("spawn")
        q, answers = ctx.Queue(), ctx.Queue()
        p = ctx.Process(target=receive, args=(q, answers))
        p.start()
        q.put(torch.arange(3.0, device="pjrt"))
        print("ANSWER", answers.get(timeout=90))
        p.join(30)
    """
)


@contract
def test_sending_a_tensor_to_another_process(tmp_path):
    script = tmp_path / "send.py"
    script.write_text(_SENDER)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=240, cwd=ROOT
    )
    answer = [ln for ln in done.stdout.splitlines() if ln.startswith("ANSWER")]
    assert answer, done.stdout[-2000:] + done.stderr[-4000:]
    assert (
        "RuntimeError: torch_pjrt: a pjrt tensor cannot be sent to another process" in (answer[0])
    ), answer


# --- the rest -----------------------------------------------------------------------------


@contract
def test_generator():
    generator = torch.Generator(device="pjrt")
    generator.manual_seed(7)
    first = torch.randn(4, device="pjrt", generator=generator)
    generator.manual_seed(7)
    assert torch.equal(first.cpu(), torch.randn(4, device="pjrt", generator=generator).cpu())


@contract
def test_rng_state_and_offsets():
    torch.pjrt.manual_seed_all(2024)
    assert torch.pjrt.initial_seed() == 2024 and torch.pjrt.get_offset() == 0
    state = torch.pjrt.get_rng_state(0)
    first = torch.rand(5, device="pjrt")
    assert torch.pjrt.get_offset() == 1
    torch.pjrt.set_rng_state(state, 0)
    assert torch.equal(first.cpu(), torch.rand(5, device="pjrt").cpu())
    second = torch.rand(5, device="pjrt")
    torch.pjrt.set_offset(1)
    assert torch.equal(second.cpu(), torch.rand(5, device="pjrt").cpu())
    states = torch.pjrt.get_rng_state_all()
    torch.pjrt.set_rng_state_all(states)
    with pytest.raises(ValueError, match="non-negative int"):
        torch.pjrt.set_offset(-1)


@contract
def test_profiler_times():
    with torch.profiler.profile(record_shapes=True) as prof:
        x = torch.randn(64, 64, device="pjrt")
        (x @ x).sum().item()
    rows = prof.key_averages()
    assert any(row.key.startswith("pjrt::run") for row in rows)
    assert all(row.cpu_time_total >= 0 and row.self_cpu_time_total >= 0 for row in rows)


@contract
def test_dynamo_device_interface():
    from torch._dynamo.device_interface import get_interface_for_device

    interface = get_interface_for_device("pjrt")
    assert interface.device_count() == torch.pjrt.device_count()
    assert interface.current_device() == 0 and interface.is_available()
    assert interface.exchange_device(1) == 0 and torch.pjrt.current_device() == 1
    assert interface.exchange_device(0) == 1
    with interface.device(1):
        assert torch.pjrt.current_device() == 1
    assert not interface.is_triton_capable()
    interface.synchronize()


@contract
def test_sdpa_overrideable():
    from torch.nn.attention import SDPBackend

    q, k, v = (torch.randn(1, 2, 4, 8, device="pjrt") for _ in range(3))
    assert torch._fused_sdp_choice(q, k, v) == SDPBackend.OVERRIDEABLE.value


@contract
def test_autocast():
    x = torch.randn(4, 4, device="pjrt")
    with torch.autocast("pjrt", dtype=torch.bfloat16):
        assert (x @ x).dtype == torch.bfloat16
    with pytest.warns(UserWarning, match="pjrt Autocast only supports"):
        with torch.autocast("pjrt", dtype=torch.float64):
            assert (x @ x).dtype == torch.float32  # (disabled, as PyTorch does)


@contract
def test_named_tensors():
    for device in ("cpu", "pjrt"):  # (PyTorch 2.13 has no named tensors: both refuse)
        with pytest.raises(TypeError, match="names"):
            torch.zeros(2, 3, names=("N", "C"), device=device)


@contract
def test_quantized_tensors():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # (PyTorch deprecates them)
        with pytest.raises(NotImplementedError, match="quantized tensors .* not supported"):
            torch.quantize_per_tensor(torch.randn(4, device="pjrt"), 0.1, 0, torch.qint8)
        quantized = torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.qint8)
        with pytest.raises(NotImplementedError, match="quantize on the CPU"):
            quantized.to("pjrt")
