"""TorchTitan's own trainer on the CPU with gloo: the reference for the pjrt runs.

TorchTitan 0.2.2 has no CPU device: with no accelerator it picks ``cuda``. This runner
(used only for the reference, never for pjrt) makes it pick ``cpu`` by answering its
device query before it is imported, and gives ``torch.cpu`` the few memory functions its
memory monitor calls (zeros: the CPU reports none). Everything else is TorchTitan's
unchanged ``torchtitan.train``; the arguments are its own.

Run it without torch_pjrt loaded (``TORCH_DEVICE_BACKEND_AUTOLOAD=0``).
"""

from __future__ import annotations

import types

import torch
import torch._utils


def _cpu_module() -> types.ModuleType:
    module = types.ModuleType("torch_cpu_for_torchtitan")
    module.__dict__.update(vars(torch.cpu))
    module.current_device = lambda: 0  # an index, as barrier(device_ids=...) expects
    module.set_device = lambda device: None
    module.get_device_name = lambda device=None: "cpu"
    module.get_device_properties = lambda device=None: types.SimpleNamespace(
        total_memory=1, name="cpu"
    )
    module.memory_stats = lambda device=None: {
        "active_bytes.all.peak": 0,
        "reserved_bytes.all.peak": 0,
        "num_alloc_retries": 0,
        "num_ooms": 0,
    }
    module.reset_peak_memory_stats = lambda device=None: None
    module.empty_cache = lambda: None
    return module


def main() -> None:
    assert torch._C._get_privateuse1_backend_name() != "pjrt", "torch_pjrt is loaded"
    cpu = _cpu_module()
    torch._utils._get_available_device_type = lambda: "cpu"
    torch._utils._get_device_module = lambda device_type: cpu

    from torchtitan.train import Trainer
    from torchtitan.train import main as train_main

    train_main(Trainer)


if __name__ == "__main__":
    main()
