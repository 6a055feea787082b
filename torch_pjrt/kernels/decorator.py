"""``@torch_pjrt.kernel``: a function of JAX arrays (plain JAX or Pallas) as a PyTorch op.

The op is defined with ``torch.library`` in the user's namespace, and its function is
registered as a lowering in the one registry (``ops/registry.py``): the PrivateUse1
kernel is a ``registry.Kernel``, so debug, eager and fused modes run it as they run
ATen ops, and compiled graphs (``compile/program.py``, ``registry.graph_lookup``) lower
its node inside their program. Its fake implementation is ``jax.eval_shape`` of the
function; its derivative is a second kernel, ``<name>_backward``, the function's
``jax.vjp`` (or the user's backward), made the same way.
"""

from __future__ import annotations

import inspect
import os
import sys
import sysconfig
import typing
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch

from torch_pjrt.device.tensor import wrap, write
from torch_pjrt.ops import registry
from torch_pjrt.runtime import asserts
from torch_pjrt.runtime.transfer import jax_dtype, torch_dtype

__all__ = ["KernelError", "KernelOp", "definition", "infer_schema", "kernel"]


class KernelError(RuntimeError):
    """A kernel's function failed to trace, or returned what its schema does not allow."""


# --- the schema, from the Python signature -------------------------------------------

_STATIC_TYPES = {int: "int", float: "float", bool: "bool", str: "str"}


def _static_type(name: str, annotation, default) -> str:
    """The schema type of a keyword-only (static) argument."""
    if annotation is inspect.Parameter.empty:
        if default is inspect.Parameter.empty or default is None:
            raise TypeError(
                f"keyword-only argument {name!r} needs a type annotation (int, float, bool "
                "or str) or a default value to infer its schema type"
            )
        annotation = type(default)
    optional = ""
    args = typing.get_args(annotation)
    if type(None) in args and len(args) == 2:  # Optional[X], X | None
        annotation = next(a for a in args if a is not type(None))
        optional = "?"
    origin = typing.get_origin(annotation)
    if origin in (list, tuple, Sequence) and typing.get_args(annotation)[:1] == (int,):
        return "int[]" + optional
    found = _STATIC_TYPES.get(annotation)
    if found is None:
        raise TypeError(
            f"keyword-only argument {name!r}: unsupported type {annotation!r} (static "
            "arguments are int, float, bool, str, their Optional forms and list[int])"
        )
    return found + optional


def _default_text(value) -> str:
    if value is None:
        return "None"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(str(int(v)) for v in value) + "]"
    return repr(value)


def infer_schema(fn: Callable, mutates_args: Sequence[str] = ()) -> str:
    """The schema of a kernel from its signature: positional parameters are tensors,
    keyword-only ones static values; one tensor result (``-> tuple[...]`` of n entries:
    n results), none when the kernel mutates arguments.

    Example:
        >>> def f(x, bias, *, scale: float = 1.0): ...
        >>> infer_schema(f)
        '(Tensor x, Tensor bias, *, float scale=1.0) -> Tensor'
    """
    sig = inspect.signature(fn, eval_str=True)
    params, kwonly = [], []
    letters = iter("abcdefghijklmnopqrstuvwxyz")
    for p in sig.parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            if p.default is not p.empty:
                raise TypeError(
                    f"positional parameter {p.name!r} has a default: a kernel's positional "
                    "parameters are its tensors; make static arguments keyword-only (after *)"
                )
            alias = f"({next(letters)}!)" if p.name in mutates_args else ""
            params.append(f"Tensor{alias} {p.name}")
        elif p.kind is p.KEYWORD_ONLY:
            text = f"{_static_type(p.name, p.annotation, p.default)} {p.name}"
            if p.default is not p.empty:
                text += "=" + _default_text(p.default)
            kwonly.append(text)
        else:
            raise TypeError(f"a kernel takes no *args or **kwargs (got {p})")
    missing = set(mutates_args) - {p.split()[-1] for p in params}
    if missing:
        raise ValueError(f"mutates_args names no tensor parameter: {sorted(missing)}")
    if kwonly:
        params += ["*", *kwonly]
    if mutates_args:
        returns = "()"
    else:
        ret = sig.return_annotation
        n = len(typing.get_args(ret)) if typing.get_origin(ret) is tuple else 1
        returns = "Tensor" if n == 1 else "(" + ", ".join(["Tensor"] * n) + ")"
    return f"({', '.join(params)}) -> {returns}"


# --- errors that point at the user's code --------------------------------------------

_LIBRARIES = tuple(
    os.path.dirname(m.__file__) + os.sep
    for m in (jax, torch, sys.modules["torch_pjrt"], typing)
    if getattr(m, "__file__", None)
) + (sysconfig.get_paths()["stdlib"] + os.sep,)


def _user_frame(frames) -> str | None:
    """'file:line' of the first frame outside JAX, torch, torch_pjrt and the stdlib."""
    for filename, line in frames:
        if not filename.startswith(_LIBRARIES) and not filename.startswith("<"):
            return f"{filename}:{line}"
    return None


def _call_site() -> str | None:
    frame, frames = sys._getframe(1), []
    while frame is not None:
        frames.append((frame.f_code.co_filename, frame.f_lineno))
        frame = frame.f_back
    return _user_frame(frames)


def _raise_site(exc: BaseException) -> str | None:
    frames = [(f.f_code.co_filename, n) for f, n in _traceback(exc)]
    return _user_frame(reversed(frames))


def _traceback(exc):
    tb = exc.__traceback__
    while tb is not None:
        yield tb.tb_frame, tb.tb_lineno
        tb = tb.tb_next


# where an exception raised while a kernel's function runs is a failure to trace (JAX,
# NumPy, torch_pjrt's runtime and lowerings), not one the function raised on purpose
_TRACING = tuple(
    os.path.dirname(m.__file__) + os.sep for m in (jax, np) if getattr(m, "__file__", None)
) + tuple(
    os.path.join(os.path.dirname(sys.modules["torch_pjrt"].__file__), part) + os.sep
    for part in ("runtime", "ops")
)


def _on_purpose(exc: BaseException) -> bool:
    """Whether the function raised ``exc`` itself (its innermost frame is not JAX's)."""
    last = None
    for frame, _ in _traceback(exc):
        last = frame
    return last is not None and not last.f_code.co_filename.startswith(_TRACING)


def _describe(value) -> str:
    if value is None:
        return "None"
    shape = getattr(value, "shape", None)
    if shape is None:
        return repr(value)
    dtype = getattr(value, "dtype", "?")
    return f"{str(dtype).replace('torch.', '')}{list(shape)}"


# --- the op -----------------------------------------------------------------------------


class KernelOp:
    """The definition behind a :func:`kernel` operator: its function, schema and
    registrations (``torch_pjrt.kernels.definition(op)`` finds it).

    ``op`` is the operator's ``OpOverload``, ``backward_op`` that of its derivative
    (None for a kernel that mutates its arguments, which has none).
    """

    def __init__(
        self,
        name: str,
        fn: Callable,
        *,
        mutates_args: Sequence[str] = (),
        schema: str | None = None,
        backward: Callable | None = None,
        reference: Callable | None = None,
    ):
        if "::" not in name:
            raise ValueError(f"a kernel's name is 'namespace::name', got {name!r}")
        namespace, opname = name.split("::", 1)
        self.name = name
        self.fn = fn
        self.reference = reference
        self._user_backward = backward
        if schema is None:
            schema = infer_schema(fn, tuple(mutates_args))
        self._lib = torch.library.Library(namespace, "FRAGMENT")
        self._lib.define(opname + schema)
        self.op = getattr(getattr(torch.ops, namespace), opname).default
        parsed = self.op._schema
        self.schema = str(parsed)
        args = parsed.arguments
        for a in args:
            if a.alias_info is not None and not a.alias_info.is_write:
                raise NotImplementedError(
                    f"{name}: argument {a.name} is a view ({a.type}(a)): a kernel's outputs "
                    "are new tensors or arguments it mutates, declared Tensor(a!)"
                )
        self.tensors = [a.name for a in args if not a.kwarg_only]
        self.statics = [a.name for a in args if a.kwarg_only]
        self.mutates = [a.name for a in args if a.alias_info is not None and a.alias_info.is_write]
        if mutates_args and set(mutates_args) != set(self.mutates):
            raise ValueError(
                f"{name}: mutates_args={list(mutates_args)} but the schema mutates {self.mutates}"
            )
        # each result: a new tensor (None) or the mutated argument it returns
        by_set = {
            frozenset(a.alias_info.before_set): a.name for a in args if a.name in self.mutates
        }
        self.results = []
        for r in parsed.returns:
            if str(r.type) != "Tensor":
                raise NotImplementedError(f"{name}: results must be Tensors, got {r.type}")
            if r.alias_info is None:
                self.results.append(None)
            else:
                self.results.append(by_set[frozenset(r.alias_info.before_set)])
        self.n_new = self.results.count(None)
        self._kernel = self._register(self.op, self._lowering, self.mutates)
        self._lib.impl(opname, self._eager, "PrivateUse1")
        self._lib.impl(opname, self._elsewhere, "CompositeExplicitAutograd")
        torch.library.register_fake(name, self._fake, lib=self._lib)
        self.backward_op = None
        if not self.mutates:
            self.backward_op = self._define_backward(namespace, opname, parsed)

    def __repr__(self) -> str:
        return f"<torch_pjrt kernel {self.name}: {self.schema}>"

    # --- the lowering: the user's function, checked -------------------------------------

    def _register(self, op, lowering, writes=()):
        registry.lowers(op, writes=tuple(writes))(lowering)
        return registry.Kernel(op, registry.lookup(op))

    def _call_fn(self, fn, what: str, arrays, statics: dict, n: int, hint: str = ""):
        """fn(*arrays, **statics) as a tuple of n arrays; a failure names the kernel, the
        arguments' shapes, the line that called it and the line in fn that raised."""
        try:
            out = fn(*arrays, **statics)
        except Exception as exc:  # noqa: BLE001  (re-raised with the kernel's context)
            described = [f"{k}: {_describe(v)}" for k, v in zip(self.tensors, arrays)]
            described += [f"{k}={v!r}" for k, v in statics.items()]
            # (no caller's line in a backward: autograd's engine calls it)
            called, raised = _call_site(), _raise_site(exc)
            where = f", called at {called}" if called else ""
            if _on_purpose(exc) or getattr(exc, "pjrt_event", False):
                # the function's own error about its arguments (as its reference raises
                # it on other devices), or strict mode's: as it is, with the context
                if hasattr(exc, "add_note"):  # (Python 3.11+)
                    exc.add_note(f"pjrt: in {what}{where}; arguments: {', '.join(described)}")
                raise registry.refusal(exc)
            error = KernelError(
                f"{what} failed to trace" + where + "\n"
                f"  arguments: {', '.join(described)}\n"
                f"  {type(exc).__name__}: {exc}"
                + (f" (raised at {raised})" if raised else "")
                + hint
            )
            raise registry.refusal(error) from exc
        outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        if len(outs) != n or not all(isinstance(o, jax.Array) for o in outs):
            got = ", ".join(type(o).__name__ for o in outs)
            raise registry.refusal(
                KernelError(f"{what} returned ({got}); its schema expects {n} JAX array(s)")
            )
        return outs

    def _check_updates(self, values: dict, outs) -> None:
        """The new value of each mutated argument has its shape and dtype."""
        for name, new in zip(self.mutates, outs[self.n_new :]):
            old = values[name]
            dtype = old.dtype if isinstance(old, jax.Array) else jax_dtype(old.dtype)
            if tuple(new.shape) != tuple(old.shape) or np.dtype(new.dtype) != np.dtype(dtype):
                raise registry.refusal(
                    KernelError(
                        f"pjrt kernel {self.name} returned {_describe(new)} as the new value "
                        f"of {name}, which is {_describe(old)}"
                    )
                )

    def _split(self, values: dict):
        return [values[n] for n in self.tensors], {n: values[n] for n in self.statics}

    def _lowering(self, **values):
        arrays, statics = self._split(values)
        n = self.n_new + len(self.mutates)
        outs = self._call_fn(self.fn, f"pjrt kernel {self.name}", arrays, statics, n)
        self._check_updates(values, outs)
        if not self.mutates:
            return outs if len(outs) != 1 or len(self.results) != 1 else outs[0]
        return outs  # (new results, then the new values of the mutated arguments)

    # --- the PrivateUse1 kernel, other devices, fake tensors ---------------------------

    def _bind(self, args, kwargs) -> dict:
        values = dict(zip(self.tensors, args))
        values.update(kwargs)
        for a in self.op._schema.arguments:
            if a.name not in values and a.has_default_value():
                values[a.name] = a.default_value
        return values

    def _eager(self, *args, **kwargs):
        if not self.mutates:
            return self._kernel(*args, **kwargs)
        out, index = self._kernel.compute(args, kwargs)
        values = self._bind(args, kwargs)
        for name, value in zip(self.mutates, out[self.n_new :]):
            target = values[name]
            write(target, value, owned=True)
            torch.autograd.graph.increment_version(target)
        fresh = iter(out[: self.n_new])
        return self._results(values, lambda: wrap(next(fresh), index, True))

    def _results(self, values: dict, new: Callable):
        results = [new() if r is None else values[r] for r in self.results]
        if not results:
            return None
        return results[0] if len(results) == 1 else tuple(results)

    def _elsewhere(self, *args, **kwargs):
        """Tensors on another device: the reference, if given, else a clear error."""
        if self.reference is not None:
            return self.reference(*args, **kwargs)
        devices = sorted({str(a.device) for a in args if isinstance(a, torch.Tensor)})
        raise RuntimeError(
            f"{self.name} is a pjrt kernel: it runs on pjrt tensors, got tensors on "
            f"{', '.join(devices) or 'no device'}. Move them with .to('pjrt'), or give "
            f"@torch_pjrt.kernel(..., reference=fn) a PyTorch function to run elsewhere."
        )

    def _fake(self, *args, **kwargs):
        """FakeTensor / Meta results: the shapes and dtypes of ``jax.eval_shape``."""
        values = self._bind(args, kwargs)
        tensors, statics = self._split(values)
        n = self.n_new + len(self.mutates)
        with jax.enable_x64(True):
            specs = [
                None
                if t is None
                else jax.ShapeDtypeStruct(tuple(int(s) for s in t.shape), jax_dtype(t.dtype))
                for t in tensors
            ]
            # NOTE: a scope of its own for the checks the function states: eager kernels
            # run this (PyTorch's Meta check of the arguments) while their program traces
            with asserts.tracing():
                out = jax.eval_shape(
                    lambda *a: self._call_fn(self.fn, f"pjrt kernel {self.name}", a, statics, n),
                    *specs,
                )
        self._check_updates(values, out)
        like = next(t for t in tensors if t is not None)
        fresh = iter(out[: self.n_new])

        def new():
            o = next(fresh)
            return like.new_empty(tuple(o.shape), dtype=torch_dtype(o.dtype))

        return self._results(values, new)

    # --- autograd: <name>_backward, another kernel ---------------------------------------

    def _define_backward(self, namespace: str, opname: str, parsed):
        n_out = len(self.results)
        args = parsed.arguments
        positional = [f"Tensor {a.name}" for a in args if not a.kwarg_only]
        grads = [f"Tensor _grad{i}" for i in range(n_out)]
        text = str(parsed)
        text = text[text.index("(") + 1 : text.rindex(") -> ")]
        kwonly = text.split("*, ", 1)[1] if self.statics else None  # (as declared)
        params = positional + grads + (["*", kwonly] if kwonly else [])
        n_in = len(self.tensors)
        returns = "Tensor" if n_in == 1 else "(" + ", ".join(["Tensor"] * n_in) + ")"
        bname = opname + "_backward"
        self._lib.define(f"{bname}({', '.join(params)}) -> {returns}")
        bop = getattr(getattr(torch.ops, namespace), bname).default
        self._grad_names = [f"_grad{i}" for i in range(n_out)]
        self._backward_kernel = self._register(bop, self._backward_lowering)
        self._lib.impl(bname, self._backward_kernel, "PrivateUse1")
        self._lib.impl(bname, self._backward_elsewhere, "CompositeExplicitAutograd")

        def fake(*a, **k):
            out = tuple(t.new_empty(t.shape) for t in a[:n_in])
            return out if n_in != 1 else out[0]

        torch.library.register_fake(f"{namespace}::{bname}", fake, lib=self._lib)

        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(*inputs)
            ctx.statics = {}

        def setup_context_kw(ctx, inputs, keyword_only_inputs, output):
            ctx.save_for_backward(*inputs)
            ctx.statics = keyword_only_inputs

        def backward(ctx, *grad_outputs):
            inputs = ctx.saved_tensors
            out = bop(*inputs, *grad_outputs, **ctx.statics)
            out = (out,) if n_in == 1 else tuple(out)
            return tuple(
                g if need and (t.is_floating_point() or t.is_complex()) else None
                for g, t, need in zip(out, inputs, ctx.needs_input_grad)
            )

        setup = setup_context_kw if self.statics else setup_context
        torch.library.register_autograd(self.name, backward, setup_context=setup, lib=self._lib)
        return bop

    def _backward_lowering(self, **values):
        primals, statics = self._split(values)
        cotangents = [values[n] for n in self._grad_names]
        what = f"the backward of pjrt kernel {self.name}"
        n_in = len(primals)
        if self._user_backward is not None:
            fn = self._user_backward
            grads = self._call_fn(
                lambda *a, **s: _fill(fn(*a, **s), primals),
                what,
                primals + cotangents,
                statics,
                n_in,
            )
        else:
            grads = self._call_fn(
                lambda *a, **s: _vjp(self.fn, a[:n_in], a[n_in:], s),
                what,
                primals + cotangents,
                statics,
                n_in,
                hint="\n  The gradient is jax.vjp of the kernel's function, and JAX cannot "
                "differentiate every function (pallas_call has no reverse-mode rule): give "
                "@torch_pjrt.kernel(..., backward=fn), or wrap the function in jax.custom_vjp.",
            )
        return grads if n_in != 1 else grads[0]

    def _backward_elsewhere(self, *args, **kwargs):
        """The backward on another device: the reference's, by autograd, if given."""
        if self.reference is None:
            return self._elsewhere(*args, **kwargs)
        n_in = len(self.tensors)
        primals = [a.detach().requires_grad_(a.is_floating_point()) for a in args[:n_in]]
        with torch.enable_grad():
            out = self.reference(*primals, **kwargs)
            outs = out if isinstance(out, (tuple, list)) else (out,)
            wanted = [p for p in primals if p.requires_grad]
            found = iter(torch.autograd.grad(outs, wanted, args[n_in:], allow_unused=True))
        grads = [next(found) if p.requires_grad else None for p in primals]
        grads = tuple(torch.zeros_like(p) if g is None else g for g, p in zip(grads, primals))
        return grads if n_in != 1 else grads[0]


def _inexact(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.inexact)


def _vjp(fn, primals, cotangents, statics):
    """The gradients of fn's outputs against its inexact inputs (zeros for the others)."""
    which = [i for i, p in enumerate(primals) if _inexact(p)]

    def of_inexact(*xs):
        full = list(primals)
        for i, x in zip(which, xs):
            full[i] = x
        out = fn(*full, **statics)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    _, pullback = jax.vjp(of_inexact, *[primals[i] for i in which])
    found = dict(zip(which, pullback(tuple(cotangents))))
    return tuple(found.get(i, jnp.zeros_like(p)) for i, p in enumerate(primals))


def _fill(grads, primals):
    """A user backward's gradients, None as zeros."""
    grads = tuple(grads) if isinstance(grads, (tuple, list)) else (grads,)
    return tuple(jnp.zeros_like(p) if g is None else g for g, p in zip(grads, primals))


def kernel(
    name: str,
    fn: Callable | None = None,
    *,
    mutates_args: Sequence[str] = (),
    schema: str | None = None,
    backward: Callable | None = None,
    reference: Callable | None = None,
):
    """Make a function of JAX arrays a PyTorch operator that runs on pjrt tensors.

    The function may use any JAX, ``pallas_call`` included. Its positional parameters
    are tensors (JAX arrays inside), its keyword-only parameters static values (int,
    float, bool, str: one compiled program per value). The operator works in debug,
    eager and fused modes, is one node of a ``torch.compile(backend="pjrt")`` graph,
    lowered inside the graph's XLA program, has a fake implementation from
    ``jax.eval_shape`` of the function (FakeTensor and Dynamo need nothing more) and is
    differentiable through ``jax.vjp`` of the function or ``backward``.

    Args:
        name: ``"namespace::name"``; the op is ``torch.ops.namespace.name``.
        fn: the function (when not used as a decorator).
        mutates_args: names of tensor parameters the kernel updates in place. The
            function then returns its new results (none, by the inferred schema) followed
            by the new value of each of these, and the op writes them into the tensors.
            Such an op has no autograd formula (PyTorch's rule for mutating ops).
        schema: the op's schema, e.g. ``"(Tensor(a!) x, Tensor y) -> Tensor(a!)"`` (a
            result aliasing a mutated argument returns that argument); inferred from the
            signature by default.
        backward: a JAX function ``backward(*inputs, *grad_outputs, **statics)``
            returning one gradient (or None) per tensor input; default: ``jax.vjp``.
        reference: a PyTorch function run for tensors on other devices (CPU); without
            one they raise an error.

    Returns:
        The operator, ``torch.ops.<namespace>.<name>`` (an ``OpOverloadPacket``);
        :func:`definition` gives its :class:`KernelOp`.

    Example:
        >>> @torch_pjrt.kernel("mylib::scale_add")
        ... def scale_add(x, bias, *, scale: float = 1.0):
        ...     return x * scale + bias
        >>> scale_add(torch.ones(3, device="pjrt"), torch.ones(3, device="pjrt"), scale=2.0)
        tensor([3., 3., 3.], device='pjrt:0')
    """

    def make(fn):
        if name in _DEFINITIONS:
            raise RuntimeError(f"{name} is already defined (by {_DEFINITIONS[name].fn!r})")
        definition = KernelOp(
            name,
            fn,
            mutates_args=mutates_args,
            schema=schema,
            backward=backward,
            reference=reference,
        )
        _DEFINITIONS[name] = definition  # (keeps its torch.library registrations alive)
        # NOTE: the operator itself is returned, not a wrapper: Dynamo skips torch_pjrt's
        # code (compile/dynamo.py), so a call through a torch_pjrt object would break the
        # graph, where an operator is a node
        return definition.op.overloadpacket

    return make if fn is None else make(fn)


_DEFINITIONS: dict[str, KernelOp] = {}


def definition(op) -> KernelOp:
    """The :class:`KernelOp` of an operator made by :func:`kernel` (its packet, an
    overload or its name ``"namespace::name"``)."""
    if isinstance(op, str):
        name = op
    elif isinstance(op, torch._ops.OpOverloadPacket):
        name = op._qualified_op_name
    else:
        name = op._schema.name
    found = _DEFINITIONS.get(name)
    if found is None:
        raise KeyError(f"{name} is not an operator made by torch_pjrt.kernel")
    return found
