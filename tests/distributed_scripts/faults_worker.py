"""One rank of a fault scenario for the pjrt process group (tests/test_distributed_faults.py).

Usage: faults_worker.py SCENARIO TIMEOUT_S, with RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT set (by the test, or by torchrun). Every rank runs one agreed all_reduce,
then the scenario; the last rank is the one that misbehaves:

- ``raise``: it raises ValueError before the next all_reduce;
- ``kill``: it kills itself (SIGKILL) there;
- ``hang``: it sleeps for TIMEOUT_S + 10 s there;
- ``mismatch``: all ranks call all_reduce with a rank-dependent shape, then ranks call
  all_reduce and all_gather_into_tensor in opposite orders (each error is caught), then
  an agreed all_reduce must still work.

A rank that gets the pjrt group's error prints ``FAULT rank=R seconds=S error=...`` (S:
from its call to the error) and re-raises it, except in ``mismatch``, which prints
``MISMATCH OK rank=R`` at the end.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import torch_pjrt  # noqa: F401


def expect_error(rank: int, call) -> str:
    start = time.monotonic()
    try:
        call()
    except dist.DistBackendError as e:
        message = str(e).replace("\n", " ")
        seconds = time.monotonic() - start
        print(f"FAULT rank={rank} seconds={seconds:.2f} error={message}", flush=True)
        return message
    raise AssertionError(f"rank {rank}: no error")


def mismatch(rank: int, world: int) -> None:
    x = torch.ones(4 if rank == 0 else 2 * 4, device="pjrt")
    if rank:
        x = x.reshape(2, 4)
    expect_error(rank, lambda: dist.all_reduce(x))

    y = torch.ones(4, device="pjrt")
    gathered = torch.empty(world * 4, device="pjrt")
    first, second = (
        (lambda: dist.all_reduce(y), lambda: dist.all_gather_into_tensor(gathered, y))
        if rank == 0
        else (lambda: dist.all_gather_into_tensor(gathered, y), lambda: dist.all_reduce(y))
    )
    expect_error(rank, first)
    expect_error(rank, second)
    z = torch.full((3,), float(rank + 1), device="pjrt")
    dist.all_reduce(z)  # the group still works after the errors
    assert z.cpu().tolist() == [world * (world + 1) / 2] * 3, z.cpu()
    print(f"MISMATCH OK rank={rank}", flush=True)


def main() -> None:
    scenario, timeout_s = sys.argv[1], float(sys.argv[2])
    dist.init_process_group("pjrt", timeout=timedelta(seconds=timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.ones(4, device="pjrt")
    dist.all_reduce(x)
    assert x.cpu().tolist() == [float(world)] * 4
    if scenario == "mismatch":
        mismatch(rank, world)
        dist.destroy_process_group()
        return
    if rank == world - 1:
        if scenario == "raise":
            raise ValueError(f"injected failure on rank {rank}")
        if scenario == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if scenario == "hang":
            time.sleep(timeout_s + 10)
    message = expect_error(rank, lambda: dist.all_reduce(x))
    raise dist.DistBackendError(message)


if __name__ == "__main__":
    main()
