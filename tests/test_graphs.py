"""Capture and replay (torch.pjrt.graph, make_graphed_callables), against the same steps
run uncaptured; and fused mode's loop cuts (no compile storms)."""

from __future__ import annotations

import copy
import itertools
import math
import random

import pytest
import torch
import torch.nn.functional as F

import torch_pjrt
from tests.test_semantics import VIEW_WRITES
from torch_pjrt import metrics
from torch_pjrt.modes.capture import CaptureError

DEV = "pjrt"


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


def _batches(n):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(5, 8, generator=g), torch.randn(5, 4, generator=g)) for _ in range(n)]


def _close(a, b):
    # NOTE: not bit-equal: the captured step is one XLA program where the uncaptured one
    # is cut into others, and XLA fuses (and contracts multiply-adds) differently
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


OPTIMIZERS = {
    "sgd-momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    "adam-foreach": lambda p: torch.optim.Adam(p, lr=0.01, capturable=True, foreach=True),
    "adam-single": lambda p: torch.optim.Adam(p, lr=0.01, capturable=True, foreach=False),
    "adamw-tensor-lr": lambda p: torch.optim.AdamW(
        p, lr=torch.tensor(0.01, device=DEV), capturable=True, foreach=True
    ),
    "adamw-fused": lambda p: torch.optim.AdamW(p, lr=0.01, fused=True),
}


def _train(make, data, captured: bool):
    """Train on ``data`` with the step ``make()`` returns (``(model, step, sx, sy,
    after)``): one warm-up step uncaptured (it makes the optimizer's state), then the
    other batches uncaptured, or as replays of the step captured once. ``after`` runs
    after each step (a scheduler). Returns the losses, the parameters and, captured,
    the metrics over the replays."""
    model, step, sx, sy, after = make()
    sx.copy_(data[0][0])
    sy.copy_(data[0][1])
    losses = [step().item()]
    after()
    if captured:
        g = torch.pjrt.Graph()
        with torch.pjrt.graph(g):
            static_loss = step()
        metrics.reset()
    for x, y in data[1:]:
        sx.copy_(x)
        sy.copy_(y)
        if captured:
            g.replay()
            losses.append(static_loss.item())
        else:
            losses.append(step().item())
        after()
    counts = metrics.as_dict() if captured else None
    return losses, [p.detach().cpu() for p in model.parameters()], counts


def _captured_matches_uncaptured(make, data) -> dict:
    """:func:`_train` both ways: losses and parameters agree; the replays' metrics."""
    losses0, params0, _ = _train(make, data, False)
    losses1, params1, counts = _train(make, data, True)
    _close(torch.tensor(losses1), torch.tensor(losses0))
    for a, b in zip(params1, params0):
        _close(a, b)
    return counts


def _mse_step(model, opt, forward=None, scaler=None):
    """A training step of ``model`` on static inputs (``forward``: a compiled model)."""
    sx, sy = torch.zeros(5, 8, device=DEV), torch.zeros(5, 4, device=DEV)
    forward = forward or model

    def step():
        loss = F.mse_loss(forward(sx), sy)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        opt.zero_grad(set_to_none=True)
        return loss

    return step, sx, sy


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_training_step_replays_as_one_program(name):
    """Forward, backward, optimizer step and zero_grad captured once; each replay is one
    program (compiled once) and gives the losses and parameters of uncaptured steps."""
    base = _mlp()

    def make():
        model = copy.deepcopy(base).to(DEV)
        opt = OPTIMIZERS[name](model.parameters())
        after = lambda: None  # noqa: E731
        if name == "adamw-tensor-lr":  # a scheduler writing the tensor lr between replays
            after = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5).step
        return model, *_mse_step(model, opt), after

    m = _captured_matches_uncaptured(make, _batches(6))
    assert m["graph_replays"] == 5
    assert m["compilations"] == 1, m.get("captured_compile_causes")
    # nothing ran beside the replays (but the scheduler's writes of the lr)
    assert m.get("fused_executions", 0) == (4 if name == "adamw-tensor-lr" else 0)


def test_capture_runs_nothing_and_replay_updates_in_place():
    x = torch.ones(4, device=DEV)
    y = torch.zeros(4, device=DEV)
    g = torch.pjrt.Graph()
    with torch.pjrt.graph(g):
        y.add_(x * 2)
        total = y.sum()
    assert y.tolist() == [0.0] * 4  # the capture ran nothing
    g.replay()
    g.replay()
    assert y.tolist() == [4.0] * 4 and total.item() == 16.0
    x.copy_(torch.arange(4.0))  # a static input filled with copy_
    g.replay()
    assert y.tolist() == [4.0, 6.0, 8.0, 10.0] and total.item() == 28.0
    assert torch.pjrt.is_current_stream_capturing() is False
    with pytest.raises(RuntimeError, match="already holds a captured graph"):
        g.capture_begin()
    g.reset()
    with pytest.raises(RuntimeError, match="without a preceding successful capture"):
        g.replay()


def _read_item(t):
    return t.sum().item()


def _read_cpu(t):
    return t.cpu()


def _read_bool(t):
    return bool(t.sum() > 0)


def _read_print(t):
    return repr(t)


def _nonzero(t):
    return t.nonzero()


def _from_cpu(t):
    return t + torch.ones(4).to(DEV)


@pytest.mark.parametrize(
    "fn, says",
    [
        (_read_item, "reads a tensor's value on the host"),
        (_read_cpu, "reads a tensor's value on the host"),
        (_read_bool, "reads a tensor's value on the host"),
        (_read_print, "reads a tensor's value on the host"),
        (_nonzero, "reads a tensor's value on the host"),
        (_from_cpu, "copies a CPU tensor to the device"),
    ],
    ids=["item", "cpu", "bool", "print", "nonzero", "cpu-input"],
)
def test_what_cannot_be_captured_is_refused_at_the_line(fn, says):
    x = torch.arange(4.0, device=DEV)
    y = torch.zeros(4, device=DEV)
    g = torch.pjrt.Graph()
    with pytest.raises(CaptureError, match=says) as info:
        with torch.pjrt.graph(g):
            y.add_(x)
            fn(y)
    assert "test_graphs.py" in str(info.value)  # the user's line
    assert y.tolist() == [0.0] * 4  # the abandoned capture left everything as it was
    assert torch.pjrt.is_current_stream_capturing() is False
    y.add_(x)  # and the device works as before
    assert y.tolist() == [0.0, 1.0, 2.0, 3.0]


# An op PyTorch knows and torch_pjrt does not lower: it falls back to the CPU.
_lib = torch.library.Library("pjrt_graphs_test", "DEF")
_lib.define("thrice(Tensor x) -> Tensor")
_lib.impl("thrice", lambda x: x * 3, "CPU")


def test_a_cpu_fallback_is_refused():
    x = torch.arange(4.0, device=DEV)
    with torch_pjrt.config(fallback="cpu"):
        with pytest.raises(CaptureError, match="pjrt_graphs_test.thrice.*would run on the CPU"):
            with torch.pjrt.graph(torch.pjrt.Graph()):
                torch.ops.pjrt_graphs_test.thrice(x + 1)


def test_capturable_false_optimizer_is_refused():
    model = _mlp().to(DEV)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)  # step count on the CPU
    model(torch.zeros(5, 8, device=DEV)).sum().backward()
    opt.step()
    with pytest.raises(CaptureError, match="capturable=True"):
        with torch.pjrt.graph(torch.pjrt.Graph()):
            model(torch.zeros(5, 8, device=DEV)).sum().backward()
            opt.step()


def test_random_ops_draw_fresh_numbers_reproducibly():
    x = torch.ones(1000, device=DEV)
    out = torch.zeros(1000, device=DEV)
    g = torch.pjrt.Graph()
    with torch.pjrt.graph(g):
        out.copy_(F.dropout(x, 0.5))
    torch.manual_seed(7)
    g.replay()
    first = out.cpu()
    g.replay()
    second = out.cpu()
    assert not torch.equal(first, second)  # each replay draws new numbers
    torch.manual_seed(7)
    g.replay()
    assert torch.equal(out.cpu(), first)  # and manual_seed replays them
    torch.manual_seed(7)
    uncaptured = F.dropout(x, 0.5).cpu()  # the same numbers as the same op uncaptured
    assert torch.equal(uncaptured, first)


def test_make_graphed_callables_module_matches_uncaptured():
    base = _mlp()
    x = torch.randn(5, 8)
    results = []
    for graphed in (False, True):
        model = copy.deepcopy(base).to(DEV)
        if graphed:
            model = torch.pjrt.make_graphed_callables(
                model, (torch.zeros(5, 8, device=DEV, requires_grad=True),)
            )
        inp = x.to(DEV).requires_grad_()
        out = model(inp)
        out.pow(2).sum().backward()
        results.append(
            (out.detach().cpu(), inp.grad.cpu(), [p.grad.cpu() for p in model.parameters()])
        )
    (o0, gi0, gp0), (o1, gi1, gp1) = results
    _close(o1, o0)
    _close(gi1, gi0)
    for a, b in zip(gp1, gp0):
        _close(a, b)


def test_make_graphed_callables_refuses_new_shapes():
    fn = torch.pjrt.make_graphed_callables(
        lambda t: (t * 2).sum(), (torch.zeros(3, device=DEV, requires_grad=True),)
    )
    assert fn(torch.ones(3, device=DEV, requires_grad=True)).item() == 6.0
    with pytest.raises(RuntimeError, match=r"torch.float32\[4\].*captured with torch.float32\[3\]"):
        fn(torch.ones(4, device=DEV, requires_grad=True))


def test_debug_dump_writes_the_program(tmp_path):
    x = torch.ones(4, device=DEV)
    g = torch.pjrt.Graph()
    with torch.pjrt.graph(g):
        x.mul_(3)
    g.debug_dump(str(tmp_path / "g.mlir"))
    assert "stablehlo.multiply" in (tmp_path / "g.mlir").read_text()


# every kind of view a graph reads and writes through: its offsets are numbers of the
# program, read as static slices where the view is a box of its storage's layout, and
# through the general path where it wraps around it or is no box
GRAPH_VIEWS = {
    **VIEW_WRITES,
    "wide_column": lambda a: a.view(2, 12)[:, 5],  # spans 6x what it touches
    "wraps_a_row": lambda a: a.as_strided((2, 3), (6, 1), 4),
    "inner_stride": lambda a: a.view(4, 3, 2)[1:, :2, 1],
    "offset_permute": lambda a: a.view(2, 3, 4)[1].permute(1, 0),
    "t_rows_from_1": lambda a: a.t()[1:],  # to the end of its layout's dims, not from 0
}


@pytest.mark.parametrize("name", sorted(GRAPH_VIEWS))
def test_views_read_and_written_in_a_graph_match_cpu(name):
    make_view = GRAPH_VIEWS[name]

    def steps(a, out):  # a read of the view, a write through it, a read of the base
        v = make_view(a)
        out.copy_((v * 2 + 1).sum(-1, keepdim=True).expand(out.shape))
        v.mul_(-1).add_(0.5)
        return a.view(-1)[3:9] * 1

    cpu = torch.arange(24.0).reshape(4, 6)
    cpu_out = torch.zeros(make_view(cpu.clone()).shape[:-1] + (1,))
    a, out = cpu.to(DEV), cpu_out.to(DEV)
    g = torch.pjrt.Graph()
    with torch.pjrt.graph(g):
        rows = steps(a, out)
    for _ in range(2):
        want = steps(cpu, cpu_out)
        g.replay()
        torch.testing.assert_close(a.cpu(), cpu, rtol=0, atol=0)
        torch.testing.assert_close(out.cpu(), cpu_out, rtol=0, atol=0)
        torch.testing.assert_close(rows.cpu(), want, rtol=0, atol=0)


def _strided_cases(n: int, seed: int = 0):
    """``n`` random views (shape, strides, offset) of storages of a few sizes, each
    inside its storage: overlapping ones, broadcasts, gaps and wraps included."""
    rng = random.Random(seed)
    while n:
        size = rng.choice([24, 36, 48, 64, 120])
        shape = [rng.randint(1, 5) for _ in range(rng.randint(1, 3))]
        strides = [rng.choice([0, 1, 2, 3, 4, 6, 8, 12, 24]) for _ in shape]
        reach = sum((k - 1) * st for k, st in zip(shape, strides)) + 1
        if reach <= size:
            n -= 1
            yield size, shape, strides, rng.randint(0, size - reach)


def test_strided_views_in_a_graph_match_cpu():
    for size, shape, strides, offset in _strided_cases(80):
        cpu = torch.arange(float(size))
        new = torch.arange(100.0, 100.0 + math.prod(shape)).reshape(shape)
        touched = {
            sum(i * st for i, st in zip(at, strides))
            for at in itertools.product(*map(range, shape))
        }
        writes = len(touched) == math.prod(shape)  # (a view that overlaps cannot be written)
        a, b = cpu.to(DEV), new.to(DEV)
        g = torch.pjrt.Graph()
        with torch.pjrt.graph(g):
            read = a.as_strided(shape, strides, offset) * 1
            if writes:
                a.as_strided(shape, strides, offset).copy_(b)
        g.replay()
        case = (size, shape, strides, offset)
        torch.testing.assert_close(
            read.cpu(), cpu.as_strided(shape, strides, offset), msg=str(case)
        )
        if writes:
            cpu.as_strided(shape, strides, offset).copy_(new)
        torch.testing.assert_close(a.cpu(), cpu, rtol=0, atol=0, msg=str(case))


def test_a_graphs_slices_of_known_offsets_are_static(tmp_path):
    a = torch.arange(24.0, device=DEV).reshape(4, 6)
    g = torch.pjrt.Graph()
    with torch.pjrt.graph(g):
        b = a[1:3, 2:5] * 2
        a[2:, 1:3].add_(1)
    g.debug_dump(str(tmp_path / "g.mlir"))
    text = (tmp_path / "g.mlir").read_text()
    assert "stablehlo.slice" in text and "dynamic_slice" not in text, text
    g.replay()
    assert b.tolist() == [[16.0, 18.0, 20.0], [28.0, 30.0, 32.0]]


# --- fused mode: loops that never read a value back --------------------------------------


def _generation_loop(model, steps):
    buf = torch.zeros(1, 16 + steps, dtype=torch.long, device=DEV)
    for t in range(16, 16 + steps):
        logits = model(buf[:, t - 16 : t])[:, -1, :]
        buf[:, t : t + 1] = logits.argmax(-1, keepdim=True)
    return buf


@torch_pjrt.mode("fused")
def test_fused_loop_compiles_a_number_of_programs_that_does_not_grow():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Embedding(32, 16),
        *[torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh()) for _ in range(4)],
        torch.nn.Linear(16, 32),
    ).to(DEV)
    counts = {}
    for steps in (100, 300):
        metrics.reset()
        out = _generation_loop(model, steps).tolist()
        m = metrics.as_dict()
        counts[steps] = m["fused_compilations"]
        assert m["fused_flush_reasons"].get("size cap", 0) == 0
        assert out[0][16:] == _generation_loop_eager(model, steps)
    assert counts[300] == counts[100] <= 4, counts


def _generation_loop_eager(model, steps):
    with torch_pjrt.mode("eager"):
        return _generation_loop(model, steps).tolist()[0][16:]


def test_hugging_face_decode_step_with_a_static_cache():
    """A Llama's one-token decode step over transformers' StaticCache, captured once and
    replayed per token: the tokens of transformers' own greedy generate."""
    from transformers import LlamaConfig, LlamaForCausalLM, StaticCache

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    model = LlamaForCausalLM(cfg).eval().to(DEV)
    prompt = torch.tensor([[1, 5, 9, 3]], device=DEV)
    with torch.no_grad():
        expected = model.generate(prompt, max_new_tokens=8, do_sample=False).tolist()[0][4:]
        cache = StaticCache(config=cfg, max_cache_len=32)
        out = model(prompt, past_key_values=cache, cache_position=torch.arange(4, device=DEV))
        tokens = out.logits[:, -1:].argmax(-1)
        pos = torch.tensor([4], device=DEV)
        g = torch.pjrt.Graph()
        with torch.pjrt.graph(g):
            logits = model(tokens, past_key_values=cache, cache_position=pos).logits
            next_token = logits[:, -1:].argmax(-1)
        got = [tokens.item()]
        metrics.reset()
        for _ in range(7):
            g.replay()
            tokens.copy_(next_token)
            pos.add_(1)
            got.append(tokens.item())
    assert got == expected
    assert metrics.as_dict()["graph_replays"] == 7
    assert metrics.as_dict().get("captured_compilations") == 1


def test_reduce_overhead_replays_inference_graphs():
    """mode="reduce-overhead": the graph is captured at its second call and replayed
    after; new inputs are copied in, values equal the uncompiled model's."""
    torch._dynamo.reset()
    model = _mlp().to(DEV).eval()
    fn = torch.compile(model, backend="pjrt", mode="reduce-overhead")
    metrics.reset()
    with torch.no_grad():
        for x, _ in _batches(5):
            x = x.to(DEV)
            _close(fn(x).cpu(), model(x).cpu())
    m = metrics.as_dict()
    assert m["reduce_overhead_replays"] == 4 and m["graph_executions"] == 1
    with pytest.raises(Exception, match="mode must be one of"):
        torch.compile(lambda t: t - 1, backend="pjrt", mode="fastest")(torch.ones(2, device=DEV))


def test_reduce_overhead_takes_new_inputs_without_an_op():
    """A new input of a reduce-overhead graph is handed to its static input as the same
    array (arrays never change): no copy op is recorded or run for it, and the replay
    sees the input's value at each call, the input written in place in between too."""
    torch._dynamo.reset()
    model = _mlp().to(DEV).eval()
    fn = torch.compile(model, backend="pjrt", mode="reduce-overhead")
    xs = [x.to(DEV) for x, _ in _batches(3)]
    with torch.no_grad(), torch_pjrt.mode("fused"):
        fn(xs[0]), fn(xs[1])  # (the first call runs, the second captures)
        for x in (xs[2], xs[0]):
            metrics.reset()
            got = fn(x)
            assert metrics.as_dict().get("fused_ops", 0) == 0  # (the replay: a program)
            _close(got.cpu(), model(x).cpu())
        xs[0].mul_(2)
        _close(fn(xs[0]).cpu(), model(xs[0]).cpu())
    assert metrics.as_dict()["reduce_overhead_replays"] == 2  # (since the last reset)


def _moving_state_step():
    """A reduce-overhead function writing into a state argument, and its CPU twin."""

    def step(x, state, w):
        state.add_(x @ w)
        return state * 2

    return step, torch.compile(step, backend="pjrt", mode="reduce-overhead")


def test_reduce_overhead_rebinds_when_a_kept_argument_moves():
    """An argument kept in place at the first calls that comes with another storage: a
    state the graph writes (a new KV cache) is kept in its new place, another one is
    copied from then on; the graph is bound to the new storages (no new capture, the
    same program) and replays on."""
    torch._dynamo.reset()
    step, fn = _moving_state_step()
    w = torch.randn(4, 4)
    xs = [torch.randn(2, 4) for _ in range(9)]
    states = [torch.zeros(2, 4), torch.zeros(2, 4)]
    got_states = [s.to(DEV) for s in states]
    pw = w.to(DEV)
    metrics.reset()
    with torch.no_grad():
        for i, x in enumerate(xs):
            which = 0 if i < 4 else 1  # a new state after 4 calls (as a new generate())
            if i == 7:  # and then another weight
                w, pw = w + 1, (w + 1).to(DEV)
            expected = step(x, states[which], w)
            _close(fn(x.to(DEV), got_states[which], pw).cpu(), expected)
    for mine, theirs in zip(got_states, states):
        _close(mine.cpu(), theirs)
    m = metrics.as_dict()
    assert sum(m["reduce_overhead_rebinds"].values()) == 2, m["reduce_overhead_rebinds"]
    assert m["reduce_overhead_replays"] == 8 and m["graph_captures"] == 1
    assert m.get("captured_compilations") == 1  # the same ops: one program
    assert "reduce_overhead_misses" not in m and "reduce_overhead_recaptures" not in m


def test_reduce_overhead_replays_on_however_many_new_states(monkeypatch):
    """A new state for every few calls (a server's generate() calls, each with its own
    cache) never runs out of captures: each new one rebinds the graph, which replays on."""
    from torch_pjrt.compile import replay

    monkeypatch.setattr(replay, "_RECAPTURES", 1)  # (the limit on new captures)
    torch._dynamo.reset()
    step, fn = _moving_state_step()
    w = torch.randn(4, 4)
    pw = w.to(DEV)
    metrics.reset()
    with torch.no_grad():
        for _ in range(5):  # (5 "generate() calls" of 3 steps)
            state = torch.randn(2, 4)
            mine = state.to(DEV)
            for _ in range(3):
                x = torch.randn(2, 4)
                expected = step(x, state, w)
                _close(fn(x.to(DEV), mine, pw).cpu(), expected)
            _close(mine.cpu(), state)
    m = metrics.as_dict()
    assert m["reduce_overhead_replays"] == 14 and m["graph_captures"] == 1
    assert sum(m["reduce_overhead_rebinds"].values()) == 4
    assert "reduce_overhead_misses" not in m


def test_reduce_overhead_captures_again_when_a_moved_argument_is_laid_out_anew():
    """A kept argument whose new storage holds it at another offset cannot stand in for
    the old one: the graph is captured again (its reads recorded at the new offset: a
    program of its own), values still right."""
    torch._dynamo.reset()
    step, fn = _moving_state_step()
    w = torch.randn(4, 4)
    pw = w.to(DEV)
    bases = [torch.zeros(2, 4), torch.zeros(2, 4), torch.zeros(3, 4)]
    mine = [bases[0].to(DEV), bases[1].to(DEV), bases[2].to(DEV)[1:]]  # (offset 4)
    theirs = [bases[0], bases[1], bases[2][1:]]
    metrics.reset()
    with torch.no_grad():
        for which in (0, 0, 1, 2, 2):
            x = torch.randn(2, 4)
            expected = step(x, theirs[which], w)
            _close(fn(x.to(DEV), mine[which], pw).cpu(), expected)
    for a, b in zip(mine, theirs):
        _close(a.cpu(), b)
    m = metrics.as_dict()
    assert sum(m["reduce_overhead_rebinds"].values()) == 1  # (state 1: same layout)
    assert sum(m["reduce_overhead_recaptures"].values()) == 1  # (state 2: offset 4)
    assert m.get("captured_compilations") == 2 and m["graph_captures"] == 2


def test_grad_scaler_step_with_a_fused_optimizer():
    """GradScaler's scale, unscale-and-check (inside fused AdamW) and update, captured:
    the losses and the scale of uncaptured steps."""
    base, scalers = _mlp(), []

    def make():
        model = copy.deepcopy(base).to(DEV)
        opt = torch.optim.AdamW(model.parameters(), lr=0.01, fused=True)
        scaler = torch.amp.GradScaler(DEV, init_scale=2.0**10, growth_interval=2)
        scalers.append(scaler)
        return model, *_mse_step(model, opt, scaler=scaler), lambda: None

    _captured_matches_uncaptured(make, _batches(6))
    # grown every 2 clean steps, the same with and without the capture
    assert [s.get_scale() for s in scalers] == [2.0**10 * 2**3] * 2


def test_a_compiled_model_is_captured_inside_a_step():
    """A torch.compile'd model inside a captured step: its forward and backward graphs
    are recorded into the capture; the replays train as uncaptured compiled steps do."""
    torch._dynamo.reset()
    base = _mlp()

    def make():
        model = copy.deepcopy(base).to(DEV)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        compiled = torch.compile(model, backend="pjrt")
        return model, *_mse_step(model, opt, compiled), lambda: None

    m = _captured_matches_uncaptured(make, _batches(5))
    assert m["compilations"] == 1 and m.get("graph_executions", 0) == 0
