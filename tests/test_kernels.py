"""``@torch_pjrt.kernel``: JAX and Pallas functions as PyTorch operators (issue 20, item 1).

Each kernel is checked against CPU PyTorch in debug, eager and fused modes, as one node
of a compiled graph, through autograd, under FakeTensorMode, on CPU tensors and when its
function fails to trace.
"""

from __future__ import annotations

import inspect
import warnings

import jax
import jax.numpy as jnp
import pytest
import torch
from jax.experimental import pallas as pl
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_pjrt

MODES = ("debug", "eager", "fused")


# --- the kernels ---------------------------------------------------------------------


@torch_pjrt.kernel("pjrt_test::scale_add")
def scale_add(x, bias, *, scale: float = 1.0):
    return x * scale + bias


def _add_body(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]


def _pallas_add_backward(x, y, grad):
    return grad, grad  # (pallas_call has no reverse-mode rule in JAX: a backward is given)


@torch_pjrt.kernel("pjrt_test::pallas_add", backward=_pallas_add_backward)
def pallas_add(x, y):
    call = pl.pallas_call(
        _add_body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=True
    )
    return call(x, y)


def _tanh_backward(x, grad):
    return grad * 2.0  # deliberately not tanh's derivative: shows the user's backward runs


@torch_pjrt.kernel("pjrt_test::tanh_custom_backward", backward=_tanh_backward)
def tanh_custom_backward(x):
    return jnp.tanh(x)


@torch_pjrt.kernel("pjrt_test::axpy_", mutates_args=("y",))
def axpy_(y, x, *, alpha: float):
    return y + alpha * x  # the new value of y


@torch_pjrt.kernel("pjrt_test::with_reference", reference=lambda x, *, k: x * k + 1)
def with_reference(x, *, k: int = 2):
    return x * k + 1


@torch_pjrt.kernel("pjrt_test::two_results")
def two_results(x) -> tuple[jax.Array, jax.Array]:
    return x.sum(-1), x.max(-1)


BAD_LINE = inspect.currentframe().f_lineno + 5  # the line of the failing matmul below


@torch_pjrt.kernel("pjrt_test::bad_shapes")
def bad_shapes(x, y):
    return jnp.matmul(x, y)  # raises for mismatched inner sizes


# --- helpers -----------------------------------------------------------------------------


def _inputs(*shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g) for s in shapes]


@pytest.fixture(autouse=True)
def _no_cpu_fallback():
    """Nothing in these tests may leave the device: an op without a lowering raises."""
    with torch_pjrt.config(fallback="error"):
        yield


@pytest.fixture(params=MODES)
def mode(request):
    with torch_pjrt.mode(request.param):
        yield request.param


# --- values in every mode ------------------------------------------------------------------


def test_schema_is_inferred_from_the_signature():
    assert scale_add is torch.ops.pjrt_test.scale_add  # the operator itself
    assert str(scale_add.default._schema) == (
        "pjrt_test::scale_add(Tensor x, Tensor bias, *, float scale=1.) -> Tensor"
    )
    assert str(axpy_.default._schema) == (
        "pjrt_test::axpy_(Tensor(a!) y, Tensor x, *, float alpha) -> ()"
    )
    assert torch_pjrt.kernels.definition(axpy_).backward_op is None
    backward = torch_pjrt.kernels.definition("pjrt_test::scale_add").backward_op
    assert backward is torch.ops.pjrt_test.scale_add_backward.default


def test_plain_jax_kernel_matches_cpu(mode):
    x, b = _inputs((4, 8), (8,))
    out = scale_add(x.to("pjrt"), b.to("pjrt"), scale=3.0)
    assert out.device.type == "pjrt" and out.shape == (4, 8)
    torch.testing.assert_close(out.cpu(), x * 3.0 + b)
    torch.testing.assert_close(scale_add(x.to("pjrt"), b.to("pjrt")).cpu(), x + b)


def test_pallas_kernel_matches_cpu(mode):
    x, y = _inputs((8, 16), (8, 16))
    out = pallas_add(x.to("pjrt"), y.to("pjrt"))
    torch.testing.assert_close(out.cpu(), x + y)
    # composed with ordinary ops, as a recorded op among others in fused mode
    z = (pallas_add(x.to("pjrt") * 2, y.to("pjrt")) - 1).relu()
    torch.testing.assert_close(z.cpu(), (x * 2 + y - 1).relu())


def test_several_results(mode):
    (x,) = _inputs((3, 5))
    s, m = two_results(x.to("pjrt"))
    torch.testing.assert_close(s.cpu(), x.sum(-1))
    torch.testing.assert_close(m.cpu(), x.max(-1).values)


# --- torch.compile: one node, in the graph's program -------------------------------------


def _compiled_graph_targets(fn, *args):
    """Run fn under torch.compile(backend="pjrt", fullgraph=True), returning its output
    and the call targets of the Dynamo graph."""
    from torch_pjrt.compile.compiler import backend

    seen = []

    def recording(gm, example_inputs, **kw):
        seen.extend(n.target for n in gm.graph.nodes if n.op == "call_function")
        return backend(gm, example_inputs, **kw)

    torch._dynamo.reset()
    out = torch.compile(fn, backend=recording, fullgraph=True)(*args)
    return out, seen


def test_compiled_graph_holds_the_kernel_as_one_node():
    x, b, y = _inputs((4, 8), (8,), (4, 8))

    def f(x, b, y):
        return pallas_add(scale_add(x, b, scale=2.0), y).sin()

    out, targets = _compiled_graph_targets(f, x.to("pjrt"), b.to("pjrt"), y.to("pjrt"))
    torch.testing.assert_close(out.cpu(), (x * 2 + b + y).sin())
    ops = [getattr(t, "overloadpacket", t) for t in targets]
    assert ops.count(torch.ops.pjrt_test.scale_add) == 1
    assert ops.count(torch.ops.pjrt_test.pallas_add) == 1


def test_compiled_kernel_runs_inside_one_program(programs):
    """The kernel's node is lowered in the graph's own program: no eager part."""
    x, b = _inputs((4, 8), (8,))
    f = torch.compile(lambda x, b: scale_add(x, b, scale=0.5) * 2, backend="pjrt", fullgraph=True)
    torch.testing.assert_close(f(x.to("pjrt"), b.to("pjrt")).cpu(), (x * 0.5 + b) * 2)
    assert programs == ["inference"]  # one whole graph, not parts around eager nodes
    programs.clear()
    xp, bp = x.to("pjrt").requires_grad_(), b.to("pjrt").requires_grad_()
    torch._dynamo.reset()
    g = torch.compile(lambda x, b: pallas_add(scale_add(x, b), x).sum(), backend="pjrt")
    g(xp, bp).backward()
    assert programs == ["forward", "backward"]  # the backward kernels too: in its program
    torch.testing.assert_close(xp.grad.cpu(), torch.full_like(x, 2.0))


def test_compiled_training_graph_matches_cpu_gradients():
    x, b = _inputs((4, 8), (8,))
    xp = x.to("pjrt").requires_grad_()
    bp = b.to("pjrt").requires_grad_()
    torch._dynamo.reset()
    f = torch.compile(
        lambda x, b: pallas_add(scale_add(x, b, scale=3.0), x).square().sum(),
        backend="pjrt",
        fullgraph=True,
    )
    loss = f(xp, bp)
    loss.backward()
    xc, bc = x.clone().requires_grad_(), b.clone().requires_grad_()
    ((xc * 3 + bc + xc).square().sum()).backward()
    torch.testing.assert_close(loss.cpu(), ((x * 3 + b + x).square().sum()))
    torch.testing.assert_close(xp.grad.cpu(), xc.grad)
    torch.testing.assert_close(bp.grad.cpu(), bc.grad)


# --- autograd ------------------------------------------------------------------------------


def test_gradients_by_jax_vjp(mode):
    x, b = _inputs((4, 8), (8,))
    xp, bp = x.to("pjrt").requires_grad_(), b.to("pjrt").requires_grad_()
    gx, gb = torch.autograd.grad(scale_add(xp, bp, scale=1.5).square().sum(), (xp, bp))
    xc, bc = x.clone().requires_grad_(), b.clone().requires_grad_()
    ex, eb = torch.autograd.grad((xc * 1.5 + bc).square().sum(), (xc, bc))
    torch.testing.assert_close(gx.cpu(), ex)
    torch.testing.assert_close(gb.cpu(), eb)


@torch_pjrt.kernel("pjrt_test::take_scaled")
def take_scaled(x, index, *, scale: float):
    return x[index] * scale


def test_gradients_of_several_results_and_integer_inputs():
    (x,) = _inputs((3, 5))
    xp = x.to("pjrt").requires_grad_()
    s, m = two_results(xp)
    (g,) = torch.autograd.grad(s.sum() + 2 * m.sum(), xp)
    xc = x.clone().requires_grad_()
    (e,) = torch.autograd.grad(xc.sum(-1).sum() + 2 * xc.max(-1).values.sum(), xc)
    torch.testing.assert_close(g.cpu(), e)
    index = torch.tensor([0, 2, 2])
    (gx,) = torch.autograd.grad(take_scaled(xp, index.to("pjrt"), scale=3.0).sum(), xp)
    expected = torch.zeros(3, 5).index_add(0, index, torch.full((3, 5), 3.0))
    torch.testing.assert_close(gx.cpu(), expected)  # (the int64 index gets no gradient)


def test_pallas_kernel_without_backward_says_to_give_one():
    def body(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    op = torch_pjrt.kernel(
        "pjrt_test::pallas_double",
        lambda x: pl.pallas_call(
            body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=True
        )(x),
    )
    xp = torch.ones(4, device="pjrt", requires_grad=True)
    torch.testing.assert_close(op(xp).detach().cpu(), torch.full((4,), 2.0))
    with pytest.raises(torch_pjrt.kernels.KernelError, match="backward="):
        op(xp).sum().backward()


def test_pallas_gradients_by_its_backward():
    x, y = _inputs((8, 16), (8, 16))
    xp, yp = x.to("pjrt").requires_grad_(), y.to("pjrt").requires_grad_()
    gx, gy = torch.autograd.grad((pallas_add(xp, yp) * xp).sum(), (xp, yp))
    torch.testing.assert_close(gx.cpu(), 2 * x + y)
    torch.testing.assert_close(gy.cpu(), x)


def test_user_backward(mode):
    (x,) = _inputs((5,))
    xp = x.to("pjrt").requires_grad_()
    out = tanh_custom_backward(xp)
    torch.testing.assert_close(out.detach().cpu(), torch.tanh(x))
    (g,) = torch.autograd.grad(out.sum(), xp)
    torch.testing.assert_close(g.cpu(), torch.full_like(x, 2.0))


# --- in place ------------------------------------------------------------------------------


def test_inplace_kernel_updates_its_input(mode):
    y, x = _inputs((6,), (6,))
    yp = y.to("pjrt")
    version = yp._version
    assert axpy_(yp, x.to("pjrt"), alpha=2.0) is None
    torch.testing.assert_close(yp.cpu(), y + 2.0 * x)
    assert yp._version > version


def test_inplace_kernel_through_a_view(mode):
    y, x = _inputs((4, 6), (6,))
    yp = y.to("pjrt")
    axpy_(yp[1], x.to("pjrt"), alpha=-1.0)
    expected = y.clone()
    expected[1] -= x
    torch.testing.assert_close(yp.cpu(), expected)


scale_ = torch_pjrt.kernel(
    "pjrt_test::scale_", lambda x, *, s: x * s, schema="(Tensor(a!) x, *, float s) -> Tensor(a!)"
)


def test_aliasing_schema_returns_the_mutated_input(mode):
    (x,) = _inputs((3,))
    xp = x.to("pjrt")
    assert scale_(xp, s=4.0) is xp
    torch.testing.assert_close(xp.cpu(), x * 4.0)


def test_inplace_kernel_under_compile(programs):
    """PyTorch functionalizes the mutating call (auto_functionalized_v2): it is lowered in
    the graph's program, on the whole input and on a slice of it."""
    y, x = _inputs((6,), (6,))
    yp = y.to("pjrt")

    def f(y, x):
        axpy_(y, x, alpha=0.5)
        axpy_(y[2:], x[2:], alpha=-1.0)
        return y * 2

    out = torch.compile(f, backend="pjrt", fullgraph=True)(yp, x.to("pjrt"))
    expected = y + 0.5 * x
    expected[2:] -= x[2:]
    torch.testing.assert_close(yp.cpu(), expected)
    torch.testing.assert_close(out.cpu(), expected * 2)
    assert programs == ["inference"]


# --- fake tensors ----------------------------------------------------------------------------


def test_fake_tensors_get_shapes_from_eval_shape():
    with FakeTensorMode() as fake:
        x = fake.from_tensor(torch.empty(4, 8, device="pjrt"))
        b = fake.from_tensor(torch.empty(8, device="pjrt"))
        out = scale_add(x, b, scale=2.0)
        s, m = two_results(x)
        half = scale_add(x.to(torch.float16), b.to(torch.float16))
    assert out.shape == (4, 8) and out.dtype == torch.float32 and out.device.type == "pjrt"
    assert s.shape == (4,) and m.shape == (4,)
    assert half.dtype == torch.float16
    with torch.device("meta"):
        assert pallas_add(torch.empty(2, 3), torch.empty(2, 3)).shape == (2, 3)


# --- other devices and errors ------------------------------------------------------------------


def test_cpu_tensors_raise_a_clear_error():
    x, b = _inputs((2,), (2,))
    with pytest.raises(RuntimeError, match=r"pjrt_test::scale_add is a pjrt kernel.*cpu"):
        scale_add(x, b)


def test_cpu_tensors_run_the_reference():
    (x,) = _inputs((3,))
    torch.testing.assert_close(with_reference(x, k=3), x * 3 + 1)
    torch.testing.assert_close(with_reference(x.to("pjrt"), k=3).cpu(), x * 3 + 1)
    xc = x.clone().requires_grad_()
    (g,) = torch.autograd.grad(with_reference(xc, k=3).sum(), xc)
    torch.testing.assert_close(g, torch.full_like(x, 3.0))


CALL_LINE = inspect.currentframe().f_lineno + 8  # the call of bad_shapes in _run_bad


def _run_bad(where, x, y):
    if where == "compile":
        torch._dynamo.reset()
        return torch.compile(bad_shapes, backend="pjrt", fullgraph=True)(x, y)
    with torch_pjrt.mode(where):
        return bad_shapes(x, y).cpu()


off_by_one = torch_pjrt.kernel("pjrt_test::off_by_one", lambda x: x + 1, reference=lambda x: x + 2)


def test_numerics_checker_compares_with_the_reference():
    from torch_pjrt.ops.checks import NumericsWarning

    x = torch.ones(3, device="pjrt")
    with torch_pjrt.config(check_numerics=True), pytest.warns(NumericsWarning, match="off_by_one"):
        off_by_one(x)
    with torch_pjrt.config(check_numerics=True), warnings.catch_warnings():
        warnings.simplefilter("error", NumericsWarning)
        torch.testing.assert_close(with_reference(x, k=3).cpu(), torch.full((3,), 4.0))


@pytest.mark.parametrize("where", [*MODES, "compile"])
def test_trace_failure_names_kernel_shapes_and_lines(where):
    x, y = _inputs((2, 3), (4, 5))
    with pytest.raises(Exception) as info:  # noqa: PT011  (Dynamo wraps it: found below)
        _run_bad(where, x.to("pjrt"), y.to("pjrt"))
    error = info.value
    while error is not None and not isinstance(error, torch_pjrt.kernels.KernelError):
        error = error.__cause__ or error.__context__
    assert error is not None, f"no KernelError in {info.value!r}"
    if where != "compile":
        assert error is info.value  # raised as it is
    text = str(error)
    assert "pjrt_test::bad_shapes" in text
    assert "float32[2, 3]" in text and "float32[4, 5]" in text
    assert f"test_kernels.py:{BAD_LINE}" in text  # the kernel's line that raised
    if where != "compile":
        assert f"test_kernels.py:{CALL_LINE}" in text  # the caller's line


@torch_pjrt.kernel("pjrt_test::positive_only")
def positive_only(x, *, k: int = 1):
    if k <= 0:
        raise ValueError(f"positive_only: k must be positive, got {k}")
    return x * k


@pytest.mark.parametrize("mode", ["eager", "fused"])
def test_a_kernels_own_error_reaches_the_caller_as_it_is(mode):
    """An error the function raises itself (about its arguments, as a reference on other
    devices would) keeps its type and message, with a note naming the kernel; only a
    failure inside JAX becomes a KernelError."""
    x = torch.ones(3, device="pjrt")
    with torch_pjrt.mode(mode), pytest.raises(ValueError, match="k must be positive") as info:
        positive_only(x, k=0)
    assert not isinstance(info.value, torch_pjrt.kernels.KernelError)
    notes = "".join(getattr(info.value, "__notes__", []))
    assert "pjrt_test::positive_only" in notes and "float32[3]" in notes


def test_a_name_is_defined_once():
    with pytest.raises(RuntimeError, match="pjrt_test::scale_add is already defined"):
        torch_pjrt.kernel("pjrt_test::scale_add", lambda x: x)


def test_wrong_results_are_reported():
    op = torch_pjrt.kernel("pjrt_test::returns_two", lambda x: (x, x))
    with pytest.raises(torch_pjrt.kernels.KernelError, match="expects 1 JAX array"):
        op(torch.ones(2, device="pjrt")).cpu()


def test_bad_signatures_are_refused():
    with pytest.raises(TypeError, match="keyword-only"):
        torch_pjrt.kernel("pjrt_test::bad_sig1", lambda x, s=1.0: x)
    with pytest.raises(TypeError, match="annotation"):
        torch_pjrt.kernel("pjrt_test::bad_sig2", lambda x, *, s: x)
    with pytest.raises(ValueError, match="namespace::name"):
        torch_pjrt.kernel("no_namespace", lambda x: x)


def test_the_docs_example():
    """docs/kernels.md's worked example runs as written."""
    import pathlib
    import re

    text = (pathlib.Path(__file__).parents[1] / "docs" / "kernels.md").read_text()
    example = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    with torch_pjrt.mode("eager"):
        exec(compile(example, "docs/kernels.md", "exec"), {})
