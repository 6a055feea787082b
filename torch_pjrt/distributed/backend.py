"""The ``pjrt`` process group: torch.distributed collectives on pjrt tensors.

A Python subclass of ``torch.distributed.ProcessGroup`` (PyTorch lets Python implement
a process group, not a per-device ``Backend``). ``init_process_group`` returns it as the
group itself, so it serves every device type:

- pjrt tensors: JAX collectives across the processes' devices
  (:mod:`torch_pjrt.distributed.collectives`), written back into the output tensors;
- CPU tensors, ``barrier``, and ``send``/``recv``: a gloo process group made beside it
  (``send``/``recv`` of pjrt tensors copy through host memory: correct but slow).

Collectives are asynchronous in JAX's sense: the work is dispatched and the output
tensors hold the (future) result, so ``async_op=True`` returns a completed work handle
and later reads of the outputs wait for the values.

Before each pjrt collective the ranks agree on it (:mod:`torch_pjrt.distributed.faults`):
a rank that raised, died or hangs, or a collective that differs across ranks, raises
``DistBackendError`` naming the ranks instead of hanging.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions, ReduceOp, _create_work_from_future
from torch.futures import Future

from torch_pjrt import runtime
from torch_pjrt.device import tensor as pjrt_tensor
from torch_pjrt.distributed import collectives, faults, functional
from torch_pjrt.modes import capture, fused

__all__ = ["PjrtProcessGroup", "create"]

_OPS = {
    ReduceOp.SUM: "sum",
    ReduceOp.AVG: "avg",
    ReduceOp.PRODUCT: "product",
    ReduceOp.MIN: "min",
    ReduceOp.MAX: "max",
    ReduceOp.BAND: "band",
    ReduceOp.BOR: "bor",
    ReduceOp.BXOR: "bxor",
}

_DTYPES = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
)
_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _done(result) -> dist.Work:
    fut = Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


class _HostRecvWork(dist.Work):
    """A gloo receive into a host buffer; ``wait`` copies it into the pjrt tensor."""

    def __init__(self, work, host: torch.Tensor, target: torch.Tensor):
        super().__init__()
        self._work, self._host, self._target = work, host, target
        self._lock = threading.Lock()
        self._copied = False

    def _finish(self) -> None:
        with self._lock:
            if not self._copied:
                self._target.copy_(self._host)
                self._copied = True

    def wait(self, timeout: timedelta | None = None) -> bool:
        if timeout is None:
            self._work.wait()
        else:
            self._work.wait(timeout)
        self._finish()
        return True

    def is_completed(self) -> bool:
        return self._copied

    def is_success(self) -> bool:
        return self._copied

    def source_rank(self) -> int:
        return self._work._source_rank()

    def _source_rank(self) -> int:
        return self._work._source_rank()

    def result(self) -> list[torch.Tensor]:
        return [self._target]

    def get_future(self) -> Future:
        self.wait()
        fut = Future()
        fut.set_result([self._target])
        return fut


class PjrtProcessGroup(dist.ProcessGroup):
    """torch.distributed's collectives for pjrt tensors (CPU tensors go to gloo)."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta, ranks=None):
        super().__init__(rank, size)
        if not runtime.is_initialized():  # launchers without torchrun's environment
            from torch_pjrt.config import settings
            from torch_pjrt.runtime import launch

            launch.init_jax_from_store(store, rank, size, settings.platform)
        runtime.init()  # starts JAX's multi-process runtime under torchrun
        functional.register()  # _c10d_functional ops (functional collectives) on pjrt
        self._ranks = tuple(ranks) if ranks else tuple(range(size))
        self._gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", store), rank, size, timeout)
        # agreement before each collective: mismatches and failed ranks raise, never hang
        self._checker = None
        if faults.checks_enabled():
            self._checker = faults.CollectiveChecker(
                store, rank, size, self._ranks, faults.collective_timeout(timeout)
            )
        self._meshes: dict[int, tuple] = {}
        self._group_name = ""
        self._group_desc = ""

    # --- naming -----------------------------------------------------------------------
    # PyTorch's C++ ProcessGroup keeps its name in its per-device backends, which a Python
    # group has none of; the name resolves the group for functional collectives.

    def getGroupName(self) -> str:  # noqa: N802 (PyTorch's name)
        return self._group_name

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._group_name = name

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._group_desc = desc

    def getBackendName(self) -> str:  # noqa: N802 (PyTorch's name)
        return "pjrt"

    def name(self) -> str:
        return "pjrt"

    # --- helpers ----------------------------------------------------------------------

    def _devices(self, index: int) -> tuple:
        """The JAX devices of the group's ranks, in group rank order, at local ``index``."""
        found = self._meshes.get(index)
        if found is None:
            import jax

            by_process: dict[int, list] = {}
            for d in jax.devices(runtime.device(index).platform):
                by_process.setdefault(d.process_index, []).append(d)
            missing = [r for r in self._ranks if r not in by_process]
            if missing:
                raise RuntimeError(
                    f"pjrt process group: JAX has no devices for rank(s) {missing} "
                    f"(jax.process_count() is {jax.process_count()}): this process used a pjrt "
                    "device before init_process_group, so JAX started as a single process. "
                    "Call init_process_group('pjrt') before the first pjrt tensor, or launch "
                    "with torchrun (see docs/distributed.md)."
                )
            local = runtime.local_index(index)  # pjrt:LOCAL_RANK may be this process's 0
            found = tuple(sorted(by_process[r], key=lambda d: d.id)[local] for r in self._ranks)
            if found[self.rank()] != runtime.device(index):
                raise RuntimeError(
                    f"pjrt process group: rank {self.rank()}'s pjrt:{index} is "
                    f"{runtime.device(index)}, but JAX places rank {self.rank()} on "
                    f"{found[self.rank()]}"
                )
            self._meshes[index] = found
        return found

    @staticmethod
    def _check(name: str, tensors, reduce=None) -> None:
        for t in tensors:
            if t.dtype not in _DTYPES:
                raise RuntimeError(f"pjrt process group: {name} does not support dtype {t.dtype}")
        if reduce is None:
            return
        dtype = tensors[0].dtype
        if reduce == "avg" or isinstance(reduce, tuple):  # (tuple: PREMUL_SUM)
            if dtype not in _FLOATS:
                which = "AVG" if reduce == "avg" else "PREMUL_SUM"
                raise RuntimeError(
                    f"pjrt process group: {name} with ReduceOp.{which} needs a floating point "
                    f"tensor, got {dtype}"
                )
        if reduce in ("band", "bor", "bxor") and dtype in _FLOATS:
            raise RuntimeError(
                f"pjrt process group: {name} with a bitwise ReduceOp needs an integer or bool "
                f"tensor, got {dtype}"
            )
        if dtype == torch.bool and reduce in ("sum", "product"):
            raise RuntimeError(
                f"pjrt process group: {name} of bool tensors supports MIN, MAX, BAND, BOR and BXOR"
            )

    @staticmethod
    def _reduction(name: str, op):
        """The collectives' name of a reduction: a string, or ("premul_sum", factor) for
        ``ReduceOp.PREMUL_SUM(factor)`` (each rank's input times the factor, summed)."""
        for key, kind in _OPS.items():
            if op == key:
                return kind
        if getattr(op, "op", None) == ReduceOp.RedOpType.PREMUL_SUM:
            factor = op.factor  # a float, or a one-element tensor (read on the host)
            return ("premul_sum", float(factor.item() if torch.is_tensor(factor) else factor))
        which = getattr(getattr(op, "op", op), "name", op)
        raise RuntimeError(f"pjrt process group: {name} does not support ReduceOp.{which}")

    @staticmethod
    def _is_pjrt(tensors) -> bool:
        kinds = {t.device.type for t in tensors}
        if kinds == {"pjrt"}:
            return True
        if kinds <= {"cpu"}:
            return False
        raise RuntimeError(
            "pjrt process group: a collective's tensors must all be pjrt tensors or all CPU "
            f"tensors, got {sorted(kinds)}"
        )

    def _agree(self, name: str, source: torch.Tensor | None = None, extra=None) -> None:
        """Every rank calls the same collective here, or all raise (faults.py)."""
        if self._checker is not None:
            what = name if source is None else faults.describe(name, source, extra)
            self._checker.check(what)

    def _run(self, op: str, source: torch.Tensor, extra=None, name: str | None = None):
        self._agree(name or op, source, extra)
        index = source.device.index or 0
        if fused.capturing and capture.active(index) is not None:
            return self._record(op, source, index, extra, name or op)
        return collectives.run(op, pjrt_tensor.read(source), self._devices(index), extra)

    def _record(self, op: str, source: torch.Tensor, index: int, extra, name: str):
        """The collective as one op of a graph capture (``modes/capture.py``): the captured
        graph becomes one rank's part of an SPMD program over the group's devices, and
        its replay runs the collective inside the one program."""
        if op not in ("all_reduce", "broadcast"):
            fused.capture_refuse(index, f"runs the collective {name}, which cannot be captured")
        import jax

        from torch_pjrt.distributed import compiled

        devices = self._devices(index)
        capture.active(index).use_mesh(
            devices, compiled.spmd_replay, compiled.to_global, compiled.to_local
        )
        value = pjrt_tensor.argument(source, True)
        shape = jax.ShapeDtypeStruct(value.shape, value.dtype)
        fn = collectives.per_rank(op, len(devices), extra)
        return fused.record(fn, (value,), index, name, out=shape)

    @staticmethod
    def _one(name: str, tensors) -> torch.Tensor:
        if len(tensors) != 1:
            raise RuntimeError(
                f"pjrt process group: {name} takes one tensor per process, got {len(tensors)}"
            )
        return tensors[0]

    # --- collectives ------------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        opts = dist.AllreduceOptions() if opts is None else opts
        if not self._is_pjrt(tensors):
            return self._gloo.allreduce(tensors, opts)
        kind = self._reduction("all_reduce", opts.reduceOp)
        t = self._one("all_reduce", tensors)
        self._check("all_reduce", [t], kind)
        # (a collective's result is a new array: the tensor owns it, and a graph replay
        # may reuse its buffer)
        pjrt_tensor.write(t, self._run("all_reduce", t, kind), owned=True)
        return _done(tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        """One all_reduce per tensor, the same op for all."""
        if not self._is_pjrt(tensors):
            return self._gloo.allreduce_coalesced(tensors, opts)
        single = dist.AllreduceOptions()
        single.reduceOp = ReduceOp.SUM if opts is None else opts.reduceOp
        for t in tensors:
            self.allreduce([t], single)
        return _done(tensors)

    def reduce(self, tensors, opts=None):
        """An all_reduce whose result only the root keeps (the same program)."""
        opts = dist.ReduceOptions() if opts is None else opts
        if not self._is_pjrt(tensors):
            return self._gloo.reduce(tensors, opts)
        kind = self._reduction("reduce", opts.reduceOp)
        t = self._one("reduce", tensors)
        self._check("reduce", [t], kind)
        value = self._run("all_reduce", t, kind, name="reduce")
        if self.rank() == opts.rootRank:
            pjrt_tensor.write(t, value)
        return _done(tensors)

    def gather(self, output_tensors, input_tensors, opts=None):
        """An all_gather whose result only the root keeps (the same program)."""
        opts = dist.GatherOptions() if opts is None else opts
        if not self._is_pjrt(input_tensors + [o for outs in output_tensors for o in outs]):
            return self._gloo.gather(output_tensors, input_tensors, opts)
        t = self._one("gather", input_tensors)
        n = self.size()
        self._check("gather", [t])
        gathered = self._run("all_gather", t, (n, *t.shape), name="gather")
        if self.rank() == opts.rootRank:
            outs = self._one("gather", output_tensors)
            if len(outs) != n or any(o.shape != t.shape or o.dtype != t.dtype for o in outs):
                raise RuntimeError(
                    f"pjrt process group: gather needs {n} output tensors of the input's "
                    "shape and dtype on the destination rank"
                )
            for i, o in enumerate(outs):
                pjrt_tensor.write(o, gathered[i])
        return _done(output_tensors)

    def scatter(self, output_tensors, input_tensors, opts=None):
        """A broadcast of the root's stacked inputs; each rank keeps its own block."""
        opts = dist.ScatterOptions() if opts is None else opts
        inputs = [t for ts in input_tensors for t in ts]
        if not self._is_pjrt([*output_tensors, *inputs]):
            return self._gloo.scatter(output_tensors, input_tensors, opts)
        out = self._one("scatter", output_tensors)
        n, root = self.size(), int(opts.rootRank)
        self._check("scatter", [out])
        if self.rank() == root:
            if len(inputs) != n or any(
                i.shape != out.shape or i.dtype != out.dtype for i in inputs
            ):
                raise RuntimeError(
                    f"pjrt process group: scatter needs {n} input tensors of the output's "
                    "shape and dtype on the source rank"
                )
            stacked = torch.stack(inputs)
        else:
            stacked = out.new_zeros((n, *out.shape))
        pjrt_tensor.write(out, self._run("broadcast", stacked, root, name="scatter")[self.rank()])
        return _done(output_tensors)

    def broadcast(self, tensors, opts=None):
        opts = dist.BroadcastOptions() if opts is None else opts
        if not self._is_pjrt(tensors):
            return self._gloo.broadcast(tensors, opts)
        t = self._one("broadcast", tensors)
        self._check("broadcast", [t])
        pjrt_tensor.write(t, self._run("broadcast", t, int(opts.rootRank)), owned=True)
        return _done(tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        opts = AllgatherOptions() if opts is None else opts
        if not self._is_pjrt(input_tensors):
            return self._gloo.allgather(output_tensors, input_tensors, opts)
        t = self._one("all_gather", input_tensors)
        outs = self._one("all_gather", output_tensors)
        n = self.size()
        if len(outs) != n or any(o.shape != t.shape or o.dtype != t.dtype for o in outs):
            raise RuntimeError(
                f"pjrt process group: all_gather needs {n} output tensors of the input's shape "
                "and dtype"
            )
        self._check("all_gather", [t])
        gathered = self._run("all_gather", t, (n, *t.shape))
        for i, o in enumerate(outs):
            pjrt_tensor.write(o, gathered[i])
        return _done(output_tensors)

    def all_gather_single(self, output, input, opts=None):  # noqa: A002
        opts = AllgatherOptions() if opts is None else opts
        if not self._is_pjrt([output, input]):
            return self._gloo._allgather_base(output, input, opts)
        n = self.size()
        if output.numel() != n * input.numel() or output.dtype != input.dtype:
            raise RuntimeError(
                "pjrt process group: all_gather_into_tensor needs an output of world size "
                f"({n}) times the input's elements and the same dtype; got {tuple(output.shape)} "
                f"{output.dtype} for input {tuple(input.shape)} {input.dtype}"
            )
        self._check("all_gather_into_tensor", [input])
        value = self._run("all_gather", input, tuple(output.shape), name="all_gather_into_tensor")
        pjrt_tensor.write(output, value)
        return _done([output])

    _allgather_base = all_gather_single

    def reduce_scatter_single(self, output, input, opts=None):  # noqa: A002
        opts = dist.ReduceScatterOptions() if opts is None else opts
        if not self._is_pjrt([output, input]):
            return self._gloo._reduce_scatter_base(output, input, opts)
        n = self.size()
        kind = self._reduction("reduce_scatter_tensor", opts.reduceOp)
        if input.numel() != n * output.numel() or output.dtype != input.dtype:
            raise RuntimeError(
                "pjrt process group: reduce_scatter_tensor needs an input of world size "
                f"({n}) times the output's elements and the same dtype; got input "
                f"{tuple(input.shape)} {input.dtype} for output {tuple(output.shape)} "
                f"{output.dtype}"
            )
        self._check("reduce_scatter_tensor", [input], kind)
        value = self._run(
            "reduce_scatter", input, (kind, tuple(output.shape)), name="reduce_scatter_tensor"
        )
        pjrt_tensor.write(output, value)
        return _done([output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = dist.ReduceScatterOptions() if opts is None else opts
        output = self._one("reduce_scatter", output_tensors)
        inputs = self._one("reduce_scatter", input_tensors)
        if not self._is_pjrt([output, *inputs]):
            return self._gloo.reduce_scatter(output_tensors, input_tensors, opts)
        if len(inputs) != self.size() or any(
            i.shape != output.shape or i.dtype != output.dtype for i in inputs
        ):
            raise RuntimeError(
                f"pjrt process group: reduce_scatter needs {self.size()} inputs of the "
                "output's shape and dtype"
            )
        return self.reduce_scatter_single(output, torch.stack(inputs), opts)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):  # noqa: A002
        opts = dist.AllToAllOptions() if opts is None else opts
        if not self._is_pjrt([output, input]):
            return self._gloo.alltoall_base(
                output, input, output_split_sizes, input_split_sizes, opts
            )
        n = self.size()
        rows = input.shape[0] if input.dim() else 0
        even = [rows // n] * n
        if (
            (output_split_sizes and list(output_split_sizes) != even)
            or (input_split_sizes and list(input_split_sizes) != even)
            or input.dim() == 0
            or rows % n
        ):
            raise RuntimeError(
                "pjrt process group: all_to_all_single supports only equal splits of dim 0 "
                f"(dim 0 divisible by the world size {n}); got input {tuple(input.shape)}, "
                f"input_split_sizes={list(input_split_sizes)}, "
                f"output_split_sizes={list(output_split_sizes)}"
            )
        if output.shape != input.shape or output.dtype != input.dtype:
            raise RuntimeError(
                "pjrt process group: all_to_all_single needs an output of the input's shape "
                "and dtype"
            )
        self._check("all_to_all_single", [input])
        pjrt_tensor.write(output, self._run("all_to_all", input, name="all_to_all_single"))
        return _done([output])

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors, input_tensors, opts=None):
        opts = dist.AllToAllOptions() if opts is None else opts
        if not self._is_pjrt([*output_tensors, *input_tensors]):
            return self._gloo.alltoall(output_tensors, input_tensors, opts)
        n = self.size()
        first = input_tensors[0] if input_tensors else None
        if (
            len(input_tensors) != n
            or len(output_tensors) != n
            or any(t.shape != first.shape or t.dtype != first.dtype for t in input_tensors)
            or any(t.shape != first.shape or t.dtype != first.dtype for t in output_tensors)
        ):
            raise RuntimeError(
                f"pjrt process group: all_to_all supports {n} input and {n} output tensors of "
                "one shape and dtype"
            )
        self._check("all_to_all", input_tensors)
        stacked = torch.stack(input_tensors).reshape(n, -1)
        value = self._run("all_to_all", stacked).reshape((n, *first.shape))
        for i, o in enumerate(output_tensors):
            pjrt_tensor.write(o, value[i])
        return _done(output_tensors)

    def barrier(self, opts=None):
        self._agree("barrier")
        return self._gloo.barrier(dist.BarrierOptions())

    # --- point to point (through host memory) --------------------------------------

    def send(self, tensors, dst: int, tag: int = 0):
        t = self._one("send", tensors)
        if t.device.type != "pjrt":
            return self._gloo.send(tensors, dst, tag)
        host = t.detach().to("cpu").contiguous()
        work = self._gloo.send([host], dst, tag)
        return _KeepAlive(work, host)

    def recv(self, tensors, src: int, tag: int = 0):
        t = self._one("recv", tensors)
        if t.device.type != "pjrt":
            return self._gloo.recv(tensors, src, tag)
        host = torch.empty(t.shape, dtype=t.dtype)
        return _HostRecvWork(self._gloo.recv([host], src, tag), host, t)

    def recv_anysource(self, tensors, tag: int = 0):
        t = self._one("recv", tensors)
        if t.device.type != "pjrt":
            return self._gloo.recv_anysource(tensors, tag)
        host = torch.empty(t.shape, dtype=t.dtype)
        return _HostRecvWork(self._gloo.recv_anysource([host], tag), host, t)

    def shutdown(self) -> None:
        if self._checker is not None:
            self._checker.shutdown()
        self._gloo.shutdown()

    def abort(self) -> None:
        if self._checker is not None:
            self._checker.abort()
        self._gloo.abort()


class _KeepAlive(dist.Work):
    """A gloo send whose host buffer must live until it completes."""

    def __init__(self, work, host: torch.Tensor):
        super().__init__()
        self._work, self._host = work, host

    def wait(self, timeout: timedelta | None = None) -> bool:
        return self._work.wait() if timeout is None else self._work.wait(timeout)

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def is_success(self) -> bool:
        return self._work.is_success()

    def get_future(self) -> Future:
        return self._work.get_future()


def create(backend_opts, pg_options=None) -> PjrtProcessGroup:
    """The creator ``Backend.register_backend`` calls (extended API)."""
    return PjrtProcessGroup(
        backend_opts.store,
        backend_opts.group_rank,
        backend_opts.group_size,
        backend_opts.timeout,
        backend_opts.global_ranks_in_group,
    )
