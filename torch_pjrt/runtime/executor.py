"""The one executor: every XLA program torch_pjrt runs goes through a :class:`Program`.

A client describes *what* to run: the eager kernel of an op (one program per op and
static arguments), a fused recording (one program per recorded op sequence), a compiled
graph (one per graph and input signature). It hands the executor a ``build`` function
(key -> the traceable function and whether its first argument is donated) and a
``describe`` function (key and traced arguments -> ``(label, value)`` pairs). The
executor owns *how*, the same way for every client:

- one jitted program per key, traced at JAX's "highest" default matmul precision
  (:func:`traced_at_full_precision`);
- 64-bit types on for the call (``runtime.x64``), JAX's global setting left alone;
- placement: a program runs where its inputs are (unused ones included: jit would
  drop them and fall back to JAX's default device); a program with no array inputs
  puts its outputs on its device explicitly (``out_shardings``); one whose inputs mix
  one-device arrays with arrays laid out over a mesh (SPMD) has the one-device arrays
  replicated over the mesh *before* the call (:func:`align`), never as a retry after an
  exception;
- compilations: each trace is a compilation, counted in ``runtime.events`` (the
  counters of ``torch_pjrt.metrics``) with its cause, the first difference between the
  arguments it traced and those of the one before (``events.describe_change``); a
  program whose first call fails is not kept;
- errors: a failed call's exception gets a note naming the program and the user's line
  (clients that know more, such as the op's schema, add it);
- checks of values (``runtime.asserts``): a program whose trace stated checks returns
  an ``asserts.Checked`` (its results, the checks' arrays, what they mean). A top-level
  call hands the checks to ``asserts.expect`` and returns the results alone; a client
  that traces the program inside another one (a fused recording) gets the ``Checked``
  of pending values and does the same (``asserts.unpack``). The outputs of a call
  whose inputs came from a check not read yet, or one that failed, are marked as
  coming from it (``asserts.derive``): their reads raise its error if it failed.

The small programs of raw kernels (a view's gather, a cast, the zeros of a fresh
storage, a fused optimizer) are :func:`helper` programs: a function of static
arguments, one :class:`Program` per kind, counted in the ``helper`` scope; called
inside another trace (a fused recording, a compiled graph, a capture) a helper is
inlined into that program instead.

Example:
    >>> program = Program("eager", "double", lambda key: (lambda x: x * 2, False),
    ...                   lambda key, args: [("x", args[0].aval)])
    >>> program((), jnp.ones(3))   # compiles once ("double: first call"), then reuses
"""

from __future__ import annotations

import functools
import time
import weakref
from collections.abc import Callable

import jax
from jax._src.core import trace_state_clean
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

from torch_pjrt.runtime import asserts, platform, profiling, x64
from torch_pjrt.runtime import events as metrics
from torch_pjrt.runtime.asserts import _ArrayImpl
from torch_pjrt.runtime.profiling import torch_profiler as _torch_profiler

__all__ = [
    "Program",
    "align",
    "helper",
    "mesh_in_use",
    "on_device",
    "record_runs",
    "traced_at_full_precision",
    "use_meshes",
]

# NOTE: set by torch_pjrt.distributed.spmd when the first device mesh is made; until
# then no array is laid out over several devices and placement checks nothing.
mesh_in_use = False


def use_meshes() -> None:
    """Arrays may from now on be laid out over device meshes (SPMD)."""
    global mesh_in_use
    mesh_in_use = True
    asserts.one_device = False


def traced_at_full_precision(fn):
    """``fn`` for ``jax.jit``: while it traces, JAX's default precision of float32
    products is "highest". JAX's own default is fast (TF32 on recent NVIDIA GPUs, one
    bfloat16 pass on TPU), so a product a lowering leaves to JAX (inside a ``jnp.linalg``
    or ``jax.scipy`` function, or written without ``precision=``) would otherwise be
    less precise there than on the CPU. User-level products carry
    ``ops.linalg.matmul_precision()`` explicitly and keep following
    ``torch.set_float32_matmul_precision``. Every program is traced through this."""

    @functools.wraps(fn)
    def traced(*args, **kwargs):
        with jax.default_matmul_precision("highest"):
            return fn(*args, **kwargs)

    return traced


SCALARS = (bool, int, float, complex)  # (Python numbers: a program takes them by value)


def spec(leaf):
    """What a trace of a program (``jax.eval_shape``, ``jit(...).trace``) is given for an
    argument leaf: a Python number as it is, an array or pending value as its shape and
    dtype."""
    if leaf.__class__ in SCALARS:
        return leaf
    aval = leaf.aval
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type)


def on_device(index: int) -> SingleDeviceSharding:
    """The sharding that puts a program's outputs on pjrt device ``index``."""
    return SingleDeviceSharding(platform.device(index))


# ``fn(program, key, jitted, args) -> outputs``: runs every program in place of the plain
# call while set (the report's recorder, ``diagnostics/html_report.py``); see :func:`record_runs`
_recorder: Callable | None = None


def record_runs(fn: Callable | None) -> Callable | None:
    """Route every program run through ``fn(program, key, jitted, args)``, which must
    return ``jitted(*args)``'s outputs (None: plain calls again); returns the one before."""
    global _recorder
    previous, _recorder = _recorder, fn
    return previous


# An output of the last program issued, weakly (what an Event recorded now waits for: a
# device runs its programs in the order they were issued; torch_pjrt.device.streams)
issued = None


def _unknown():  # (what ``issued`` is after a program whose last output is no array:
    return None  # an Event then waits for every array of the device)


class Program:
    """One client's programs: a jitted XLA program per key, run and accounted alike.

    Args:
        scope: who runs it, for metrics: ``"eager"``, ``"fused"`` or ``"graph"``.
        name: the program's name in compile causes (an op, a graph).
        build: ``key -> (fn, donate)``: the function to trace for that key, and whether
            its first argument's buffers are donated to the outputs.
        describe: ``(key, traced arguments) -> [(label, value), ...]``: what a trace
            saw, compared with the previous trace to name a recompilation's cause.
        kind: a subdivision of the scope in metrics (``"forward"``, ``"backward"``).
        placed: ``key -> device index or None``: a device to put the outputs on
            explicitly (programs with no array inputs), else None (they follow the
            inputs).
        unchecked: ``key -> key``: the key of the same program traced without its value
            checks (itself for such a key); given, a call on inputs that passed the
            checks of its key already runs that one (``asserts.Passing``; a fused
            recording asks ``passed_key``).
        follows: whether a call marks its outputs with the unread or failed checks its
            inputs come from (``asserts.derive``); False for clients that do it
            themselves (a fused recording, op by op; a replay, from what it knows).
        contents: ``key -> [op name, ...]``: what the program of ``key`` holds, for
            profiler traces (``runtime.profiling``); default: its name.
    """

    __slots__ = (
        "scope",
        "name",
        "kind",
        "build",
        "describe",
        "placed",
        "cache",
        "traced",
        "last",
        "started",
        "lowered",
        "unchecked",
        "checked",
        "unread",
        "follows",
        "contents",
        "profiled",
        "numbered",
        "compiling",
        "calling",
        "__weakref__",
    )

    def __init__(
        self,
        scope: str,
        name: str,
        build: Callable,
        describe: Callable,
        kind: str | None = None,
        placed: Callable | None = None,
        unchecked: Callable | None = None,
        follows: bool = True,
        contents: Callable | None = None,
    ):
        self.scope = scope
        self.name = name
        self.kind = kind
        self.build = build
        self.describe = describe
        self.placed = placed
        self.cache: dict = {}
        self.traced = None  # what the last trace saw (set while jit traces)
        self.last = None  # what the trace before it saw
        self.started = 0.0  # when the last trace started
        self.lowered = False  # lower() traced: the next call compiles what it traced
        self.unchecked = unchecked
        # key of a program stating value checks -> (its unchecked key, the eager rules
        # of the layouts of arguments it was called with: asserts.Passing)
        self.checked: dict = {}
        # (key, argument shapes) -> the argument leaves whose values it does not read
        self.unread: dict = {}
        self.follows = follows
        self.contents = contents
        self.profiled: dict = {}  # key -> (label, attributes) in profiler traces
        self.numbered = 0  # programs of this name numbered in profiler traces so far
        self.compiling = None  # the profiler span of the compilation under way
        self.calling = False  # a profiled call is under way
        _programs.add(self)

    def jitted(self, key):
        """The jitted program of ``key`` (built on first use; compiled by its first call)."""
        found = self.cache.get(key)
        if found is None:
            found = self._build(key)
        return found

    def _build(self, key):
        fn, donate = self.build(key)
        describe = self.describe
        off = self.unchecked is not None and self.unchecked(key) == key

        def traced(*args):
            self.started = time.perf_counter()
            self.traced = describe(key, args)
            if self.calling:  # (a profiled call, not an outer trace inlining this one)
                self._compiling(key)
            with jax.default_matmul_precision("highest"), asserts.tracing(off) as checks:
                out = fn(*args)
            return checks.returning(out)

        traced.__name__ = traced.__qualname__ = getattr(fn, "__name__", self.name)
        # NOTE: keep_unused: jit drops arguments the program does not read (fill_'s
        # self), and a program left with no inputs runs on JAX's default device; kept,
        # they place it on their device
        options = {"keep_unused": True}
        if donate:
            options["donate_argnums"] = (0,)
        index = self.placed(key) if self.placed is not None else None
        if index is not None:
            options["out_shardings"] = on_device(index)
        jitted = self.cache[key] = jax.jit(traced, **options)
        return jitted

    def passed_key(self, key, args):
        """For a fused recording: the key to record on ``args``, its unchecked variant's
        when ``key``'s checks already passed on these very arrays (``asserts.passed``),
        else ``key``."""
        if key in self.checked and asserts.passed(self, key, args):
            return self.checked[key][0]
        return key

    def checks_made(self, key, args, fused: bool = False):
        """``key``'s program returned checks, called on ``args``: returns ``marks`` for
        ``asserts.unpack`` (None for a program without an unchecked variant), and keeps
        what the next calls need to know whether these inputs passed (the unchecked
        key; eagerly, the rule of these arguments' layout, ``asserts.Passing``).
        ``fused``: for a fused recording."""
        if self.unchecked is None:
            return None
        found = self.checked.get(key)
        if found is None:
            found = self.checked[key] = (self.unchecked(key), [])
        if fused:
            return lambda record: asserts.mark(self, key, args, record)
        rules = found[1]
        rule = next((r for r in rules if r.fits(args)), None)
        if rule is None:
            rule = asserts.Passing(self, self._jaxpr(key, args), args)
            if len(rules) >= 8:  # (a key called with ever new layouts: the newest kept)
                del rules[0]
            rules.append(rule)
        return lambda record: rule.mark(key, args, record)

    def values_read(self, key, args):
        """``args`` with the leaves whose values the program of ``key`` does not read
        (their shapes and dtypes alone: ``zero_``, ``fill_``, ``normal_`` on a tensor)
        replaced by None: what its results come from. Found once per key and argument
        shapes, from the program's jaxpr, for an op's or a helper's program (a compiled
        graph's outputs all come from all its inputs: its trace would cost about as much
        as its compilation)."""
        if self.scope != "eager" and self.scope != "helper":
            return args
        leaves, treedef = jax.tree_util.tree_flatten(args)
        shapes = tuple([x.__class__ if x.__class__ in SCALARS else x.aval for x in leaves])
        shapes = (key, treedef, shapes)
        unread = self.unread.get(shapes)
        if unread is None:
            unread = asserts.unread_leaves(self._jaxpr(key, args), len(leaves))
            if len(self.unread) >= 256:
                self.unread.clear()
            self.unread[shapes] = unread
        if not unread:
            return args
        for i in unread:
            leaves[i] = None
        return jax.tree_util.tree_unflatten(treedef, leaves)

    def _jaxpr(self, key, args):
        """The jaxpr of ``key``'s program on ``args``' shapes (a trace, not counted as a
        compilation of this program), or None where it cannot be traced."""
        state = self.traced, self.last, self.started
        prev = x64.on()
        try:
            return self.jitted(key).trace(*jax.tree_util.tree_map(spec, args)).jaxpr
        except Exception:  # noqa: BLE001  (then every argument counts as read)
            return None
        finally:
            x64.restore(prev)
            self.traced, self.last, self.started = state

    def __call__(self, key, *args):
        """Run the program of ``key`` on ``args`` (compiling it if these arguments are
        new to it); exceptions reach the caller, which knows what was being run."""
        found = self.checked.get(key)  # (of a key whose program checks)
        if found is not None:
            for rule in found[1]:  # (the rule of each layout of arguments seen)
                if rule.test(key, args, rule):
                    key = found[0]
                    break
        jitted = self.cache.get(key)
        if jitted is None:
            jitted = self._build(key)
        if self.lowered:  # (jit reuses the trace lower() made: it does not trace again)
            self.lowered = False
        else:
            self.traced = None
        prev = x64.on()
        try:
            if _torch_profiler._is_profiler_enabled:
                out = self._profiled(key, jitted, args)
            elif _recorder is None:
                out = jitted(*args)
            else:
                out = _recorder(self, key, jitted, args)
        except Exception as exc:
            if self.traced is not None:  # a program that failed to build is not kept
                self.cache.pop(key, None)
            if hasattr(exc, "add_note"):  # (Python 3.11+)
                exc.add_note(f"pjrt: in {self}, called at {metrics.user_line()}")
            raise
        finally:
            x64.restore(prev)
        if self.traced is not None:  # jit traced: a new XLA program was compiled
            self.compiled()
        # values computed from an unread or failed check's results are marked as theirs
        if self.follows and asserts.watching():
            results = out.results if out.__class__ is asserts.Checked else out
            asserts.derive(args, results, self, key)
        if out.__class__ is asserts.Checked:
            out = asserts.unpack(out, self.name, marks=self.checks_made(key, args))
        global issued
        last = out[-1] if out.__class__ in (tuple, list) and out else out
        issued = weakref.ref(last) if last.__class__ is _ArrayImpl else _unknown
        return out

    def profile_entry(self, key) -> tuple:
        """``(label, attributes)`` of the program of ``key`` in profiler traces: its
        name (numbered when the name stands for several programs, as a fused
        recording's) and what it holds; kept per key while profiled (or recorded by
        ``record_runs``' hook)."""
        entry = self.profiled.get(key)
        if entry is None:
            if len(self.profiled) >= 1024:  # (a long profile of ever new programs)
                self.profiled.clear()
            label = self.name
            if self.scope not in ("eager", "helper"):  # (one kernel: shapes alone differ)
                self.numbered += 1
                label = f"{self.name} #{self.numbered}"
            ops = [self.name] if self.contents is None else self.contents(key)
            attributes = {"scope": self.scope, "ops": profiling.contents(ops)}
            entry = self.profiled[key] = (label, attributes)
        return entry

    def _profiled(self, key, jitted, args):
        """``jitted(*args)`` in a ``pjrt::run`` span, a compilation it makes in a
        ``pjrt::compile`` span inside it."""
        label, attributes = self.profile_entry(key)
        with profiling.span(f"pjrt::run {label}", **attributes):
            self.calling = True
            try:
                return jitted(*args) if _recorder is None else _recorder(self, key, jitted, args)
            finally:
                self.calling = False
                if self.compiling is not None:
                    self.compiling.__exit__(None, None, None)
                    self.compiling = None

    def _compiling(self, key) -> None:
        """Open the compilation's profiler span (closed when the call returns)."""
        cause = metrics.describe_change(self.last, self.traced)
        label = self.profile_entry(key)[0]
        self.compiling = profiling.span(f"pjrt::compile {label}", cause=cause)
        self.compiling.__enter__()

    def compiled(self) -> None:
        """Count the compilation the last call made (from its trace on), with its cause."""
        cause = metrics.describe_change(self.last, self.traced)
        self.last = self.traced
        seconds = time.perf_counter() - self.started
        metrics.compilation(self.scope, self.kind, seconds, f"{self.name}: {cause}")
        global _until_check
        _until_check -= 1
        if _until_check <= 0:
            keep_mappings_in_bounds()

    def analysis(self, key, *specs) -> dict:
        """XLA's memory and cost analysis of the program of ``key`` for arguments like
        ``specs`` (``jax.ShapeDtypeStruct``s with their shardings): ``{"arguments",
        "outputs", "temporaries", "code"}`` in bytes, and ``"flops"`` (None where the
        platform does not say). Counts no compilation (the program is compiled anew,
        or found in JAX's cache)."""
        saved = self.traced, self.last, self.started, self.lowered
        prev = x64.on()
        try:
            compiled = self.jitted(key).lower(*specs).compile()
        finally:
            x64.restore(prev)
            self.traced, self.last, self.started, self.lowered = saved
        memory = compiled.memory_analysis()
        cost = compiled.cost_analysis() or {}
        if isinstance(cost, list):  # (older JAX: one dict per computation)
            cost = cost[0] if cost else {}
        return {
            "arguments": getattr(memory, "argument_size_in_bytes", None),
            "outputs": getattr(memory, "output_size_in_bytes", None),
            "temporaries": getattr(memory, "temp_size_in_bytes", None),
            "code": getattr(memory, "generated_code_size_in_bytes", None),
            "flops": cost.get("flops"),
        }

    def lower(self, key, *args):
        """The lowered program of ``key`` for ``args``, for dumps; the call that follows
        compiles it and counts the compilation."""
        self.traced = None
        prev = x64.on()
        try:
            lowered = self.jitted(key).lower(*args)
        finally:
            x64.restore(prev)
        self.lowered = self.traced is not None
        return lowered

    def __repr__(self) -> str:
        return f"the {self.scope} program {self.name}"


# --- the small programs of raw kernels ------------------------------------------------


class Helper:
    """``fn`` (made from static arguments) as a callable on arrays: run as the
    :class:`Program` of its statics, or inlined when called inside a trace."""

    __slots__ = ("program", "statics", "fn", "__weakref__")

    def __init__(self, program: Program, statics: tuple, fn: Callable):
        self.program, self.statics, self.fn = program, statics, fn

    def __call__(self, *args):
        if trace_state_clean():
            return self.program(self.statics, *args)
        return self.fn(*args)  # (inside a recording or a graph: part of that program)

    def __repr__(self) -> str:
        return f"{self.program.name}{self.statics}"


# --- the process's memory mappings ---------------------------------------------------
#
# Every compiled program stays loaded while its Program keeps it (one per key). XLA:CPU
# loads each kernel of a program as machine code in memory mappings of its own (about
# three per kernel, ~100 for a fused recording of a transformer step), and Linux allows a
# process vm.max_map_count of them (65530 by default): past it, XLA's next compilation
# crashes the process (SIGSEGV or SIGABRT in the compiler). So the count is read now and
# then (reading it costs ~20 ms at 30,000 mappings: the fewer held, the fewer reads,
# assuming at most MAPPINGS_PER_PROGRAM a compilation), and past MAPPINGS_SHARE of the
# limit the older half of every Program's programs is dropped (an eager op's one program
# holds an executable per input shape inside its jit), each compiled again if it is
# needed again (from the persistent cache, when it was worth persisting).

_programs: weakref.WeakSet = weakref.WeakSet()  # every Program
_until_check = 1  # compilations until the count is read again
MAPPINGS_SHARE = 0.8
MAPPINGS_PER_PROGRAM = 500  # (a fused recording of a transformer step: ~100)


@functools.cache
def mappings_limit() -> int | None:
    """The kernel's limit of memory mappings per process (None where it cannot be read:
    not Linux)."""
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def mappings() -> int | None:
    """How many memory mappings the process holds now (None where it cannot tell)."""
    try:
        with open("/proc/self/maps", "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return None


def keep_mappings_in_bounds() -> int:
    """Drop the older half of every Program's programs (rounded up) while the process
    holds more than ``MAPPINGS_SHARE`` of its mappings limit; returns how many were
    dropped."""
    global _until_check
    limit, held = mappings_limit(), mappings()
    if limit is None or held is None:
        _until_check = 1 << 62
        return 0
    room = limit * MAPPINGS_SHARE - held
    _until_check = max(4, int(room) // MAPPINGS_PER_PROGRAM)
    if room >= 0:
        return 0
    dropped = 0
    for program in list(_programs):
        cache = program.cache
        # (oldest first: insertion order; a lone key goes too: an eager op's program
        # holds an executable per input shape)
        for key in list(cache)[: (len(cache) + 1) // 2]:
            del cache[key]
            dropped += 1
    metrics.count("programs_dropped", dropped)
    metrics.tally("programs_dropped_at_mappings", str(held))
    return dropped


def _describe_helper(statics, args) -> list:
    signature = [("static arguments", statics)]
    signature += [(f"input {i}", getattr(a, "aval", a)) for i, a in enumerate(args)]
    return signature


def helper(name: str, make: Callable, placed: Callable | None = None, maxsize: int = 1024):
    """``statics -> Helper``: the programs ``make(*statics)`` of one raw kernel.

    Args:
        name: the kernel, in compile causes (``"view read"``).
        make: ``(*statics) -> fn``, the function on arrays for those static arguments.
        placed: as :class:`Program`'s, given the statics: the device of a program with
            no array inputs.
        maxsize: how many statics' helpers are kept.

    Example:
        >>> cast = helper("cast", lambda dtype: lambda v: v.astype(dtype))
        >>> cast(jnp.float16)(x)   # one program per dtype, counted as a compilation
    """

    @functools.lru_cache(maxsize=maxsize)
    def bound(*statics) -> Helper:
        return Helper(program, statics, make(*statics))

    def build(statics):
        return bound(*statics).fn, False

    where = None if placed is None else (lambda statics: placed(*statics))
    program = Program("helper", name, build, _describe_helper, placed=where)
    return bound


# --- placement over meshes (SPMD) ----------------------------------------------------


def _mesh_sharding(flat):
    for a in flat:
        if isinstance(a, jax.Array):
            sharding = a.sharding
            if isinstance(sharding, NamedSharding) and len(sharding.device_set) > 1:
                return sharding
    return None


def align(arrays: list) -> list:
    """``arrays`` (a list whose items are arrays, lists of arrays or other values) with
    every one-device array replicated over the mesh of the first mesh-sharded one.

    JAX refuses to mix the two in one program; PyTorch sees one device, so an
    unannotated tensor meeting a sharded one is replicated, as in PyTorch/XLA's SPMD
    mode. Returns ``arrays`` itself when nothing needs moving (always, before the
    first mesh), so callers pass every program's inputs through it.
    """
    if not mesh_in_use:
        return arrays
    flat = [x for a in arrays for x in (a if isinstance(a, (list, tuple)) else (a,))]
    sharding = _mesh_sharding(flat)
    if sharding is None:
        return arrays
    replicated = NamedSharding(sharding.mesh, PartitionSpec())
    devices = sharding.device_set

    def fix(x):
        if isinstance(x, jax.Array) and x.sharding.device_set != devices:
            with jax.enable_x64(True):
                return jax.device_put(x, replicated)
        return x

    return [type(a)(fix(x) for x in a) if isinstance(a, (list, tuple)) else fix(a) for a in arrays]
