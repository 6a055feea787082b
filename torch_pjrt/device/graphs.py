"""``torch.pjrt.Graph``, ``torch.pjrt.graph`` and ``torch.pjrt.make_graphed_callables``:
torch.cuda.graphs' API over pjrt's capture and replay (``torch_pjrt.modes.capture``).

A capture records the region's ops (forward, backward, optimizer step) without running
them; :meth:`Graph.replay` runs them as one XLA program over the same tensors: the
tensors the region read are its inputs (fill them with ``copy_`` before a replay), the
tensors it wrote hold the new values after it. See docs/graphs.md.

Example:
    >>> g = torch.pjrt.Graph()
    >>> with torch.pjrt.graph(g):
    ...     static_loss = loss_fn(model(static_x), static_y)
    ...     static_loss.backward()
    ...     opt.step()
    >>> for x, y in batches:
    ...     static_x.copy_(x); static_y.copy_(y)
    ...     g.replay()
"""

from __future__ import annotations

import itertools
from pathlib import Path

import torch
from torch.utils import _pytree

from torch_pjrt.device import random as pjrt_random
from torch_pjrt.modes import capture

__all__ = [
    "Graph",
    "graph",
    "graph_pool_handle",
    "is_current_stream_capturing",
    "make_graphed_callables",
]

_pools = itertools.count(1)


def graph_pool_handle() -> tuple[int, int]:
    """A token that graphs captured with it share, as ``torch.cuda.graph_pool_handle()``.

    pjrt has no graph memory pools to share: XLA allocates each program's buffers, and a
    replay reuses the buffers of the tensors it overwrites (donation). The token is
    accepted everywhere torch.cuda takes one, and changes nothing."""
    return (0, next(_pools))


def is_current_stream_capturing() -> bool:
    """True while a graph is being captured on the current pjrt device."""
    return capture.active(pjrt_random.current_device()) is not None


class Graph:
    """A captured pjrt graph: ``torch.cuda.CUDAGraph``'s API.

    Args:
        keep_graph: accepted for torch.cuda's signature: the captured program is always
            kept (it compiles at the first replay, or at :meth:`instantiate`).
    """

    def __init__(self, keep_graph: bool = False):
        self.keep_graph = keep_graph
        self._capture = None
        self._captured = None
        self._pool = None

    def capture_begin(self, pool=None, capture_error_mode: str = "global", **_) -> None:
        """Begin capturing the ops of the current pjrt device (every thread's: the
        backward pass runs in autograd's threads). Use :class:`graph` rather than this."""
        if self._captured is not None:
            raise RuntimeError(
                "This Graph instance already holds a captured graph. Call reset() to "
                "capture a new one, or make a new torch.pjrt.Graph()."
            )
        _check_error_mode(capture_error_mode)
        index = pjrt_random.current_device()
        self._pool = pool if pool is not None else graph_pool_handle()
        _watch_optimizers()
        self._capture = capture.begin(index, pjrt_random.offset(index))

    def capture_end(self) -> None:
        """End the capture: the graph can be replayed. Tensors keep the values they
        had before the capture (the captured work has not run); tensors made during the
        capture hold their values from the first replay on."""
        c = self._capture
        if c is None:
            raise RuntimeError("Graph.capture_end() called without a capture_begin()")
        self._capture = None
        if capture.active(c.index) is not c:
            raise RuntimeError(
                "the graph capture was abandoned by an error during it (raised where it "
                "happened); nothing was captured"
            )
        self._captured = c.end()
        pjrt_random.set_offset(c.index, c.rng_offset)  # the capture drew no numbers

    def _abort(self) -> None:
        c, self._capture = self._capture, None
        if c is not None:
            c.abort()
            pjrt_random.set_offset(c.index, c.rng_offset)

    def instantiate(self) -> None:
        """Compile the captured program now rather than at the first replay."""
        self._check()

    def replay(self) -> None:
        """Run the captured work once, as one XLA program on the device it was captured
        on: the captured tensors' current values in, the written tensors updated."""
        captured = self._check()
        if capture.active() is not None:
            raise capture.CaptureError(
                "pjrt graph capture: Graph.replay() during another graph's capture (begun "
                f"at {capture.active().line}) cannot be captured; replay it outside"
            )
        seed, offset = pjrt_random.advance(captured.index, captured.random_ops)
        captured.replay(seed, offset)

    def reset(self) -> None:
        """Drop the captured graph; the instance may capture again."""
        if self._capture is not None:
            self._abort()
        self._captured = None

    def pool(self) -> tuple[int, int]:
        """This graph's pool token (see :func:`graph_pool_handle`)."""
        if self._pool is None:
            self._pool = graph_pool_handle()
        return self._pool

    def enable_debug_mode(self) -> None:
        """Keep the program for :meth:`debug_dump` (it always is)."""

    def debug_dump(self, debug_path: str) -> None:
        """Write the captured program (StableHLO text) to ``debug_path``."""
        lowered = self._check().lower()
        Path(debug_path).write_text(lowered.as_text())

    def _check(self):
        if self._captured is None:
            raise RuntimeError("Called Graph.replay() without a preceding successful capture.")
        return self._captured

    def __repr__(self) -> str:
        c = self._captured
        if c is None:
            return "torch.pjrt.Graph(not captured)"
        return (
            f"torch.pjrt.Graph({len(c.nodes)} ops on pjrt:{c.index}, captured at {c.line}, "
            f"{c.replays} replays)"
        )


def _check_error_mode(mode: str) -> None:
    if mode not in ("global", "thread_local", "relaxed", "default"):
        raise ValueError(
            "capture_error_mode must be 'global', 'thread_local', 'relaxed' or 'default', "
            f"but got {mode!r}"
        )


class graph:
    """Capture the ops of a ``with`` block into ``pjrt_graph``: ``torch.cuda.graph``.

    Args:
        pjrt_graph: the :class:`Graph` to capture into.
        pool: a token from :func:`graph_pool_handle` or ``Graph.pool()`` (accepted;
            pjrt shares no pools).
        stream: accepted for torch.cuda's signature (pjrt has one stream per device).
        capture_error_mode: accepted (``"global"``, ``"thread_local"``, ``"relaxed"``):
            pjrt refuses what it cannot capture in every thread.

    An exception inside the block abandons the capture (tensors keep their values) and
    propagates.
    """

    def __init__(self, pjrt_graph: Graph, pool=None, stream=None, capture_error_mode="global", **_):
        if not isinstance(pjrt_graph, Graph):
            raise TypeError(
                f"torch.pjrt.graph takes a torch.pjrt.Graph, got {type(pjrt_graph).__name__}"
            )
        self.pjrt_graph = pjrt_graph
        self.pool = pool
        self.capture_error_mode = capture_error_mode

    def __enter__(self) -> None:
        self.pjrt_graph.capture_begin(self.pool, self.capture_error_mode)

    def __exit__(self, kind, value, tb) -> None:
        if kind is not None:
            self.pjrt_graph._abort()
            return
        self.pjrt_graph.capture_end()


# --- optimizers ----------------------------------------------------------------------

_watching = [False]


def _watch_optimizers() -> None:
    """From the first capture on, an optimizer step during a capture is checked: one
    that keeps its step count on the CPU (``capturable=False``) would bake this step's
    count into the graph, and every replay would apply the same bias correction."""
    if _watching[0]:
        return
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    register_optimizer_step_pre_hook(_check_capturable)
    _watching[0] = True


def _check_capturable(optimizer, args, kwargs) -> None:
    if capture.active() is None:
        return
    for group in optimizer.param_groups:
        if group.get("capturable") is False and not group.get("fused"):
            raise capture.CaptureError(
                f"pjrt graph capture: {type(optimizer).__name__}.step() with "
                "capturable=False keeps its step count on the CPU, so every replay would "
                f"repeat this step's bias correction. Make the optimizer with "
                f"{type(optimizer).__name__}(..., capturable=True) (or fused=True) to "
                "capture its step, as with CUDA graphs."
            )


# --- make_graphed_callables ------------------------------------------------------------


def make_graphed_callables(
    callables,
    sample_args,
    num_warmup_iters: int = 3,
    allow_unused_input: bool = False,
    pool=None,
):
    """Graphed versions of functions or modules: ``torch.cuda.make_graphed_callables``.

    Each callable's forward pass becomes one captured graph and its backward pass
    another, inside one autograd node; calling the result copies the arguments into
    the captured inputs and replays. Arguments must have the shapes, dtypes and
    ``requires_grad`` of ``sample_args``; a module keeps its original forward for the
    other training mode (``eval()`` when it was graphed in ``train()``).

    Args:
        callables: a callable or module, or a tuple of them.
        sample_args: a tuple of tensors for each callable (a tuple of such tuples).
        num_warmup_iters: forward and backward passes run before the capture.
        allow_unused_input: allow inputs that do not affect the outputs (their
            gradients are None).
        pool: accepted (see :func:`graph_pool_handle`).
    """
    if torch.is_autocast_enabled() and torch.is_autocast_cache_enabled():
        raise RuntimeError(
            "make_graphed_callables does not support the autocast caching. Please set "
            "`cache_enabled=False`."
        )
    just_one = not isinstance(callables, tuple)
    if just_one:
        callables, sample_args = (callables,), (sample_args,)
    if len(callables) != len(sample_args):
        raise ValueError(
            f"make_graphed_callables got {len(callables)} callables and "
            f"{len(sample_args)} tuples of sample arguments; they pair one to one"
        )
    graphed = [
        _graph_one(fn, args, num_warmup_iters, allow_unused_input)
        for fn, args in zip(callables, sample_args)
    ]
    return graphed[0] if just_one else tuple(graphed)


def _graph_one(fn, sample_args, warmup: int, allow_unused: bool):
    flat_args, args_spec = _pytree.tree_flatten(sample_args)
    for a in flat_args:
        if not isinstance(a, torch.Tensor) or a.device.type != "pjrt":
            raise TypeError(
                "make_graphed_callables: sample arguments must be pjrt tensors, got "
                f"{type(a).__name__ if not isinstance(a, torch.Tensor) else a.device}"
            )
    module = fn if isinstance(fn, torch.nn.Module) else None
    if module is not None and (
        module._backward_hooks or module._forward_hooks or module._forward_pre_hooks
    ):
        raise RuntimeError(
            "make_graphed_callables: a module with registered hooks cannot be graphed "
            "(the hooks would run at capture only)"
        )
    params = tuple(module.parameters()) if module is not None else ()
    surface = tuple(flat_args) + params  # what the graph reads
    wants_grad = [t.requires_grad for t in surface]

    ins = [t for t, w in zip(surface, wants_grad) if w]

    def grads_of(outputs, grad_outputs=None):
        """The gradients of the surface's tensors that want them (``grad_outputs``: of
        the outputs that need grad; ones when None)."""
        outs = [o for o in outputs if o.requires_grad]
        if not outs or not ins:
            return ()
        if grad_outputs is None:
            grad_outputs = [torch.ones_like(o) for o in outs]
        return torch.autograd.grad(
            outs, ins, grad_outputs=grad_outputs, only_inputs=True, allow_unused=allow_unused
        )

    for _ in range(warmup):
        grads_of(_pytree.tree_leaves(fn(*sample_args)))
    fwd = Graph()
    with graph(fwd):
        static_out = fn(*sample_args)
    flat_out, out_spec = _pytree.tree_flatten(static_out)
    flat_out = tuple(flat_out)
    needs = [o.requires_grad for o in flat_out]
    static_grad_out = tuple(torch.empty_like(o) if w else None for o, w in zip(flat_out, needs))
    bwd = Graph()
    with graph(bwd):
        grads = grads_of(flat_out, [g for g in static_grad_out if g is not None])
    grads = iter(grads)
    static_grad_in = tuple(next(grads) if w else None for w in wants_grad)
    n_args = len(flat_args)

    class Graphed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            for static, new in zip(flat_args, inputs[:n_args]):
                if static.data_ptr() != new.data_ptr():
                    static.copy_(new)
            fwd.replay()
            return tuple(o.detach() for o in flat_out)

        @staticmethod
        def backward(ctx, *grad_outputs):
            for static, g in zip(static_grad_out, grad_outputs):
                if static is not None and g is not None:
                    static.copy_(g)
            bwd.replay()
            return tuple(None if g is None else g.detach() for g in static_grad_in)

    def graphed(*args, **kwargs):
        if kwargs:
            raise TypeError("a graphed callable takes positional tensor arguments only")
        flat, spec = _pytree.tree_flatten(args)
        if spec != args_spec or len(flat) != n_args:
            raise TypeError(
                f"a graphed callable was captured with arguments {args_spec}, got {spec}"
            )
        for i, (new, static) in enumerate(zip(flat, flat_args)):
            if (
                not isinstance(new, torch.Tensor)
                or new.shape != static.shape
                or new.dtype != static.dtype
                or new.device != static.device
            ):
                got = (
                    f"{new.dtype}{list(new.shape)} on {new.device}"
                    if isinstance(new, torch.Tensor)
                    else type(new).__name__
                )
                raise RuntimeError(
                    f"a graphed callable's argument {i} is {got}, but it was captured with "
                    f"{static.dtype}{list(static.shape)} on {static.device}: a graph "
                    "replays on the shapes it was captured with. Graph another callable "
                    "for the new shape."
                )
        out = Graphed.apply(*flat, *params)
        return _pytree.tree_unflatten(list(out), out_spec)

    if module is None:
        return graphed
    training = module.training
    original = module.forward

    def forward(*args, **kwargs):
        if module.training == training:
            return graphed(*args, **kwargs)
        return original(*args, **kwargs)

    module.forward = forward
    return module
