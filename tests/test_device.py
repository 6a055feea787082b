"""The pjrt device as PyTorch sees it: registration, torch.pjrt, seeds, memory, platform."""

from __future__ import annotations

import gc
import importlib.metadata
import os
import subprocess
import sys

import pytest
import torch

import torch_pjrt


def _run(code: str, **env) -> subprocess.CompletedProcess:
    full_env = dict(os.environ)
    full_env.update(env)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=300
    )


def test_registration_is_idempotent_and_names_the_device():
    torch_pjrt._registration.register()
    torch_pjrt._registration.register()
    assert torch._C._get_privateuse1_backend_name() == "pjrt"
    assert torch.device("pjrt").type == "pjrt"
    assert torch.accelerator.current_accelerator() == torch.device("pjrt")
    assert torch.accelerator.is_available()


def test_tensor_and_module_helpers():
    t = torch.ones(2).pjrt()
    assert t.is_pjrt and t.device == torch.device("pjrt:0")
    assert not torch.ones(2).is_pjrt
    m = torch.nn.Linear(3, 2).pjrt()
    assert all(p.device.type == "pjrt" for p in m.parameters())
    m2 = torch.nn.Linear(3, 2).to("pjrt")
    assert m2.weight.is_pjrt


def test_device_module_api():
    assert torch.pjrt.is_available()
    assert torch.pjrt.device_count() == len(torch_pjrt.runtime.devices()) >= 1
    assert torch.pjrt.current_device() == 0
    assert isinstance(torch.pjrt.get_device_name(), str)
    props = torch.pjrt.get_device_properties(0)
    assert props.total_memory > 0 and props.name == torch.pjrt.get_device_name(0)
    torch.pjrt.synchronize()


@pytest.mark.devices(2)
def test_set_device():
    torch.pjrt.set_device(1)
    try:
        assert torch.pjrt.current_device() == 1
        assert torch.empty(2, device="pjrt").device == torch.device("pjrt:1")
        with torch.pjrt.device(0):
            assert torch.pjrt.current_device() == 0
        assert torch.pjrt.current_device() == 1
    finally:
        torch.pjrt.set_device(0)


def test_memory_statistics_follow_allocations():
    gc.collect()  # an earlier test's garbage freed in between would blur the difference
    torch.pjrt.synchronize()
    before = torch.pjrt.memory_allocated()
    x = torch.ones(1 << 20, device="pjrt") * 2  # 4 MiB on the device
    x.sum().item()
    during = torch.pjrt.memory_allocated()
    assert during - before >= 4 << 20
    assert torch.pjrt.max_memory_allocated() >= during
    stats = torch.pjrt.memory_stats()
    assert stats["allocated_bytes.all.current"] == during
    assert torch.pjrt.max_memory_reserved() >= torch.pjrt.max_memory_allocated()
    free, total = torch.pjrt.mem_get_info()
    assert total == torch.pjrt.get_device_properties().total_memory > 0
    assert free == max(total - torch.pjrt.memory_reserved(), 0)
    assert torch.pjrt.is_bf16_supported()
    del x
    assert torch.pjrt.memory_allocated() <= during - (4 << 20)
    torch.pjrt.reset_peak_memory_stats()
    assert torch.pjrt.max_memory_allocated() == torch.pjrt.memory_allocated()


@pytest.fixture
def no_gc():
    """Garbage collection held off: an earlier test's arrays freed between two memory
    queries would change the figures compared."""
    gc.collect()
    gc.disable()
    yield
    gc.enable()


def test_memory_stats_have_cudas_keys_and_accelerator_reads_them(monkeypatch, no_gc):
    """torch.pjrt.memory_stats() has every key torch.cuda's does (PyTorch's own
    memory_summary reads them all), ints only; torch.accelerator's memory functions and
    torch.pjrt.memory give the same figures."""
    keep = torch.ones(1 << 18, device="pjrt") + 1  # 1 MiB: the large pool
    small = torch.ones(16, device="pjrt") + 1  # the small pool
    torch.pjrt.synchronize()
    stats = torch.pjrt.memory_stats()
    assert all(type(v) is int for v in stats.values()) and list(stats) == sorted(stats)
    monkeypatch.setattr(torch.cuda.memory, "memory_stats", lambda device=None: stats)
    summary = torch.cuda.memory_summary()  # KeyError if a key it reads were missing
    assert "Allocated memory" in summary and "Non-releasable" in summary
    for key in (
        "active_bytes.all.peak",
        "reserved_bytes.all.peak",
        "num_alloc_retries",
        "num_ooms",
    ):  # what TorchTitan's memory monitor reads
        assert key in stats
    assert stats["allocated_bytes.large_pool.current"] >= keep.nbytes
    assert stats["allocated_bytes.small_pool.current"] >= small.nbytes
    assert stats["allocated_bytes.all.current"] == (
        stats["allocated_bytes.large_pool.current"] + stats["allocated_bytes.small_pool.current"]
    )
    assert stats["active_bytes.all.current"] == stats["allocated_bytes.all.current"]
    A = torch.accelerator
    assert A.memory_stats() == stats == torch.pjrt.memory.memory_stats()
    assert (
        A.memory_allocated()
        == torch.pjrt.memory_allocated()
        == stats["allocated_bytes.all.current"]
    )
    assert A.max_memory_allocated() == torch.pjrt.max_memory_allocated()
    assert A.memory_reserved() == torch.pjrt.memory_reserved()
    assert A.get_memory_info() == torch.pjrt.mem_get_info()
    del keep
    A.reset_peak_memory_stats()
    assert A.max_memory_allocated() == torch.pjrt.memory_allocated()
    A.reset_accumulated_memory_stats()
    assert "allocated bytes" in torch.pjrt.memory_summary()
    with torch_pjrt.mode("fused"):  # recorded work runs before the figures are taken
        before = torch.pjrt.memory_allocated()
        made = torch.zeros(1 << 18, device="pjrt")
        assert torch.pjrt.memory_allocated() - before >= made.nbytes
    torch.pjrt.memory._record_memory_history(enabled=None)  # off: accepted
    with pytest.raises(NotImplementedError, match="pjrt device.*memory_stats"):
        torch.pjrt.memory._record_memory_history(max_entries=1000)
    with pytest.raises(NotImplementedError, match="pjrt device"):
        torch.pjrt.memory._snapshot()


def test_memory_figures_from_a_platform_that_reports_them(monkeypatch):
    """Where the PJRT client reports memory (GPU, TPU), its figures are used; a reset
    peak starts from the current figure, and a later platform peak above the one at
    the reset shows through."""
    from torch_pjrt.runtime import properties

    reported = {
        "bytes_in_use": 100,
        "peak_bytes_in_use": 900,
        "bytes_reserved": 1000,
        "peak_bytes_reserved": 2000,
        "num_allocs": 7,
        "bytes_limit": 4096,
    }
    monkeypatch.setattr(properties, "_platform_stats", lambda device: dict(reported))
    monkeypatch.setattr(properties, "_peaks", {})
    monkeypatch.setattr(properties, "_reset_at", {})
    stats = torch.pjrt.memory_stats()
    assert (stats["allocated_bytes.all.current"], stats["allocated_bytes.all.peak"]) == (100, 900)
    assert (stats["reserved_bytes.all.current"], stats["reserved_bytes.all.peak"]) == (1000, 2000)
    assert stats["allocation.all.allocated"] == 7 and stats["num_ooms"] == 0
    assert torch.pjrt.mem_get_info() == (4096 - 1000, 4096)
    torch.pjrt.reset_peak_memory_stats()
    assert torch.pjrt.max_memory_allocated() == 100
    reported.update(bytes_in_use=300)
    assert torch.pjrt.max_memory_allocated() == 300  # seen at this query
    reported.update(bytes_in_use=50)
    assert torch.pjrt.max_memory_allocated() == 300
    reported.update(peak_bytes_in_use=1500)  # a new high between two queries
    assert torch.pjrt.max_memory_allocated() == 1500
    assert "the platform's allocator" in torch.pjrt.memory_summary()


def test_streams_and_events():
    """torch.pjrt.Stream/Event (torch_pjrt.device.streams): CUDA's interface over one in-order
    queue per device; code that orders work with them gets the same values."""
    s = torch.pjrt.Stream(priority=-1)
    assert s == torch.pjrt.current_stream() == torch.pjrt.default_stream(0)
    assert s.device == torch.device("pjrt:0") and s.query()
    assert torch.pjrt.Stream("pjrt:1") != s
    start = torch.pjrt.Event(enable_timing=True)
    start.record()
    x = torch.arange(6.0, device="pjrt")
    with torch.pjrt.stream(s):
        y = x * 2
    s.wait_stream(torch.pjrt.current_stream())
    done = s.record_event(torch.pjrt.Event(enable_timing=True))
    torch.pjrt.current_stream().wait_event(done)
    done.synchronize()
    assert done.query() and start.elapsed_time(done) >= 0.0
    torch.testing.assert_close(y.cpu(), torch.arange(6.0) * 2)
    plain = torch.pjrt.Event()
    plain.record(s)
    with pytest.raises(RuntimeError, match="enable_timing=True"):
        plain.elapsed_time(done)
    with pytest.raises(RuntimeError, match="must be recorded"):
        torch.pjrt.Event(enable_timing=True).elapsed_time(done)
    with pytest.raises(ValueError, match="Expected a pjrt device"):
        torch.pjrt.Stream("cpu")


@pytest.mark.parametrize("mode", ["eager", "fused"])
def test_non_blocking_copies_to_the_host_and_events(mode):
    """``.to("cpu", non_blocking=True)`` and ``cpu.copy_(t, non_blocking=True)`` return at
    once, as CUDA's copies to pinned memory: the values are there after the next
    synchronization (an Event recorded after the copy, ``torch.pjrt.synchronize()``, a
    copy that waits); an Event waits for the work issued before its record; a failed
    value check surfaces at that synchronization."""
    from torch_pjrt.device.tensor import cell_of

    with torch_pjrt.mode(mode):
        a = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
        x = a.to("pjrt")
        y = (x @ x).relu()
        out = y.to("cpu", non_blocking=True)
        halves = torch.empty(64, 64, dtype=torch.bfloat16)
        assert halves.copy_(y.bfloat16(), non_blocking=True) is halves
        event = torch.pjrt.Event()
        event.record()
        event.synchronize()
        assert event.query()
        assert cell_of(y)._value.is_ready()  # (issued before the record)
        torch.testing.assert_close(out, (a @ a).relu())
        torch.testing.assert_close(halves, (a @ a).relu().bfloat16())
        later = (x * 3).to("cpu", non_blocking=True)
        torch.pjrt.synchronize()
        torch.testing.assert_close(later, a * 3)
        again = (x - 1).to("cpu", non_blocking=True)
        assert x.sum().item() == pytest.approx(a.sum().item(), rel=1e-5)  # (a copy that waits)
        torch.testing.assert_close(again, a - 1)
        # a value computed by a failed check: its error at the synchronization
        bad = x[torch.tensor([70], device="pjrt")].to("cpu", non_blocking=True)
        event.record()
        with pytest.raises(IndexError, match="index 70 is out of bounds for dimension 0"):
            event.synchronize()
        assert bad.shape == (1, 64)


def test_an_event_marks_a_dropped_copy_without_every_live_array(monkeypatch):
    """An Event marks the last program's output and the last copy to the device. A small
    copy whose tensor is dropped at once (a step's inputs, read by one program) is still
    that mark: the event waits for those two arrays, not for every live array of the
    device (which cost vLLM's single stream about a quarter of its steps)."""
    from torch_pjrt import runtime

    x = torch.arange(16.0).to("pjrt")
    y = x * 2  # (the last program: its output held)
    torch.ones(8).to("pjrt")  # (dropped)
    gathered = []
    monkeypatch.setattr(runtime, "live_arrays", lambda *a: gathered.append(a) or [])
    event = torch.pjrt.Event()
    event.record()
    assert not gathered and len(event._arrays) == 2
    event.synchronize()
    assert event.query()
    torch.testing.assert_close(y.cpu(), torch.arange(16.0) * 2)


def test_the_device_guard_is_native():
    """The C++ device guard (torch_pjrt/device/guard.cpp) is built and registered: the
    tests below need it, and every machine that runs make test has a C++ compiler."""
    from torch_pjrt.device import guard

    assert guard.native() == (True, "")


@pytest.mark.devices(2)
def test_autograd_on_every_device():
    """The autograd engine keeps a queue for every pjrt device (the guard's count): a
    backward pass on pjrt:1 gives CPU's gradients, on pjrt:1, and leaves the current
    device alone (the engine's device threads set their own)."""
    w_cpu = torch.randn(3, 4, dtype=torch.float64)
    x_cpu = torch.randn(5, 3, dtype=torch.float64)
    grads = {}
    for device in ("cpu", "pjrt:1", "pjrt:0"):
        w = w_cpu.to(device).detach().requires_grad_()
        (x_cpu.to(device) @ w).tanh().pow(2).sum().backward()
        assert w.grad.device == torch.device(device)
        grads[device] = w.grad.cpu()
    assert torch.pjrt.current_device() == 0
    torch.testing.assert_close(grads["pjrt:1"], grads["cpu"])
    torch.testing.assert_close(grads["pjrt:0"], grads["cpu"])


@pytest.mark.devices(2)
def test_current_device_is_per_thread():
    """As CUDA's: a thread starts on device 0 and sets its own."""
    import threading

    seen = []

    def other():
        seen.append(torch.pjrt.current_device())
        torch.pjrt.set_device(1)
        seen.append(torch.empty(1, device="pjrt").device.index)

    torch.accelerator.set_device_index(1)
    try:
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        assert seen == [0, 1] and torch.accelerator.current_device_index() == 1
    finally:
        torch.accelerator.set_device_index(0)
    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert torch.pjrt.current_device() == 0


@pytest.mark.devices(2)
def test_pytorchs_event_and_stream():
    """torch.Event and torch.Stream, PyTorch's device-generic classes, on pjrt: record,
    wait, query, synchronize and elapsed time, with torch.pjrt.Event's rules (a timing
    event waits for the device when recorded), and PyTorch's errors."""
    stream = torch.Stream(device="pjrt:1")
    assert stream.device == torch.device("pjrt:1") and stream.query()
    assert torch.Stream(device="pjrt").device == torch.device("pjrt:0")  # the current one
    start, end = torch.Event(device="pjrt:1", enable_timing=True), torch.Event(enable_timing=True)
    start.record(stream)
    x = torch.arange(6.0, device="pjrt:1") * 2
    end.record(stream)
    end.synchronize()
    assert start.query() and end.query() and start.elapsed_time(end) >= 0.0
    assert start.event_id != end.event_id
    plain = stream.record_event()
    plain.wait(stream)
    plain.synchronize()
    stream.synchronize()
    with pytest.raises(ValueError, match="enable_timing=True"):
        plain.elapsed_time(end)
    with pytest.raises(ValueError, match="must be recorded"):
        torch.Event(enable_timing=True).elapsed_time(end)
    with pytest.raises(RuntimeError, match=r"Invalid device pjrt:7"):
        torch.Stream(device="pjrt:7").synchronize()
    torch.testing.assert_close(x.cpu(), torch.arange(6.0) * 2)


def test_storage_resize_frees_and_restores_the_buffer():
    """FSDP2 frees its unsharded parameters with storage.resize_(0) and has them back
    with resize_(nbytes) before writing them again."""
    from torch_pjrt.device.tensor import cell_of

    t = torch.ones(4, 3, device="pjrt")
    storage = t.untyped_storage()
    nbytes = storage.nbytes()
    storage.resize_(0)
    assert cell_of(t).array is None  # the device buffer is gone
    storage.resize_(nbytes)
    t.copy_(torch.full((4, 3), 2.0))
    torch.testing.assert_close(t.cpu(), torch.full((4, 3), 2.0))
    with pytest.raises(RuntimeError, match="resized to 0 bytes .* or back to its size"):
        storage.resize_(nbytes * 2)
    cpu = torch.ones(4).untyped_storage()  # other storages resize as before
    cpu.resize_(8)
    assert cpu.nbytes() == 8


@pytest.mark.parametrize("shared_blocks", [True, False], ids=["shared", "own"])
def test_tensor_handles_are_distinct_from_any_thread(monkeypatch, shared_blocks):
    """Each pjrt storage gets its own fake data pointer and its own device and layout,
    whether its handle comes from a layout's shared capsule block or a block of its
    own (past torch_pjrt.device.tensor._SHARED_BLOCKS layouts), from one thread or several."""
    import threading

    from torch_pjrt.device import tensor as pjrt_tensor

    if not shared_blocks:
        monkeypatch.setattr(pjrt_tensor, "_SHARED_BLOCKS", 0)
        pjrt_tensor._template.cache_clear()
        pjrt_tensor._WRAP_LAYOUTS.clear()
    made = []

    def work(seed):
        g = torch.Generator().manual_seed(seed)
        for i in range(200):
            x = torch.randn(3, 1 + i % 4, generator=g)
            y = x.to("pjrt") * 2
            made.append((y, x * 2))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        pointers = {y.untyped_storage().data_ptr() for y, _ in made}
        assert len(pointers) == len(made) == 800
        for y, ref in made:
            assert y.device == torch.device("pjrt:0") and y.shape == ref.shape
            torch.testing.assert_close(y.cpu(), ref)
        assert torch.ones(2, 5, device="pjrt").stride() == (5, 1)
    finally:
        pjrt_tensor._template.cache_clear()
        pjrt_tensor._WRAP_LAYOUTS.clear()


def test_manual_seed_makes_random_ops_reproducible():
    torch.manual_seed(1234)
    a = torch.rand(5, device="pjrt").cpu()
    b = torch.rand(5, device="pjrt").cpu()
    torch.manual_seed(1234)
    a2 = torch.rand(5, device="pjrt").cpu()
    assert torch.equal(a, a2)
    assert not torch.equal(a, b)
    torch.pjrt.manual_seed(7)
    c = torch.randn(4, device="pjrt").cpu()
    torch.pjrt.manual_seed(7)
    assert torch.equal(c, torch.randn(4, device="pjrt").cpu())


def test_rng_state_round_trip():
    torch.pjrt.manual_seed_all(3)
    state = torch.pjrt.get_rng_state()
    first = torch.rand(3, device="pjrt").cpu()
    torch.pjrt.set_rng_state(state)
    assert torch.equal(first, torch.rand(3, device="pjrt").cpu())
    with torch.random.fork_rng(device_type="pjrt"):
        torch.rand(3, device="pjrt")
    after_fork = torch.rand(3, device="pjrt").cpu()
    torch.pjrt.set_rng_state(state)
    torch.rand(3, device="pjrt")
    assert torch.equal(after_fork, torch.rand(3, device="pjrt").cpu())


def test_entry_point_is_declared():
    names = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="torch.backends")}
    assert names.get("pjrt") == "torch_pjrt:_autoload"


def test_autoload_without_import():
    out = _run("import torch; print(torch.ones(2, device='pjrt'))")
    assert out.returncode == 0, out.stderr
    assert "device='pjrt:0'" in out.stdout


def test_autoload_can_be_turned_off():
    out = _run("import torch; torch.ones(2, device='pjrt')", TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert out.returncode != 0
    assert "pjrt" in out.stderr


def test_missing_platform_names_the_plugin():
    out = _run(
        "import torch, torch_pjrt; torch.ones(2, device='pjrt')",
        PJRT_DEVICE="TPU",
        JAX_PLATFORMS="",
    )
    assert out.returncode != 0
    assert "PlatformError" in out.stderr and "libtpu" in out.stderr


def test_init_selects_platform_and_device_count():
    code = (
        "import torch_pjrt, torch; print(torch_pjrt.init(platform='CPU'), "
        "torch.pjrt.device_count())"
    )
    out = _run(code, TORCH_PJRT_CPU_DEVICES="3", XLA_FLAGS="")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["cpu", "3"]


def test_init_runs_cpu_programs_in_order_unless_xla_flags_say_otherwise():
    """On the CPU, pjrt asks XLA for its kernels in one order (docs/internals.md, "XLA's
    CPU scheduler"), before JAX starts; a user's own XLA_FLAGS setting of it is kept."""
    code = "import os, torch_pjrt; torch_pjrt.init(platform='CPU'); print(os.environ['XLA_FLAGS'])"
    out = _run(code, XLA_FLAGS="--xla_force_host_platform_device_count=1")
    assert out.returncode == 0, out.stderr
    flags = out.stdout.split()
    assert "--xla_cpu_enable_concurrency_optimized_scheduler=false" in flags
    assert "--xla_force_host_platform_device_count=1" in flags
    mine = "--xla_cpu_enable_concurrency_optimized_scheduler=true"
    out = _run(code, XLA_FLAGS=mine)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [mine]


def test_import_has_no_side_effects_on_jax_or_environment():
    code = (
        "import os, jax; env = dict(os.environ); x64 = jax.config.jax_enable_x64; "
        "import torch_pjrt; assert dict(os.environ) == env; "
        "assert jax.config.jax_enable_x64 == x64; "
        "import jax._src.xla_bridge as xb; assert not xb.backends_are_initialized(); print('ok')"
    )
    out = _run(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


@pytest.mark.parametrize("index", [2, 99])
def test_invalid_device_index(index):
    with pytest.raises(RuntimeError, match=f"Invalid device pjrt:{index}"):
        torch.ones(2, device=f"pjrt:{index}")


def test_tensors_of_more_dims_than_numpy_allows_move_both_ways():
    """numpy arrays have at most 64 dims, PyTorch's and XLA's arrays more: such a tensor
    goes to pjrt and back whole."""
    x = torch.arange(6.0).reshape([2, *[1] * 63, 3, 1])
    y = x.to("pjrt")
    assert y.shape == x.shape
    assert torch.equal(y.cpu(), x)
    assert torch.equal(y.view(6).cpu(), x.view(6))
