"""Run under torchrun: every collective on pjrt tensors, checked against gloo on CPU.

Usage: python -m torch.distributed.run --nproc_per_node N collectives_worker.py [pjrt|default]

``pjrt`` calls ``init_process_group("pjrt")``; ``default`` calls a plain
``init_process_group()`` (the pjrt device's registered backend). Inputs depend on the
rank, so equal results mean the data really crossed processes. Prints one
``COLLECTIVES OK`` line per rank on success.
"""

from __future__ import annotations

import copy
import os
import sys
import time

import torch
import torch.distributed as dist

DTYPES = [
    torch.float32,
    torch.float64,
    torch.bfloat16,
    torch.float16,
    torch.int32,
    torch.int64,
    torch.int8,
    torch.uint8,
]
REDUCE = {
    "sum": dist.ReduceOp.SUM,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
    "product": dist.ReduceOp.PRODUCT,
}


def sample(rank: int, dtype, shape=(4, 3)) -> torch.Tensor:
    """Small integers (exact in every dtype, products included), different on each rank."""
    n = 1
    for s in shape:
        n *= s
    values = (torch.arange(n) * (rank + 1) + rank) % 3 + 1
    if dtype.is_floating_point and rank % 2:
        values = -values
    return values.reshape(shape).to(dtype)


def check(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.device.type == "pjrt", (name, got.device)
    got = got.cpu()
    if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
        raise AssertionError(f"{name}: pjrt gave\n{got}\ngloo gave\n{want}")


def gloo_supports(dtype, gloo) -> bool:
    try:
        dist.all_reduce(torch.ones(2, dtype=dtype), group=gloo)
        return True
    except RuntimeError:
        return False


def torchrun_conventions(rank: int, world: int) -> None:
    """What torchrun scripts written for CUDA do: the device named by LOCAL_RANK, though
    this process sees one device (pjrt:LOCAL_RANK is another name of its pjrt:0, as
    cuda:0 is a process's one GPU under CUDA_VISIBLE_DEVICES), DDP with
    device_ids=[local_rank], a backward pass."""
    local = int(os.environ["LOCAL_RANK"])
    assert local == rank  # one host
    torch.pjrt.set_device(local)
    assert torch.accelerator.current_device_index() == torch.pjrt.current_device() == 0
    mine = torch.device(f"pjrt:{local}")
    t = torch.full((3,), float(rank + 1), device=mine)
    dist.all_reduce(t)
    assert t.device == torch.device("pjrt:0"), t.device
    assert torch.equal(t.cpu(), torch.full((3,), world * (world + 1) / 2))
    torch.manual_seed(0)
    cpu = torch.nn.Linear(3, 2)
    model = torch.nn.parallel.DistributedDataParallel(
        copy.deepcopy(cpu).to(mine), device_ids=[local]
    )
    x = torch.arange(3.0) + rank
    model(x.to(mine)[None]).sum().backward()
    inputs = torch.stack([torch.arange(3.0) + r for r in range(world)])
    cpu(inputs).sum().backward()  # DDP averages the ranks' gradients
    assert torch.allclose(model.module.weight.grad.cpu(), cpu.weight.grad / world)
    if local == 0:  # another rank's device: a clear error
        try:
            torch.ones(1, device="pjrt:1").cpu()
        except RuntimeError as exc:
            assert "sees 1 device(s)" in str(exc), exc
        else:
            raise AssertionError("pjrt:1 made on local rank 0")


def main() -> None:
    which = sys.argv[1] if len(sys.argv) > 1 else "pjrt"
    start = time.perf_counter()
    if which == "pjrt":
        dist.init_process_group("pjrt")
    else:
        dist.init_process_group()
    from torch_pjrt.distributed.backend import PjrtProcessGroup

    # a plain init_process_group() records the backend name "undefined", but the pjrt
    # device's registered backend made the group
    assert isinstance(dist.group.WORLD, PjrtProcessGroup), type(dist.group.WORLD)
    if which == "pjrt":
        assert dist.get_backend() == "pjrt", dist.get_backend()
    gloo = dist.new_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    import jax

    assert jax.process_count() == world, jax.process_count()
    assert len(jax.local_devices()) == 1 and len(jax.devices()) == world
    dev = torch.device("pjrt")
    tested = []
    for dtype in DTYPES:
        if not gloo_supports(dtype, gloo):
            continue
        tested.append(str(dtype).replace("torch.", ""))
        x = sample(rank, dtype)

        for name, op in REDUCE.items():
            ref = x.clone()
            dist.all_reduce(ref, op=op, group=gloo)
            got = x.to(dev)
            dist.all_reduce(got, op=op)
            check(f"all_reduce {name} {dtype}", got, ref)
        if dtype.is_floating_point:  # AVG: gloo has none, so its SUM / world
            ref = x.clone()
            dist.all_reduce(ref, group=gloo)
            got = x.to(dev)
            dist.all_reduce(got, op=dist.ReduceOp.AVG)
            check(f"all_reduce avg {dtype}", got, ref / world)

        refs = [x.clone(), (x * 2).clone()]
        dist.all_reduce_coalesced(refs, op=dist.ReduceOp.MAX, group=gloo)
        gots = [t.to(dev) for t in (x, x * 2)]
        dist.all_reduce_coalesced(gots, op=dist.ReduceOp.MAX)
        for i, (got, ref) in enumerate(zip(gots, refs)):
            check(f"all_reduce_coalesced[{i}] {dtype}", got, ref)

        ref = x.clone()
        dist.broadcast(ref, src=world - 1, group=gloo)
        got = x.to(dev)
        dist.broadcast(got, src=world - 1)
        check(f"broadcast {dtype}", got, ref)

        refs = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(refs, x, group=gloo)
        gots = [torch.empty_like(x, device=dev) for _ in range(world)]
        dist.all_gather(gots, x.to(dev))
        for i in range(world):
            check(f"all_gather[{i}] {dtype}", gots[i], refs[i])

        ref = x.clone()
        dist.reduce(ref, dst=world - 1, op=dist.ReduceOp.MAX, group=gloo)
        got = x.to(dev)
        dist.reduce(got, dst=world - 1, op=dist.ReduceOp.MAX)
        if rank == world - 1:
            check(f"reduce {dtype}", got, ref)

        refs = [torch.empty_like(x) for _ in range(world)] if rank == 0 else None
        dist.gather(x, refs, dst=0, group=gloo)
        gots = [torch.empty_like(x, device=dev) for _ in range(world)] if rank == 0 else None
        dist.gather(x.to(dev), gots, dst=0)
        if rank == 0:
            for i in range(world):
                check(f"gather[{i}] {dtype}", gots[i], refs[i])

        chunks = [sample(rank + i, dtype) for i in range(world)] if rank == 1 else None
        ref = torch.empty_like(x)
        dist.scatter(ref, chunks, src=1, group=gloo)
        got = torch.empty_like(x, device=dev)
        dist.scatter(got, [c.to(dev) for c in chunks] if chunks else None, src=1)
        check(f"scatter {dtype}", got, ref)

        ref = torch.empty((world * 4, 3), dtype=dtype)
        dist.all_gather_into_tensor(ref, x, group=gloo)
        got = torch.empty((world * 4, 3), dtype=dtype, device=dev)
        dist.all_gather_into_tensor(got, x.to(dev))
        check(f"all_gather_into_tensor {dtype}", got, ref)

        big = sample(rank, dtype, (world * 2, 3))
        ref = torch.empty((2, 3), dtype=dtype)
        got = torch.empty((2, 3), dtype=dtype, device=dev)
        try:
            dist.reduce_scatter_tensor(ref, big, group=gloo)
        except (RuntimeError, ValueError):  # gloo without reduce_scatter: sum, then a slice
            full = big.clone()
            dist.all_reduce(full, group=gloo)
            ref = full[rank * 2 : rank * 2 + 2]
        dist.reduce_scatter_tensor(got, big.to(dev))
        check(f"reduce_scatter_tensor {dtype}", got, ref)

        ref = torch.empty_like(big)
        dist.all_to_all_single(ref, big, group=gloo)
        got = torch.empty_like(big, device=dev)
        dist.all_to_all_single(got, big.to(dev))
        check(f"all_to_all_single {dtype}", got, ref)

        if dtype.is_floating_point:  # PREMUL_SUM (FSDP2's gradient reduce): gloo has none
            premul = {}
            for factor in (0.25, torch.tensor(0.5)):
                f = float(factor)
                premul[f] = (x * f).to(dtype)
                dist.all_reduce(premul[f], group=gloo)
                got = x.to(dev)
                dist.all_reduce(got, op=dist.ReduceOp.PREMUL_SUM(factor))
                check(f"all_reduce premul_sum({f}) {dtype}", got, premul[f])
            got = x.to(dev)
            dist.reduce(got, dst=0, op=dist.ReduceOp.PREMUL_SUM(0.25))
            if rank == 0:
                check(f"reduce premul_sum {dtype}", got, premul[0.25])
            full = (big * 0.25).to(dtype)
            dist.all_reduce(full, group=gloo)
            got = torch.empty((2, 3), dtype=dtype, device=dev)
            dist.reduce_scatter_tensor(got, big.to(dev), op=dist.ReduceOp.PREMUL_SUM(0.25))
            check(f"reduce_scatter_tensor premul_sum {dtype}", got, full[rank * 2 : rank * 2 + 2])

        # async handles
        got = x.to(dev)
        work = dist.all_reduce(got, async_op=True)
        assert work.wait()
        ref = x.clone()
        dist.all_reduce(ref, group=gloo)
        check(f"async all_reduce {dtype}", got, ref)

        # send/recv in a ring (isend and irecv posted before waiting)
        out = torch.empty_like(x, device=dev)
        recv = dist.irecv(out, src=(rank - 1) % world)
        send = dist.isend(x.to(dev), dst=(rank + 1) % world)
        send.wait()
        recv.wait()
        check(f"send/recv {dtype}", out, sample((rank - 1) % world, dtype))
        if rank == 0:
            dist.send(x.to(dev), dst=world - 1)
        elif rank == world - 1:
            out = torch.empty_like(x, device=dev)
            dist.recv(out, src=0)
            check(f"blocking recv {dtype}", out, sample(0, dtype))

    # errors in PyTorch's style
    for call, words in (
        (
            lambda: dist.all_reduce(
                torch.ones(2, dtype=torch.int32, device=dev), op=dist.ReduceOp.AVG
            ),
            "ReduceOp.AVG",
        ),
        (
            lambda: dist.all_to_all_single(
                torch.empty(world + 1, device=dev), torch.ones(world + 1, device=dev)
            ),
            "equal splits",
        ),
        (
            lambda: dist.all_reduce(
                torch.ones(2, dtype=torch.int32, device=dev), op=dist.ReduceOp.PREMUL_SUM(2.0)
            ),
            "ReduceOp.PREMUL_SUM needs a floating point tensor",
        ),
    ):
        try:
            call()
        except RuntimeError as exc:
            assert words in str(exc), exc
        else:
            raise AssertionError(f"no error ({words})")

    torchrun_conventions(rank, world)
    dist.barrier()
    work = dist.barrier(async_op=True)
    work.wait()
    # CPU tensors through the pjrt group go to its gloo group
    c = torch.full((3,), float(rank + 1))
    dist.all_reduce(c)
    assert torch.equal(c, torch.full((3,), float(world * (world + 1) // 2))), c
    seconds = time.perf_counter() - start
    print(
        f"COLLECTIVES OK rank={rank} world={world} init={which} dtypes={','.join(tested)} "
        f"seconds={seconds:.1f}",
        flush=True,
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    main()
