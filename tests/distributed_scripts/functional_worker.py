"""Run under torchrun: functional collectives on pjrt tensors, checked against gloo.

Usage: python -m torch.distributed.run --nproc_per_node N functional_worker.py

``torch.distributed._functional_collectives`` (what DTensor calls eagerly: the
``_c10d_functional`` ops, which find the group by its name) on pjrt tensors with the
pjrt group, and the same calls on CPU tensors with a gloo group. Inputs depend on the
rank; results must be equal (small integers: exact). Prints one ``FUNCTIONAL OK`` line
per rank with the number of comparisons made.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
from collectives_worker import sample  # (the script's folder is on sys.path)

DTYPES = [torch.float32, torch.bfloat16, torch.int32, torch.int64]


class Checker:
    def __init__(self, pjrt_group, gloo_group, world: int):
        self.pg, self.gloo, self.world = pjrt_group, gloo_group, world
        self.count = 0

    def same(self, name, x, call, reference=None):
        """``call(tensor, group)`` on pjrt vs. on CPU with gloo (or ``reference(x)``)."""
        got = call(x.to("pjrt"), self.pg)
        want = call(x.clone(), self.gloo) if reference is None else reference(x.clone())
        got_list = got if isinstance(got, (list, tuple)) else [got]
        want_list = want if isinstance(want, (list, tuple)) else [want]
        assert len(got_list) == len(want_list), name
        for g, w in zip(got_list, want_list, strict=True):
            g = fc.wait_tensor(g) if isinstance(g, torch.Tensor) else g
            w = fc.wait_tensor(w) if isinstance(w, torch.Tensor) else w
            assert g.device.type == "pjrt", (name, g.device)
            g = g.cpu()
            if g.dtype != w.dtype or g.shape != w.shape or not torch.equal(g, w):
                raise AssertionError(f"{name}: pjrt gave\n{g}\ngloo gave\n{w}")
        self.count += 1


def main() -> None:
    dist.init_process_group("pjrt")
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    pg = dist.group.WORLD
    assert pg.group_name and pg.group_name != gloo.group_name, (pg.group_name, gloo.group_name)
    c = Checker(pg, gloo, world)

    def gloo_sum(x):
        y = x.clone()
        dist.all_reduce(y, group=gloo)
        return y

    for dtype in DTYPES:
        x = sample(rank, dtype, (2 * world, 3))
        ops = ["sum", "max", "min", "product"]
        for op in ops:
            c.same(f"all_reduce {op} {dtype}", x, lambda t, g, op=op: fc.all_reduce(t, op, g))
            c.same(
                f"all_reduce_ {op} {dtype}",
                x,
                lambda t, g, op=op: torch.ops._c10d_functional.all_reduce_(t, op, g.group_name),
            )
        if dtype.is_floating_point:  # gloo has no AVG: its SUM / world
            c.same(
                f"all_reduce avg {dtype}",
                x,
                lambda t, g: fc.all_reduce(t, "avg", g),
                lambda t: gloo_sum(t) / world,
            )
        for dim in (0, 1):
            c.same(
                f"all_gather_tensor dim={dim} {dtype}",
                x,
                lambda t, g, dim=dim: fc.all_gather_tensor(t, dim, g),
            )

            # reduce_scatter: gloo may lack it; then its SUM and this rank's chunk
            def rs_ref(t, dim=dim):
                try:
                    return fc.wait_tensor(fc.reduce_scatter_tensor(t, "sum", dim, gloo))
                except (RuntimeError, ValueError):
                    return gloo_sum(t).chunk(world, dim)[rank].contiguous()

            c.same(
                f"reduce_scatter_tensor dim={dim} {dtype}",
                sample(rank, dtype, (2 * world, 2 * world)),
                lambda t, g, dim=dim: fc.reduce_scatter_tensor(t, "sum", dim, g),
                rs_ref,
            )
        c.same(
            f"all_to_all_single {dtype}",
            x,
            lambda t, g: fc.all_to_all_single(t, [2] * world, [2] * world, g),
        )
        c.same(f"broadcast {dtype}", x, lambda t, g: fc.broadcast(t, world - 1, g))
        c.same(
            f"all_reduce_coalesced {dtype}",
            x,
            lambda t, g: fc.all_reduce_coalesced([t, t * 2], "sum", g),
        )
        c.same(
            f"all_gather_into_tensor_coalesced {dtype}",
            x,
            lambda t, g: fc.all_gather_into_tensor_coalesced([t, t[:1]], g),
        )

    # AsyncCollectiveTensor: used in further math without an explicit wait
    x = sample(rank, torch.float32, (world, 4))
    c.same(
        "async tensor in math",
        x,
        lambda t, g: (fc.all_reduce(t, "sum", g) * 2 + 1).sum(0),
    )
    # autograd: all_gather's backward is a reduce_scatter of the gradient
    w = torch.arange(world * world * 4, dtype=torch.float32).reshape(world * world, 4) + rank

    def gather_grad(t, g):
        t = t.detach().requires_grad_(True)
        out = fc.all_gather_tensor_autograd(t, 0, g)
        (fc.wait_tensor(out) * w.to(t.device)).sum().backward()
        return t.grad

    c.same("all_gather_tensor_autograd backward", x, gather_grad)

    # DTensor eagerly on a pjrt mesh: scatter, all_gather (redistribute), all_reduce
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("pjrt", (world,))
    assert mesh.get_group() is pg, mesh.get_group()
    full = torch.arange(2 * world * 3, dtype=torch.float32).reshape(2 * world, 3)
    d = distribute_tensor(full.to("pjrt"), mesh, [Shard(0)])
    local = d.to_local()
    assert local.device.type == "pjrt"
    assert torch.equal(local.cpu(), full.chunk(world)[rank]), local
    replicated = d.redistribute(mesh, [Replicate()]).to_local().cpu()
    assert torch.equal(replicated, full), replicated
    total = (d * 2).sum().full_tensor().cpu()  # a Partial sum, then an all_reduce
    assert torch.equal(total, (full * 2).sum()), total
    c.count += 3

    # inside torch.compile(backend="pjrt"): the collectives become collectives of the
    # graph's XLA program (torch_pjrt/distributed/compiled.py), with math around them
    import torch_pjrt

    torch_pjrt.metrics.reset()
    compiled_cases = {
        "all_reduce sum": lambda t, g: fc.all_reduce(t * 2 + 1, "sum", g) - t,
        "all_reduce max": lambda t, g: fc.all_reduce(t, "max", g) * t,
        "all_gather_tensor": lambda t, g: fc.all_gather_tensor(t + 1, 0, g).sum(1),
        "reduce_scatter_tensor": lambda t, g: fc.reduce_scatter_tensor(t * 3, "sum", 0, g) + 1,
        "all_to_all_single": lambda t, g: fc.all_to_all_single(t, [2] * world, [2] * world, g),
        "broadcast": lambda t, g: fc.broadcast(t - 1, world - 1, g) * 2,
        # an index the program checks (runtime/asserts.py) beside a collective
        "all_reduce, indexed": lambda t, g: fc.all_reduce(t, "sum", g)[
            torch.arange(t.shape[0] - 1, -1, -2, device=t.device)
        ],
    }
    for dtype in (torch.float32, torch.int32):
        x = sample(rank, dtype, (2 * world, 3))
        for name, fn in compiled_cases.items():
            compiled = torch.compile(fn, backend="pjrt", fullgraph=True)
            c.same(
                f"compiled {name} {dtype}",
                x,
                lambda t, g, compiled=compiled: compiled(t, g),
                lambda t, fn=fn: fn(t, gloo),
            )
    tables = torch_pjrt.metrics.as_dict()
    eager = [op for op in tables.get("graph_eager_ops", {}) if "_c10d_functional" in op]
    assert not eager, f"collectives left out of the compiled programs: {eager}"
    assert sum(tables.get("graph_spmd_collectives", {}).values()) >= len(compiled_cases), tables

    # a failed check in a compiled SPMD graph (an index past the end on the last rank
    # only): every rank raises PyTorch's IndexError when it reads the result, the same
    def indexed(t, i, g):
        return fc.all_reduce(t, "sum", g)[i]

    bad = torch.tensor([0, 2 * world + 3 if rank == world - 1 else 1], device="pjrt")
    result = torch.compile(indexed, backend="pjrt", fullgraph=True)(x.to("pjrt"), bad, pg)
    try:
        result.cpu()
    except IndexError as exc:
        assert f"index {2 * world + 3} is out of bounds" in str(exc), exc
    else:
        raise AssertionError("no IndexError for an index past the end in an SPMD graph")
    c.count += 1

    # errors: a group size that is not the group's
    try:
        torch.ops._c10d_functional.all_gather_into_tensor(
            torch.ones(2, device="pjrt"), world + 1, pg.group_name
        )
    except RuntimeError as exc:
        assert "group_size" in str(exc), exc
    else:
        raise AssertionError("no error for a wrong group_size")

    print(f"FUNCTIONAL OK rank={rank} world={world} checks={c.count}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    main()
