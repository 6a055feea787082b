"""torch.compile(backend="pjrt"): compiled graphs against eager pjrt (and CPU)."""

from __future__ import annotations

import copy
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from torch import nn

import torch_pjrt
from tests.models import MODELS

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    torch_pjrt.metrics.reset()
    # NOTE: Dynamo leaves nn.LSTM to eager unless asked (PyTorch's default)
    with torch._dynamo.config.patch(allow_rnn=True):
        yield
    torch._dynamo.reset()


def _close(actual, expected, rtol=1e-5, atol=1e-6, msg=None):
    torch.testing.assert_close(actual.cpu(), expected.cpu(), rtol=rtol, atol=atol, msg=msg)


def _batch(model_cls, device="pjrt", seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(t.to(device) for t in model_cls.batch(g))


# --- the backend ---------------------------------------------------------------------


def test_backend_is_registered_by_entry_point():
    assert "pjrt" in torch._dynamo.list_backends()
    fn = torch.compile(lambda x: torch.sin(x) * 2, backend="pjrt")
    x = torch.randn(5)
    _close(fn(x.to("pjrt")), torch.sin(x) * 2)
    assert torch_pjrt.metrics.as_dict()["graph_compilations"] == 1


@pytest.mark.parametrize("name", sorted(MODELS))
def test_forward_and_gradients_match_eager(name):
    torch.manual_seed(0)
    eager = MODELS[name]().to("pjrt")
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, backend="pjrt")
    x, y = _batch(MODELS[name])
    out_e, out_c = eager(x), compiled(x)
    _close(out_c, out_e)
    F.cross_entropy(out_e.flatten(0, -2), y.flatten()).backward()
    F.cross_entropy(out_c.flatten(0, -2), y.flatten()).backward()
    for (n, a), b in zip(eager.named_parameters(), compiled_model.parameters()):
        _close(b.grad, a.grad, msg=n)
    d = torch_pjrt.metrics.as_dict()
    assert d["graph_forward_compilations"] == 1 and d["graph_backward_compilations"] == 1


OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-3, capturable=True),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.01, capturable=True),
}


def _train(model, opt_name, compiled, steps=4):
    opt = OPTIMIZERS[opt_name](model.parameters())

    def step(batch):
        opt.zero_grad()
        loss = model.loss(batch)
        loss.backward()
        opt.step()
        return loss

    if compiled:
        step = torch.compile(step, backend="pjrt")
    batches = [_batch(type(model), seed=s) for s in range(2)]
    return [step(batches[i % 2]).item() for i in range(steps)], model


@pytest.mark.parametrize(
    "name, opt_name",
    [("mlp", "sgd"), ("mlp", "adam"), ("transformer", "adamw"), ("cnn", "sgd"), ("lstm", "adam")],
)
def test_training_step_matches_eager(name, opt_name):
    torch.manual_seed(0)
    base = MODELS[name]()
    eager_losses, eager = _train(copy.deepcopy(base).to("pjrt"), opt_name, compiled=False)
    losses, model = _train(copy.deepcopy(base).to("pjrt"), opt_name, compiled=True)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(eager_losses), rtol=1e-5, atol=0)
    for (n, a), b in zip(eager.state_dict().items(), model.state_dict().values()):
        # NOTE: Adam moves a parameter whose true gradient is zero (attention's key
        # bias, a bias before a BatchNorm) by +-lr on rounding noise: weights are
        # compared for SGD, through the losses for Adam
        if opt_name == "sgd":
            _close(b, a, rtol=1e-4, atol=1e-5, msg=n)


def _compiled_step(model, opt):
    """forward, backward, optimizer step and zero_grad, compiled as one function."""

    @torch.compile(backend="pjrt")
    def step(batch):
        loss = model.loss(batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return step


def test_training_step_stays_on_device_and_donates():
    torch.manual_seed(0)
    model = MODELS["transformer"]().to("pjrt")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=True)
    batch = _batch(MODELS["transformer"])
    step = _compiled_step(model, opt)
    for _ in range(3):
        step(batch)
    storages = [p.untyped_storage().data_ptr() for p in model.parameters()]
    torch_pjrt.metrics.reset()
    for _ in range(3):
        loss = step(batch)
    d = torch_pjrt.metrics.as_dict()
    assert storages == [p.untyped_storage().data_ptr() for p in model.parameters()]
    assert d["transfers_to_device"] == 0 and d["transfers_to_host"] == 0
    assert d.get("graph_compilations", 0) == 0  # warm: nothing compiles again
    assert d["graph_executions"] == 9  # forward, backward, optimizer: 3 programs a step
    # parameters and both Adam moments are updated in place by donating their buffers
    n_params = len(list(model.parameters()))
    assert d["graph_donated_buffers"] >= 3 * 3 * n_params
    assert set(d["ops"]) <= {"aten.fill.Scalar"}  # only backward()'s seed gradient is eager
    assert torch.isfinite(loss).item()


def _hf_models():
    import transformers as hf

    small = dict(
        num_hidden_layers=2,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        vocab_size=100,
        max_position_embeddings=64,
    )
    return {
        "gpt2": lambda: hf.GPT2LMHeadModel(
            hf.GPT2Config(
                n_layer=2,
                n_embd=32,
                n_head=4,
                vocab_size=100,
                n_positions=64,
                bos_token_id=0,
                eos_token_id=0,
            )
        ),
        "llama": lambda: hf.LlamaForCausalLM(hf.LlamaConfig(num_key_value_heads=2, **small)),
        "bert": lambda: hf.BertForMaskedLM(hf.BertConfig(**small)),
    }


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
def test_hugging_face_models_match_eager(name):
    torch.manual_seed(0)
    base = _hf_models()[name]().eval()  # eval: no dropout, so eager and compiled agree
    ids = torch.randint(0, 100, (2, 12)).to("pjrt")
    results = []
    for compiled in (False, True):
        model = copy.deepcopy(base).to("pjrt")
        run = (lambda m: lambda ids: m(input_ids=ids, labels=ids))(model)
        if compiled:
            run = torch.compile(run, backend="pjrt")
        out = run(ids)
        out.loss.backward()
        results.append((out.logits, [(n, p.grad) for n, p in model.named_parameters()]))
    (logits_e, grads_e), (logits_c, grads_c) = results
    _close(logits_c, logits_e)
    for (n, a), (_, b) in zip(grads_e, grads_c):
        if a is None:  # unused by this head (BERT's pooler)
            assert b is None, n
            continue
        _close(b, a, rtol=1e-5, atol=1e-6, msg=n)
    d = torch_pjrt.metrics.as_dict()
    # GPT-2's loss logs a warning: a graph break, so two forward/backward pairs
    assert d["graph_forward_compilations"] == d["graph_backward_compilations"] <= 2
    assert not d.get("graph_eager_ops"), d.get("graph_eager_ops")


# --- mutations, graph breaks, eager parts ----------------------------------------------


def test_batchnorm_running_stats_are_written_back():
    torch.manual_seed(0)
    bn = nn.BatchNorm1d(6)
    x = torch.randn(8, 6)
    compiled_bn = torch.compile(copy.deepcopy(bn).to("pjrt"), backend="pjrt")
    for _ in range(3):
        bn(x)
        compiled_bn(x.to("pjrt"))
    _close(compiled_bn.running_mean, bn.running_mean)
    _close(compiled_bn.running_var, bn.running_var)
    assert compiled_bn.num_batches_tracked.item() == 3
    bn.eval()
    compiled_bn.eval()
    _close(compiled_bn(x.to("pjrt")), bn(x))


def test_inplace_update_of_an_input_and_of_a_view():
    def f(x, y):
        x.add_(1)
        y[1:3].mul_(2)
        return x.sum() + y.sum()

    x, y = torch.randn(4), torch.randn(5)
    xp, yp = x.to("pjrt"), y.to("pjrt")
    expected = f(x, y)
    _close(torch.compile(f, backend="pjrt")(xp, yp), expected)
    _close(xp, x)
    _close(yp, y)


def test_graph_breaks_give_several_graphs():
    def f(x):
        y = torch.relu(x) * 2
        if y.sum() > 0:  # data-dependent branch: a graph break
            y = y + 1
        print("", end="")  # another break
        return y.cos()

    x = torch.randn(6)
    _close(torch.compile(f, backend="pjrt")(x.to("pjrt")), f(x))
    d = torch_pjrt.metrics.as_dict()
    assert d["dynamo_graphs"] >= 2 and d["graph_inference_compilations"] >= 2


@torch.library.custom_op("pjrt_test::scale_rows", mutates_args=())
def _scale_rows(x: torch.Tensor) -> torch.Tensor:
    # no pjrt lowering: a compiled graph must run this node eagerly
    return x * torch.arange(1, x.shape[0] + 1, device=x.device, dtype=x.dtype)[:, None]


@_scale_rows.register_fake
def _(x):
    return torch.empty_like(x)


def test_nodes_without_lowering_run_eagerly_between_programs():
    def f(x):
        return torch.ops.pjrt_test.scale_rows(torch.sin(x) + 1).exp()

    x = torch.randn(3, 4)
    _close(torch.compile(f, backend="pjrt")(x.to("pjrt")), f(x))
    d = torch_pjrt.metrics.as_dict()
    assert d["graph_eager_ops"] == {"pjrt_test.scale_rows.default": 1}
    assert d["graph_part_compilations"] == 2  # before and after the eager node


def test_dropout_in_compiled_graph_is_random_and_seeded():
    drop = torch.compile(lambda x: F.dropout(x, 0.5, training=True), backend="pjrt")
    x = torch.ones(1000, device="pjrt")
    torch.manual_seed(3)
    a, b = drop(x), drop(x)
    torch.manual_seed(3)
    c = drop(x)
    assert not torch.equal(a.cpu(), b.cpu())
    assert torch.equal(a.cpu(), c.cpu())
    kept = (a.cpu() != 0).float().mean().item()
    assert 0.4 < kept < 0.6 and set(a.cpu().unique().tolist()) <= {0.0, 2.0}


# --- recompilation, the persistent cache, inspection ---------------------------------


def test_recompilations_are_counted_with_their_reason():
    f = torch.compile(lambda x: x * 2, backend="pjrt", dynamic=False)
    for n in (3, 3, 4, 4):
        f(torch.ones(n, device="pjrt"))
    d = torch_pjrt.metrics.as_dict()
    assert d["dynamo_recompilations"] == 1
    (reason,) = d["dynamo_recompile_reasons"]
    assert "size" in reason and "3" in reason
    assert d["graph_compilations"] == 2


def test_program_recompiles_on_new_shapes_with_the_cause():
    from torch_pjrt.compile.program import GraphProgram

    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    for node in gm.graph.nodes:
        if node.op == "call_function":
            node.target = torch.ops.aten.add.Tensor
    gm.recompile()
    program = GraphProgram(gm)
    program(torch.ones(2, device="pjrt"))
    program(torch.ones(2, device="pjrt"))
    (out,) = program(torch.ones(3, device="pjrt"))
    _close(out, torch.full((3,), 2.0))
    causes = torch_pjrt.metrics.as_dict()["graph_compile_causes"]
    assert sum(causes.values()) == 2
    assert any("input 0 changed from float32[2] to float32[3]" in c for c in causes), causes


class _Offset:
    """A Python int a step advances, as a static cache keeps its length
    (transformers' ``StaticSlidingWindowLayer.cumulative_length_int``)."""

    def __init__(self):
        self.n = 0


def _advance(x, state):
    state.n = state.n + 1  # Dynamo: an int input and an int output of the graph
    return x * 2


def _advance_and_use(x, state):
    state.n = state.n + 1
    return x + state.n  # (the program reads it)


def _advance_by_a_used_int(x, state):
    step = state.m * 2  # (the program reads it)
    state.n = state.n + step  # (a free value computed from it)
    return x + step


@pytest.mark.parametrize("mode", ["eager", "fused"])
def test_an_int_the_program_does_not_read_builds_no_program_per_value(mode):
    """A symbolic int that only feeds Python arithmetic returned to the caller (a static
    cache's offset + 1) is no argument of the program: one program for every value, and
    the returned int is this call's (it built one program per token of a sliding-window
    static cache). An int the program reads stays one of its static arguments, right."""
    torch._dynamo.reset()
    f = torch.compile(_advance, backend="pjrt")
    state, x = _Offset(), torch.arange(4.0, device="pjrt")
    with torch_pjrt.mode(mode):
        torch_pjrt.metrics.reset()
        for _ in range(8):
            out = f(x, state)
        assert state.n == 8
        _close(out, torch.arange(4.0) * 2)
        d = torch_pjrt.metrics.as_dict()
        # Dynamo: the first call specializes the int, the second makes it symbolic
        assert d["dynamo_graphs"] == 2 and d["graph_compilations"] == 2, d
        g, used = torch.compile(_advance_and_use, backend="pjrt"), _Offset()
        for n in range(1, 6):
            _close(g(x, used), torch.arange(4.0) + n)
        assert used.n == 5
        h, both = torch.compile(_advance_by_a_used_int, backend="pjrt"), _Offset()
        both.m = 0
        for m in range(1, 6):
            both.m = m
            _close(h(x, both), torch.arange(4.0) + 2 * m)
        assert both.n == sum(2 * m for m in range(1, 6))


@pytest.mark.parametrize("how", ["dynamic", "mark_dynamic"])
def test_training_over_lengths_is_exact_and_compiles_once_per_bucket(how):
    torch.manual_seed(0)
    eager = MODELS["transformer"](block=16).to("pjrt")
    model = copy.deepcopy(eager)
    compiled = torch.compile(model, backend="pjrt", dynamic=True if how == "dynamic" else None)
    lengths = (5, 7, 5, 9, 6, 12)
    for t in lengths:
        idx = torch.randint(0, 32, (2, t)).to("pjrt")
        if how == "mark_dynamic":
            torch._dynamo.mark_dynamic(idx, 1)
        target = torch.roll(idx, -1, dims=1)
        loss_e = F.cross_entropy(eager(idx).flatten(0, 1), target.flatten())
        loss_c = F.cross_entropy(compiled(idx).flatten(0, 1), target.flatten())
        _close(loss_c, loss_e)
        loss_e.backward()
        loss_c.backward()
        for (n, a), b in zip(eager.named_parameters(), model.parameters()):
            _close(b.grad, a.grad, msg=n)
    d = torch_pjrt.metrics.as_dict()
    assert d.get("dynamo_recompilations", 0) == 0  # one symbolic graph serves every length
    assert not d.get("graph_bucket_fallbacks")
    # lengths 5..12 fall in buckets 8 and 16: a forward and a backward program each
    assert d["graph_forward_compilations"] == d["graph_backward_compilations"] == 2


def test_inference_loop_over_lengths_compiles_once_per_bucket():
    torch.manual_seed(0)
    model = MODELS["transformer"](block=16).to("pjrt").eval()
    compiled = torch.compile(model, backend="pjrt", dynamic=True)
    shapes = [(2, 5), (2, 7), (3, 6), (2, 9), (4, 16), (2, 3), (2, 8)]
    with torch.no_grad():
        for b, t in shapes:
            idx = torch.randint(0, 32, (b, t)).to("pjrt")
            out = compiled(idx)
            assert out.shape == (b, t, 32)
            _close(out, model(idx))
    d = torch_pjrt.metrics.as_dict()
    assert d.get("dynamo_recompilations", 0) == 0
    assert not d.get("graph_bucket_fallbacks")
    buckets = {(1 << (b - 1).bit_length(), 1 << (t - 1).bit_length()) for b, t in shapes}
    assert d["graph_compilations"] == len(buckets) == 5  # (2,8) (4,8) (2,16) (4,16) (2,4)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_hugging_face_inference_over_lengths_is_exact(name):
    # their cache's cat and attention mask run padded (cat and index rules; Llama's
    # grouped-query heads merge into a dim padded like the query's): a program per bucket
    torch.manual_seed(0)
    model = _hf_models()[name]().eval().to("pjrt")
    compiled = torch.compile(model, backend="pjrt", dynamic=True)
    lengths = (5, 7, 6, 9)
    with torch.no_grad():
        for t in lengths:
            ids = torch.randint(0, 100, (2, t)).to("pjrt")
            _close(compiled(input_ids=ids).logits, model(input_ids=ids).logits)
    d = torch_pjrt.metrics.as_dict()
    assert d.get("dynamo_recompilations", 0) == 0
    assert not d.get("graph_bucket_fallbacks")
    assert d["graph_compilations"] == 2  # lengths 5, 7, 6, 9: buckets 8 and 16


def _attend(cache, q, new, mask, shift):
    """One decoding step over a cache grown by ``cat`` (a dynamic KV cache): the new
    position attends over every position the padding mask keeps, and positions are
    counted from ``shift``, a length used as a tensor operand (``arange + past``)."""
    cache = torch.cat([cache, new], dim=1)
    n = cache.shape[1]
    kept = mask[
        torch.arange(mask.shape[0], device=mask.device)[:, None],
        torch.arange(n, device=mask.device)[None, :],
    ]
    positions = torch.arange(n, device=cache.device) + shift.shape[0]
    scores = (q @ cache.transpose(1, 2)) / 4 + positions.float()[None, None, :] / 100
    scores = scores.masked_fill(~kept[:, None, :], float("-inf"))
    return cache, scores.softmax(-1) @ cache


def test_a_slice_that_cuts_the_end_of_a_padded_dim_is_exact():
    # x[:, :-1] keeps all but the last true element: a padded program once took it for a
    # static prefix and summed padding and the cut elements too (silently wrong)
    def f(x):
        return x[:, :-1].sum(1) + x[:, :-2].amax(1)

    compiled = torch.compile(f, backend="pjrt", dynamic=True)
    for t in (5, 6, 7, 9):  # buckets 8 and 16
        x = torch.randn(3, t)
        _close(compiled(x.to("pjrt")), f(x))
    d = torch_pjrt.metrics.as_dict()
    assert not d.get("graph_bucket_fallbacks") and d["graph_compilations"] == 2


def test_a_padded_size_used_as_an_argument_that_is_not_a_size_stays_exact():
    # tril's diagonal computed from a padded length: its padded value (bucket - 4) was
    # passed, silently wrong; such a graph now runs at its exact sizes
    def f(x):
        return torch.tril(x, x.shape[1] - 4) * 2

    compiled = torch.compile(f, backend="pjrt", dynamic=True)
    for t in (5, 6, 7):  # bucket 8
        x = torch.randn(6, t)
        _close(compiled(x.to("pjrt")), f(x))
    (reason,) = torch_pjrt.metrics.as_dict()["graph_bucket_fallbacks"]
    assert "diagonal" in reason


class _WithClassToken(nn.Module):
    """A learned token put before the sequence (``cat`` along the padded length),
    attention over the whole, a loss over every position."""

    def __init__(self):
        super().__init__()
        self.cls = nn.Parameter(torch.randn(1, 1, 8))
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        h = self.proj(torch.cat([self.cls.expand(x.shape[0], 1, 8), x], 1))
        return ((h @ h.transpose(1, 2)).softmax(-1) @ h).pow(2).sum() + h.mean()


def test_training_through_a_cat_along_the_padded_length_matches_eager():
    # the forward runs padded (its saved activations keep the cat's padding, in a merged
    # (batch * length) dim); the backward got them at their padded shape and crashed
    torch.manual_seed(0)
    model = _WithClassToken()
    ours = copy.deepcopy(model).to("pjrt")
    compiled = torch.compile(ours, backend="pjrt", dynamic=True)
    for t in (5, 6, 7, 9):
        x = torch.randn(2, t, 8)
        model(x).backward()
        compiled(x.to("pjrt")).backward()
        for (name, a), b in zip(model.named_parameters(), ours.parameters()):
            _close(b.grad, a.grad, rtol=1e-5, atol=1e-5, msg=name)
    assert torch_pjrt.metrics.as_dict()["graph_forward_compilations"] == 2  # buckets 8, 16


def test_a_label_shift_runs_padded():
    # Hugging Face's causal-LM loss: the labels padded by one ignored position, then cut
    # by one at the front (F.pad, then [..., 1:]: the same size as before, one tag)
    def loss(logits, labels):
        shifted = F.pad(labels, (0, 1), value=-100)[..., 1:]
        return F.cross_entropy(logits.flatten(0, 1), shifted.flatten(), ignore_index=-100)

    compiled = torch.compile(loss, backend="pjrt", dynamic=True)
    for t in (5, 6, 7, 9):  # buckets 8 and 16
        logits, labels = torch.randn(2, t, 11), torch.randint(0, 11, (2, t))
        labels[1, :2] = -100
        _close(compiled(logits.to("pjrt"), labels.to("pjrt")), loss(logits, labels))
    d = torch_pjrt.metrics.as_dict()
    assert not d.get("graph_bucket_fallbacks")
    assert d["graph_compilations"] == 2


def test_a_cache_grown_by_cat_runs_one_program_per_bucket():
    # each step's cache is the last step's output, a view of its padded result: the
    # program takes that padded array as it is (no gather of the view per length)
    torch.manual_seed(0)
    compiled = torch.compile(_attend, backend="pjrt", dynamic=True)
    cache = torch.randn(2, 3, 16)
    mask = torch.ones(2, 40, dtype=torch.bool)
    mask[1, :2] = False  # (left padding in the second row)
    ours = cache.to("pjrt")
    with torch.no_grad():
        for step in range(14):  # cache lengths 3..16 before the cat, 4..17 after
            q, new = torch.randn(2, 1, 16), torch.randn(2, 1, 16)
            m, shift = mask[:, : cache.shape[1] + 1], torch.zeros(cache.shape[1])
            cache, expected = _attend(cache, q, new, m, shift)
            ours, out = compiled(ours, q.to("pjrt"), new.to("pjrt"), m.to("pjrt"), shift.to("pjrt"))
            _close(out, expected, msg=f"step {step}")
    d = torch_pjrt.metrics.as_dict()
    _close(ours, cache)
    assert not d.get("graph_bucket_fallbacks")
    # programs are built for new buckets only (of the cache's length and the mask's),
    # never for a new length: 9 for lengths 3..17, where one program per length made 28
    causes = d["graph_compile_causes"]
    assert all(
        c.endswith(("first call", "padded sizes changed")) or "padded sizes" in c for c in causes
    ), causes
    assert d["graph_compilations"] <= 9, causes
    assert not d.get("helper_compile_causes")


def test_an_index_into_a_padded_table_is_checked_against_its_true_size():
    def pick(mask, kv):
        return mask[torch.arange(2, device=mask.device)[:, None], kv]

    compiled = torch.compile(pick, backend="pjrt", dynamic=True)
    for n in (5, 6, 7):  # bucket 8: the padding is past the true size
        mask = torch.randn(2, n)
        kv = torch.tensor([[0, -1, n - 1, -n]])
        _close(compiled(mask.to("pjrt"), kv.to("pjrt")), pick(mask, kv))
    assert not torch_pjrt.metrics.as_dict().get("graph_bucket_fallbacks")
    mask, kv = torch.randn(2, 7), torch.tensor([[0, 7]])  # in the padding, out of range
    with pytest.raises(IndexError) as cpu:
        pick(mask, kv)
    with pytest.raises(IndexError) as ours:
        compiled(mask.to("pjrt"), kv.to("pjrt")).cpu()
    assert str(ours.value) == str(cpu.value)


def test_graphs_that_padding_could_change_fall_back_to_exact_sizes():
    f = torch.compile(lambda x: x.cumsum(1) * 2, backend="pjrt", dynamic=True)
    with torch.no_grad():
        for t in (5, 6, 7):
            x = torch.randn(2, t)
            _close(f(x.to("pjrt")), x.cumsum(1) * 2)
    d = torch_pjrt.metrics.as_dict()
    (reason,) = d["graph_bucket_fallbacks"]
    assert "cumsum" in reason
    assert d["graph_compilations"] == 3  # one per length, exact


def test_buckets_can_be_turned_off_and_listed():
    from torch_pjrt.config import _buckets

    assert _buckets("0") is None and _buckets("pow2") == "pow2"
    assert _buckets("64, 16,32") == (16, 32, 64)
    with pytest.raises(ValueError, match="TORCH_PJRT_BUCKETS"):
        _buckets("big")
    with torch_pjrt.config(buckets=(8, 16)):
        from torch_pjrt.compile.buckets import bucket

        assert [bucket(n) for n in (1, 8, 9, 16, 17)] == [8, 8, 16, 16, 17]


_CACHE_SCRIPT = """
import json, torch, torch_pjrt
from tests.models import TinyTransformer
torch.manual_seed(0)
m = TinyTransformer().to("pjrt")
opt = torch.optim.SGD(m.parameters(), lr=0.1)
g = torch.Generator().manual_seed(0)
batch = tuple(t.to("pjrt") for t in TinyTransformer.batch(g))
@torch.compile(backend="pjrt")
def step(batch):
    loss = m.loss(batch); loss.backward(); opt.step(); opt.zero_grad(); return loss
loss = step(batch).item()
print(json.dumps({"loss": loss, **{k: v for k, v in torch_pjrt.metrics.as_dict().items()
                                   if k.startswith(("xla_", "graph_"))}}))
"""


def test_persistent_cache_lets_a_second_process_skip_xla_compilation(tmp_path):
    env = {**os.environ, "TORCH_PJRT_CACHE": "1", "TORCH_PJRT_CACHE_DIR": str(tmp_path)}
    env["TORCH_PJRT_CACHE_MIN_SECONDS"] = "0"
    env["PYTHONPATH"] = str(ROOT)
    runs = []
    for _ in range(2):
        out = subprocess.run(
            [sys.executable, "-c", _CACHE_SCRIPT],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["loss"] == second["loss"]
    programs = first["graph_compilations"]
    assert programs == 3  # forward, backward, optimizer step
    assert first.get("xla_cache_hits", 0) == 0
    assert second["xla_cache_hits"] >= programs
    assert any(tmp_path.iterdir())


def test_cache_is_off_with_the_env_var():
    from torch_pjrt.config import Config

    os.environ["TORCH_PJRT_CACHE"] = "0"
    try:
        assert Config.from_env().cache_dir is None
    finally:
        del os.environ["TORCH_PJRT_CACHE"]
    os.environ["TORCH_PJRT_CACHE_DIR"] = "/some/where"
    try:
        assert Config.from_env().cache_dir == "/some/where"
    finally:
        del os.environ["TORCH_PJRT_CACHE_DIR"]


def test_dump_shows_a_training_step_is_one_forward_and_one_backward_program(tmp_path):
    torch.manual_seed(0)
    model = MODELS["mlp"]().to("pjrt")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = _batch(MODELS["mlp"])
    step = _compiled_step(model, opt)
    torch_pjrt.compile.dump_graphs(tmp_path)
    try:
        step(batch)
    finally:
        torch_pjrt.compile.dump_graphs(None)
    names = sorted(p.name for p in tmp_path.iterdir())
    kinds = [n.split("_")[2].split(".")[0] for n in names if n.endswith(".stablehlo.mlir")]
    assert sorted(kinds) == ["backward", "forward", "inference"], names
    forward = next(p for p in tmp_path.iterdir() if p.name.endswith("forward.stablehlo.mlir"))
    text = forward.read_text()
    assert "stablehlo.dot_general" in text and "func.func public @main" in text
    fx = next(p for p in tmp_path.iterdir() if p.name.endswith("forward.fx.txt")).read_text()
    assert "aten.addmm" in fx or "aten.mm" in fx


def _coverage_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "compile_coverage", ROOT / "scripts" / "compile_coverage.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# a fast subset of scripts/compile_coverage.py: one op or more of every family, and the
# ones whose outputs alias their input (AOT autograd rebuilds those from our strides)
COMPILE_SUBSET = [
    "add", "mul", "where", "clamp", "frexp", "sum", "mean", "amax", "argmax", "cumsum",
    "softmax", "log_softmax", "matmul", "bmm", "addmm", "einsum", "nn.functional.conv2d",
    "nn.functional.layer_norm", "nn.functional.embedding", "nn.functional.cross_entropy",
    "nn.functional.one_hot", "index_select", "gather", "index_put", "scatter_add",
    "split", "dsplit", "unbind", "as_strided", "t", "expand", "column_stack", "full",
    "arange", "tril", "topk", "sort", "linalg.norm", "fft.fft",
]  # fmt: skip


@pytest.mark.parametrize("key", COMPILE_SUBSET)
def test_op_through_compile(key):
    assert _coverage_script().check(key, n_samples=2) in ("pass", "skip")


@pytest.mark.devices(2)
def test_devices_must_agree():
    f = torch.compile(lambda x, y: x + y, backend="pjrt")
    with pytest.raises(RuntimeError, match="same device"):
        f(torch.ones(2, device="pjrt:0"), torch.ones(2, device="pjrt:1"))
