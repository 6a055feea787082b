"""Ray Train on pjrt: ``ray.train.torch``'s device helpers, answering pjrt.

Ray Train picks a worker's torch device from the accelerator resources Ray gave it
(GPU, HPU, NPU, TPU), through a table of device managers inside Ray with no public way to
add one. A worker with no such resource gets the CPU, so ``ray.train.torch.get_device()``
says ``cpu`` and ``prepare_model`` / ``prepare_data_loader`` put the model and the
batches there. This module has the same three functions with the pjrt device; everything
else is Ray's own (``TorchTrainer``, ``TorchConfig(backend="pjrt")``, the process group,
the distributed sampler, ``ray.train.report``)::

    from ray.train import ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer
    from torch_pjrt import ray_train

    def train_loop(config):
        model = ray_train.prepare_model(build_model())        # on pjrt, in DDP
        loader = ray_train.prepare_data_loader(build_loader())  # batches on pjrt
        ...

    TorchTrainer(train_loop, scaling_config=ScalingConfig(num_workers=2),
                 torch_config=TorchConfig(backend="pjrt")).fit()

docs/ecosystem.md has the rest.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader

__all__ = ["get_device", "prepare_data_loader", "prepare_model"]


def get_device() -> torch.device:
    """This Ray Train worker's pjrt device: ``pjrt:LOCAL_RANK`` where the process sees
    every device of its host, else its own ``pjrt:0`` (the CPU platform, or a chip Ray
    gave the worker alone)."""
    import ray.train

    from torch_pjrt import runtime

    local_rank = ray.train.get_context().get_local_rank()
    count = runtime.device_count()
    return torch.device("pjrt", local_rank if 1 < count and local_rank < count else 0)


def prepare_model(
    model: torch.nn.Module,
    move_to_device: bool | torch.device = True,
    parallel_strategy: str | None = "ddp",
    parallel_strategy_kwargs: dict[str, Any] | None = None,
) -> torch.nn.Module:
    """``ray.train.torch.prepare_model`` with the worker's pjrt device
    (:func:`get_device`) as the device to move to; the wrapping (DDP, FSDP or none) is
    Ray's."""
    import ray.train.torch

    device = get_device() if move_to_device is True else move_to_device
    if isinstance(device, torch.device) and device.type == "pjrt":
        torch.pjrt.set_device(device)
    return ray.train.torch.prepare_model(
        model,
        move_to_device=device,
        parallel_strategy=parallel_strategy,
        parallel_strategy_kwargs=parallel_strategy_kwargs,
    )


def prepare_data_loader(
    data_loader: DataLoader,
    add_dist_sampler: bool = True,
    move_to_device: bool = True,
    auto_transfer: bool = False,
) -> DataLoader:
    """``ray.train.torch.prepare_data_loader`` (the distributed sampler, seeded workers),
    with every tensor of each batch moved to the worker's pjrt device when
    ``move_to_device``. ``auto_transfer`` (a side CUDA stream in Ray) changes nothing: a
    pjrt device has one queue, and copies to it do not wait for the device."""
    import ray.train.torch

    loader = ray.train.torch.prepare_data_loader(
        data_loader, add_dist_sampler=add_dist_sampler, move_to_device=False
    )
    return _OnDevice(loader, get_device()) if move_to_device else loader


class _OnDevice(DataLoader):
    """A data loader whose batches come with every tensor on ``device``; its other
    attributes (``sampler``, for ``set_epoch``; ``dataset``; ``batch_size``) are the
    wrapped loader's, as with Ray's own wrapper."""

    def __init__(self, loader: DataLoader, device: torch.device):
        self.__dict__.update(loader.__dict__)  # past DataLoader's set-once attributes
        self._loader = loader
        self._device = device

    def __len__(self) -> int:
        return len(self._loader)

    def __iter__(self):
        from torch.utils._pytree import tree_map_only

        def move(tensor: torch.Tensor) -> torch.Tensor:
            return tensor.to(self._device, non_blocking=True)

        for batch in self._loader:
            yield tree_map_only(torch.Tensor, move, batch)
