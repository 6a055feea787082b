"""Values checked on the device (torch_pjrt/runtime/asserts.py): every case CPU PyTorch
rejects for its values (an index out of range, a class target outside the classes, an
integer divided by zero, a bad probability) raises on pjrt with PyTorch's own exception
type and message, in every mode and in compiled graphs; at the next host wait, never by
a sync per op; the device stays usable, and the bad op's results keep raising.
"""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F

import torch_pjrt
from torch_pjrt import metrics

DEV = "pjrt"


def _t(values, device, dtype=None):
    return torch.tensor(values, device=device, dtype=dtype)


# (label, function of a device): each raises on the CPU
BAD = [
    ("index past the end", lambda d: torch.arange(5.0, device=d)[_t([7], d)]),
    ("index before the start", lambda d: torch.arange(5.0, device=d)[_t([-6], d)]),
    ("index of a second dim", lambda d: torch.zeros(3, 4, device=d)[:, _t([4], d)]),
    (
        "index_put_",
        lambda d: torch.zeros(5, device=d).index_put_((_t([7], d),), _t([1.0], d)),
    ),
    ("index_select", lambda d: torch.arange(5.0, device=d).index_select(0, _t([5], d))),
    ("gather negative", lambda d: torch.arange(5.0, device=d).gather(0, _t([-1], d))),
    ("take", lambda d: torch.arange(5.0, device=d).take(_t([7], d))),
    ("put_", lambda d: torch.zeros(5, device=d).put_(_t([-6], d), _t([1.0], d))),
    ("scatter_", lambda d: torch.zeros(5, device=d).scatter_(0, _t([7], d), _t([1.0], d))),
    (
        "scatter_add_",
        lambda d: torch.zeros(5, device=d).scatter_add_(0, _t([5], d), _t([1.0], d)),
    ),
    ("index_add_", lambda d: torch.zeros(5, device=d).index_add_(0, _t([7], d), _t([1.0], d))),
    (
        "index_copy_",
        lambda d: torch.zeros(5, device=d).index_copy_(0, _t([-1], d), _t([1.0], d)),
    ),
    ("index_fill_", lambda d: torch.zeros(5, device=d).index_fill_(0, _t([-6], d), 1.0)),
    ("embedding", lambda d: F.embedding(_t([7], d), torch.zeros(5, 2, device=d))),
    (
        "cross_entropy target",
        lambda d: F.cross_entropy(torch.zeros(2, 3, device=d), _t([0, 3], d)),
    ),
    ("nll_loss target", lambda d: F.nll_loss(torch.zeros(2, 3, device=d), _t([0, -2], d))),
    ("integer //", lambda d: _t([1], d) // _t([0], d)),
    ("div trunc", lambda d: torch.div(_t([1], d), _t([0], d), rounding_mode="trunc")),
    ("integer %", lambda d: _t([1], d) % _t([0], d)),
    ("multinomial negative", lambda d: torch.multinomial(_t([0.5, -0.1], d), 1)),
    ("multinomial nan", lambda d: torch.multinomial(_t([0.5, float("nan")], d), 1)),
    ("multinomial all zero", lambda d: torch.multinomial(_t([0.0, 0.0], d), 1)),
    ("repeat_interleave negative", lambda d: torch.repeat_interleave(_t([1, -1], d))),
    ("bincount negative", lambda d: torch.bincount(_t([1, -1], d))),
    (
        "binary_cross_entropy input",
        lambda d: F.binary_cross_entropy(_t([1.5], d), _t([1.0], d)),
    ),
    ("bernoulli probability", lambda d: torch.bernoulli(_t([1.5], d))),
    ("normal negative std", lambda d: torch.normal(_t([0.0], d), _t([-1.0], d))),
    (
        "embedding_bag index",
        lambda d: F.embedding_bag(_t([1, 7], d), torch.zeros(5, 2, device=d), _t([0], d)),
    ),
    ("one_hot past the classes", lambda d: F.one_hot(_t([0, 3], d), 3)),
    ("one_hot negative", lambda d: F.one_hot(_t([0, -1], d), 3)),
    ("one_hot negative, classes inferred", lambda d: F.one_hot(_t([2, -1], d))),
    ("one_hot with no classes", lambda d: F.one_hot(_t([0, 1], d), 0)),
    (
        "multinomial with replacement, infinity",
        lambda d: torch.multinomial(_t([0.5, float("inf"), -1.0], d), 2, replacement=True),
    ),
    (
        "multinomial with replacement, NaN",
        lambda d: torch.multinomial(_t([[1.0, 1.0], [float("nan"), 1.0]], d), 2, True),
    ),
    (
        "multinomial with replacement, a row of zeros",
        lambda d: torch.multinomial(_t([[0.0, 0.0], [1.0, -1.0]], d), 2, replacement=True),
    ),
    (
        "multi_margin_loss target",
        lambda d: F.multi_margin_loss(torch.zeros(2, 3, device=d), _t([0, 3], d)),
    ),
    (
        "multilabel_margin_loss target",
        lambda d: F.multilabel_margin_loss(torch.zeros(1, 3, device=d), _t([[0, -2, 1]], d)),
    ),
]


def _cpu_error(fn) -> Exception:
    with pytest.raises(Exception) as info:
        fn("cpu")
    return info.value


def _first_line(e: Exception) -> str:
    return str(e).splitlines()[0]


@pytest.mark.parametrize("mode", ["eager", "fused", "debug"])
@pytest.mark.parametrize("label, fn", BAD, ids=[b[0] for b in BAD])
def test_a_bad_value_raises_pytorchs_error(mode, label, fn):
    expected = _cpu_error(fn)
    with torch_pjrt.mode(mode), pytest.raises(type(expected)) as info:
        fn(DEV).cpu()
    assert _first_line(info.value) == _first_line(expected)


GOOD = [
    ("negative indices in range", lambda d: torch.arange(5.0, device=d)[_t([-5, -1, 4], d)]),
    ("ignore_index target", lambda d: F.nll_loss(torch.zeros(2, 3, device=d), _t([0, -100], d))),
    ("float division by zero", lambda d: _t([1.0, -1.0], d) // _t([0.0, 0.0], d)),
    ("index_fill_ negative", lambda d: torch.zeros(5, device=d).index_fill_(0, _t([-1], d), 1.0)),
    ("take negative", lambda d: torch.arange(5.0, device=d).take(_t([-5], d))),
    ("one_hot", lambda d: F.one_hot(_t([[0, 2], [1, 1]], d), 4)),
    ("one_hot, classes inferred", lambda d: F.one_hot(_t([0, 3, 1], d))),
]


@pytest.mark.parametrize("label, fn", GOOD, ids=[g[0] for g in GOOD])
def test_valid_values_pass_and_equal_the_cpu(label, fn):
    torch.testing.assert_close(fn(DEV).cpu(), fn("cpu"), equal_nan=True)


def test_reported_at_the_next_wait_with_the_op_and_its_line():
    x, bad = torch.arange(5.0, device=DEV), _t([9], DEV)
    torch.pjrt.synchronize()
    with torch_pjrt.mode("eager"):
        syncs = metrics.as_dict()["host_syncs"]
        y = x[bad]
        line = inspect.currentframe().f_lineno - 1
        z = x * 2  # the device goes on: no sync per op
        assert metrics.as_dict()["host_syncs"] == syncs
        with pytest.raises(IndexError, match="index 9 is out of bounds") as info:
            torch.pjrt.synchronize()
    note = "".join(info.value.__notes__)
    assert f"in aten.index.Tensor, called at {__file__}:{line}" in note
    assert "reported at the host's next wait" in note
    # the device stays usable, the other values are right, and the bad result raises again
    torch.testing.assert_close(z.cpu(), torch.arange(5.0) * 2)
    with pytest.raises(IndexError, match="index 9 is out of bounds"):
        y.cpu()


def test_debug_mode_raises_at_the_op():
    x = torch.arange(5.0, device=DEV)
    with torch_pjrt.mode("debug"), pytest.raises(IndexError) as info:
        x[_t([5], DEV)]
    assert "debug mode: at the op" in "".join(info.value.__notes__)


def test_a_compiled_graph_checks_its_indices():
    torch._dynamo.reset()

    def f(x, i):
        return (x[i] * 2).sum()

    compiled = torch.compile(f, backend="pjrt")
    x = torch.arange(5.0, device=DEV)
    assert compiled(x, _t([1, 2], DEV)).item() == 6.0
    with pytest.raises(IndexError, match="index 7 is out of bounds for dimension 0 with size 5"):
        compiled(x, _t([1, 7], DEV)).item()


def test_checks_off_computes_no_checks():
    x = torch.arange(5.0, device=DEV)
    with torch_pjrt.config(checks=False), torch_pjrt.mode("eager"):
        x[_t([3, 7], DEV)].cpu()  # (XLA's clamped value: no error)
    with pytest.raises(IndexError):
        x[_t([3, 8], DEV)].cpu()


def test_a_captured_graph_checks_its_indices_at_each_replay():
    x, index = torch.arange(5.0, device=DEV), _t([1], DEV)
    out = torch.zeros(1, device=DEV)
    g = torch.pjrt.Graph()
    with torch.pjrt.graph(g):
        out.copy_(x[index] * 2)
    g.replay()
    assert out.item() == 2.0
    index.fill_(7)
    g.replay()
    with pytest.raises(IndexError, match="index 7 is out of bounds for dimension 0 with size 5"):
        out.item()
    index.fill_(3)  # the graph and the device go on
    g.replay()
    assert out.item() == 6.0


@pytest.mark.parametrize("mode", ["eager", "fused"])
def test_values_computed_from_a_bad_result_raise_its_error(mode):
    """What was computed from a failed op's results, before the error was reported or
    after it, raises the same error when read (never used silently); other values are
    read as usual."""
    with torch_pjrt.mode(mode):
        x = torch.arange(5.0, device=DEV)
        y = x[_t([7], DEV)]
        z = (y * 2 + 1).sum()  # computed before the error is reported
        w = torch.ones(3, device=DEV) * 3  # unrelated to it
        p = torch.zeros(1, device=DEV)
        p.add_(y)  # an in-place write of it
        q = y[_t([0], DEV)]  # a checked op of its own (which passes) on it
        for value in (z, y, p, q, z):
            with pytest.raises(IndexError, match="index 7 is out of bounds"):
                value.cpu()
        torch.testing.assert_close(w.cpu(), torch.full((3,), 3.0))
        after = y[0:1] + 1  # computed after the error, from the bad result
        with pytest.raises(IndexError, match="index 7 is out of bounds"):
            after.item()
        torch.testing.assert_close((x + 1).cpu(), torch.arange(5.0) + 1)


def test_values_computed_across_a_fused_cut_raise_its_error():
    """A fused recording cut between the bad op and what uses it (here by the size cap)
    passes the mark on through the array the first program computed."""
    with torch_pjrt.mode("fused"), torch_pjrt.config(fused_max_ops=4):
        y = torch.arange(5.0, device=DEV)[_t([6], DEV)]
        z = y
        for _ in range(10):  # several recordings, none read back
            z = z + 1
        with pytest.raises(IndexError, match="index 6 is out of bounds"):
            torch.pjrt.synchronize()  # (the error, reported)
        with pytest.raises(IndexError, match="index 6 is out of bounds"):
            z.cpu()


def test_a_training_step_on_a_bad_batch_marks_the_parameters():
    """An embedding index out of range in a training step: the loss, the gradients and
    the parameters the optimizer updated from them all raise the index error."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(5, 4), torch.nn.Linear(4, 1)).to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(_t([1, 9], DEV)).sum()
    loss.backward()
    opt.step()
    with pytest.raises(IndexError, match="index out of range in self|out of bounds"):
        loss.item()
    for param in model.parameters():
        with pytest.raises(IndexError):
            param.cpu()


def test_a_compiled_graph_of_a_bad_result_raises_its_error():
    torch._dynamo.reset()
    compiled = torch.compile(lambda y: (y * 3).sum(), backend="pjrt")
    y = torch.arange(5.0, device=DEV)[_t([8], DEV)]
    out = compiled(y)
    with pytest.raises(IndexError, match="index 8 is out of bounds"):
        torch.pjrt.synchronize()  # (the error, reported)
    with pytest.raises(IndexError, match="index 8 is out of bounds"):
        out.item()


def test_a_replay_computed_from_a_failed_replay_raises_its_error():
    """A captured graph that accumulates into a tensor: a replay whose index fails, then
    replays with good indices that add to what it stored; the accumulated value raises the
    failed replay's error, not a sum of silently wrong values."""
    x, index = torch.arange(5.0, device=DEV), _t([1], DEV)
    total = torch.zeros(1, device=DEV)
    g = torch.pjrt.Graph()
    with torch.pjrt.graph(g):
        total.add_(x[index])
    g.replay()
    index.fill_(9)
    g.replay()  # fails: reported at the next wait
    index.fill_(2)
    g.replay()
    g.replay()  # good indices, added to the bad sum
    with pytest.raises(IndexError, match="index 9 is out of bounds"):
        torch.pjrt.synchronize()
    with pytest.raises(IndexError, match="index 9 is out of bounds"):
        total.item()


@pytest.mark.parametrize("mode", ["eager", "fused"])
def test_values_computed_from_a_replay_before_the_wait_raise_its_error(mode):
    """A replay's results, used by other ops before the host waits (and so before its
    checks are read), pass a failed check on to what those ops compute."""
    x, index = torch.arange(5.0, device=DEV), _t([1], DEV)
    out = torch.zeros(1, device=DEV)
    g = torch.pjrt.Graph()
    with torch.pjrt.graph(g):
        out.copy_(x[index] * 2)
    index.fill_(8)
    g.replay()
    with torch_pjrt.mode(mode):
        derived = out * 3 + 1  # computed before the wait
        unrelated = x + 1
    with pytest.raises(IndexError, match="index 8 is out of bounds"):
        torch.pjrt.synchronize()
    for value in (derived, out):
        with pytest.raises(IndexError, match="index 8 is out of bounds"):
            value.item()
    torch.testing.assert_close(unrelated.cpu(), torch.arange(5.0) + 1)


@pytest.mark.parametrize("mode", ["eager", "fused"])
def test_values_overwritten_whole_do_not_carry_a_failed_check(mode):
    """An op that reads a bad value's shape alone (``zero_``, ``fill_``, ``normal_``,
    ``full_like``) makes a good value: it reads as on the CPU. One that reads its values
    (``mul_(0)``), or overwrites part of it, still raises the check's error."""
    x = torch.arange(5.0, device=DEV)
    with torch_pjrt.mode(mode):
        bad = x[_t([7, 1, 2], DEV)]
    with pytest.raises(IndexError, match="index 7 is out of bounds"):
        torch.pjrt.synchronize()
    with torch_pjrt.mode(mode):
        zeroed, filled, drawn = bad.clone().zero_(), bad.clone().fill_(3.0), bad.clone()
        drawn.normal_()
        like, shifted = torch.full_like(bad, 2.0), bad.clone().zero_() + 1
        times_zero, part = bad.clone().mul_(0), bad.clone()
        part[:2].zero_()
    assert zeroed.cpu().tolist() == [0.0, 0.0, 0.0]
    assert filled.cpu().tolist() == [3.0, 3.0, 3.0]
    assert drawn.cpu().isfinite().all() and drawn.shape == (3,)
    assert like.cpu().tolist() == [2.0, 2.0, 2.0]
    assert shifted.cpu().tolist() == [1.0, 1.0, 1.0]
    for value in (times_zero, part):
        with pytest.raises(IndexError, match="index 7 is out of bounds"):
            value.cpu()


def test_a_replay_on_replaced_values_does_not_inherit_a_failed_replay():
    """The values a failed replay fed back carry its error into the next replay, but not
    once they were all replaced: a replay on good inputs then reads as usual."""
    x, index = torch.arange(5.0, device=DEV), _t([1], DEV)
    total = torch.zeros(1, device=DEV)
    g = torch.pjrt.Graph()
    with torch.pjrt.graph(g):
        total.add_(x[index])
    index.fill_(9)
    g.replay()
    with pytest.raises(IndexError, match="index 9 is out of bounds"):
        torch.pjrt.synchronize()
    total.copy_(torch.zeros(1))  # the bad sum replaced (from the host)
    index.fill_(2)
    g.replay()
    g.replay()
    assert total.item() == 4.0


def test_checks_that_held_are_read_once_done_and_not_followed():
    """A checked eager op's flags, once its program is done and its checks held, are read
    at the next program call (no host wait): what is computed after carries no mark. A
    failed check is left to the next wait, and what is computed from it still raises."""
    from torch_pjrt.device.tensor import argument
    from torch_pjrt.runtime import asserts

    with torch_pjrt.mode("eager"):
        torch.pjrt.synchronize()
        x = torch.arange(5.0, device=DEV)
        y = x[_t([2], DEV)]
        argument(y).block_until_ready()  # (its program done: no host sync of ours)
        z = y + 1
        assert getattr(argument(z), asserts.SOURCES, None) is None
        assert not asserts._expected  # (nothing unread)
        bad = x[_t([7], DEV)]
        argument(bad).block_until_ready()
        w = bad + 1
        assert asserts._expected  # (left to the wait)
        with pytest.raises(IndexError, match="index 7 is out of bounds"):
            torch.pjrt.synchronize()
        with pytest.raises(IndexError, match="index 7 is out of bounds"):
            w.cpu()
        assert z.item() == 3.0


def test_a_recording_whose_checks_held_marks_nothing():
    """A fused recording's outputs are marked with the checks they come from only when
    something looks before the checks are read: read at the host wait and held, nothing
    is marked (the following left for later is dropped); a value read from it before the
    wait, by an eager op, is followed as before."""
    from torch_pjrt.device.tensor import argument
    from torch_pjrt.runtime import asserts

    torch.pjrt.synchronize()
    with torch_pjrt.mode("fused"):
        x = torch.arange(5.0, device=DEV)
        z = x[_t([2], DEV)] * 2 + 1
        torch.pjrt.synchronize()
        assert getattr(argument(z), asserts.SOURCES, None) is None
        assert not asserts._unmarked
        assert z.item() == 5.0
        bad = x[_t([7], DEV)] * 2
    with torch_pjrt.mode("eager"):  # (the recording runs at the switch: no host wait)
        assert asserts._unmarked
        after = bad + 1  # an eager op on the recording's output, before the wait
        assert getattr(argument(after), asserts.SOURCES, None)
        with pytest.raises(IndexError, match="index 7 is out of bounds"):
            torch.pjrt.synchronize()
        with pytest.raises(IndexError, match="index 7 is out of bounds"):
            after.cpu()


def test_a_recording_left_to_follow_keeps_none_of_its_values():
    """The following a checked recording leaves for later holds neither its inputs nor
    its intermediate values: they go when its program is done with them, not at the
    next host wait (where freeing a training step's ~600 arrays cost ~0.4 ms)."""
    import weakref

    from torch_pjrt.device.tensor import argument
    from torch_pjrt.runtime import asserts

    with torch_pjrt.mode("eager"):
        a = torch.arange(5.0, device=DEV) + 1
        i = _t([2], DEV)
        torch.pjrt.synchronize()
    with torch_pjrt.mode("fused"):
        b = a * 3  # (pending: the recording's own)
        z = b[i] + 1
        gone = [weakref.ref(argument(a, lazy=True)), weakref.ref(argument(b, lazy=True))]
        del a, b
    with torch_pjrt.mode("eager"):  # (the recording runs at the switch: no host wait)
        assert asserts._unmarked  # (its following waits)
        assert [r() for r in gone] == [None, None]
        assert z.cpu().tolist() == [10.0]


def test_following_stops_when_the_bad_values_are_gone():
    """Once the values of a failed check (and those computed from them) are dropped, the
    failed check is forgotten (program calls stop looking for it in their inputs)."""
    import gc

    from torch_pjrt.runtime import asserts

    torch.pjrt.synchronize()
    with torch_pjrt.mode("eager"):
        before = set(asserts._failed)
        y = torch.arange(5.0, device=DEV)[_t([7], DEV)]
        z = y + 1
        with pytest.raises(IndexError):
            torch.pjrt.synchronize()
        failed = set(asserts._failed) - before
        assert len(failed) == 1 and asserts.watching()
        with pytest.raises(IndexError):
            z.cpu()
        del y, z, failed
        gc.collect()
        assert set(asserts._failed) <= before


def test_while_a_failed_check_is_kept_a_recording_without_checks_keeps_nothing():
    """A failed check kept alive (the user holds its value, or an exception's traceback
    does) does not make later fused recordings hold their outputs: once every check is
    read, a recording whose inputs come from no failed check is not followed, and a
    deleted result frees its memory at once (it was held until the next recording)."""
    import weakref

    from torch_pjrt.device.tensor import argument
    from torch_pjrt.runtime import asserts

    with torch_pjrt.mode("eager"):
        bad = torch.arange(5.0, device=DEV)[_t([7], DEV)]
        with pytest.raises(IndexError):
            torch.pjrt.synchronize()
    assert asserts.watching()  # (bad keeps its failed check alive)
    with torch_pjrt.mode("fused"):
        before = torch.pjrt.memory_allocated()
        keep = torch.ones(1 << 16, device=DEV) + 1
        torch.pjrt.synchronize()
        assert torch.pjrt.memory_allocated() - before >= keep.nbytes
        gone = weakref.ref(argument(keep, lazy=True))
        del keep
        assert gone() is None
        assert torch.pjrt.memory_allocated() == before
        after = bad * 2  # (from the failed check: followed, and refused)
        torch.pjrt.synchronize()
        with pytest.raises(IndexError, match="index 7 is out of bounds"):
            after.cpu()


@pytest.mark.parametrize("mode", ["eager", "fused"])
def test_inputs_that_passed_are_not_checked_again(mode):
    """Arrays never change, so a program whose checks passed on some arrays runs its
    unchecked variant on exactly those arrays again (no check recorded, one compilation
    more, once); any other array, or the same arrays in other places, is checked."""
    from torch_pjrt.runtime import asserts

    torch.pjrt.synchronize()
    x = torch.arange(5.0 + (mode == "fused"), device=DEV)
    i = _t([1, 3, 4, 2, 0, 1, 3], DEV)  # (shapes no other test indexes with)
    with torch_pjrt.mode("eager"):
        x[i].cpu()  # checked, and passes
        metrics.reset()
        for _ in range(3):
            y = x[i]
        assert not asserts._expected  # (nothing left to read)
        assert metrics.as_dict().get("eager_compilations", 0) == 1  # the unchecked one, once
        torch.testing.assert_close(y.cpu(), torch.tensor([1.0, 3.0, 4.0, 2.0, 0.0, 1.0, 3.0]))
    with torch_pjrt.mode(mode):
        j = _t([1, 7, 0, 0, 0, 0, 0], DEV)  # another array: checked
        with pytest.raises(IndexError, match="index 7 is out of bounds"):
            x[j].cpu()
        i.add_(5)  # the same tensor, a new value: checked
        with pytest.raises(IndexError, match="index 6 is out of bounds"):
            x[i].cpu()
        with pytest.raises(IndexError, match="index 6 is out of bounds"):  # failed: again
            x[i].cpu()


def test_inputs_that_passed_in_turn_are_not_checked_again():
    """Two index tensors that passed, used in turn: neither is checked again (the rule
    knows the arrays of its last mark at a glance, the other's mark says what it
    passed); a third, out of range, raises."""
    from torch_pjrt.runtime import asserts

    torch.pjrt.synchronize()
    x = torch.arange(9.0, device=DEV)
    a, b = _t([0, 1, 2, 3, 4], DEV), _t([8, 3, 2, 1, 0], DEV)  # (shapes of this test's)
    with torch_pjrt.mode("eager"):
        x[a].cpu(), x[b].cpu()  # checked, and pass
        for _ in range(3):
            ya, yb = x[a], x[b]
            assert not asserts._expected  # (neither checked)
        torch.testing.assert_close(ya.cpu(), torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0]))
        torch.testing.assert_close(yb.cpu(), torch.tensor([8.0, 3.0, 2.0, 1.0, 0.0]))
        with pytest.raises(IndexError, match="index 9 is out of bounds"):
            x[_t([0, 1, 2, 3, 9], DEV)].cpu()
        assert x[b].cpu()[0] == 8.0


def test_fused_recordings_take_the_unchecked_op_on_inputs_that_passed():
    """In fused mode too: once an op's checks passed on some arrays (read at a host
    wait), recording it again on those arrays records its unchecked variant (no check
    to read); the inputs may be values an earlier recording computed. Another array is
    checked, and its error raised at the wait."""
    from torch_pjrt.runtime import asserts

    torch.pjrt.synchronize()
    with torch_pjrt.mode("fused"):
        x = torch.arange(6.0, device=DEV) * 2  # (computed by a recording)
        i = _t([5, 0, 2, 2, 1, 4, 3, 0], DEV)  # (shapes no other test indexes with)
        x[i].cpu()  # recorded with x's own op: no arrays yet to mark as having passed
        x[i].cpu()  # checked on x's and i's arrays, and passes
        ys = [x[i] for _ in range(3)]
        assert not asserts._expected  # (no check recorded)
        expected = torch.tensor([10.0, 0.0, 4.0, 4.0, 2.0, 8.0, 6.0, 0.0])
        for y in ys:
            torch.testing.assert_close(y.cpu(), expected)
        j = _t([5, 0, 2, 6, 1, 4, 3, 0], DEV)
        with pytest.raises(IndexError, match="index 6 is out of bounds"):
            x[j].cpu()


@pytest.mark.parametrize("mode", ["eager", "fused"])
def test_what_a_check_does_not_read_may_change(mode):
    """An op's checks read some of its inputs (an index, not the table it indexes): once
    they passed on an index, indexing a table a step updates (a new array each step,
    shaped alike) at that index is not checked again eagerly; a table of another shape
    is, and so is a new index. A fused recording keeps the old rule (the same arrays
    everywhere), so a step's program does not change after its warm-up."""
    from torch_pjrt.runtime import asserts

    torch.pjrt.synchronize()
    table = torch.arange(9.0, device=DEV)
    i = _t([8, 0, 4, 4, 2], DEV)  # (shapes no other test indexes with)
    with torch_pjrt.mode(mode):
        table[i].cpu()  # checked, and passes
        for step in range(3):
            table.add_(1.0)  # (a new array of the same shape)
            table.cpu()  # (computed: a fused recording's table is an array too)
            y = table[i]
            assert bool(asserts._expected) == (mode == "fused"), step
            y.cpu()
        torch.testing.assert_close(y.cpu(), torch.tensor([11.0, 3.0, 7.0, 7.0, 5.0]))
        shorter = torch.arange(8.0, device=DEV)  # index 8 is out of bounds here
        with pytest.raises(IndexError, match="index 8 is out of bounds for dimension 0 with"):
            shorter[i].cpu()
        with pytest.raises(IndexError, match="index 9 is out of bounds"):
            table[i + 1].cpu()


def test_indices_that_passed_in_other_places_are_checked():
    """Two index tensors that passed together are checked again when swapped (each
    read place holds its own array), and a new one in either place is checked."""
    from torch_pjrt.runtime import asserts

    torch.pjrt.synchronize()
    x = torch.arange(15.0, device=DEV).reshape(3, 5)
    i, j = _t([2, 0, 1], DEV), _t([4, 1, 0], DEV)  # (shapes no other test indexes with)
    with torch_pjrt.mode("eager"):
        torch.testing.assert_close(x[i, j].cpu(), torch.tensor([14.0, 1.0, 5.0]))
        x[i, j]
        assert not asserts._expected  # (passed: not checked)
        with pytest.raises(IndexError, match="index 4 is out of bounds for dimension 0 with"):
            x[j, i].cpu()
        with pytest.raises(IndexError, match="index 5 is out of bounds"):
            x[i, j + 1].cpu()


def test_inputs_that_passed_under_many_layouts_of_arguments():
    """Indexing laid out many ways (Nones, slices, several index tensors) and a loss
    with and without its optional weight, each called again on inputs that passed:
    values as the CPU's; an index out of range in one of those layouts still raises."""
    x = torch.arange(24.0, device=DEV).reshape(2, 3, 4)
    i, j = _t([1, 0], DEV), _t([2, 3], DEV)
    laid = [
        lambda t, a, b: t[a],
        lambda t, a, b: t[:, a],
        lambda t, a, b: t[a, :, b],
        lambda t, a, b: t[..., b],
        lambda t, a, b: t[a, a, b],
        lambda t, a, b: t[None, a],
    ]
    logits, target = torch.randn(4, 5), torch.tensor([0, 1, 4, 2])
    weight = torch.rand(5)
    with torch_pjrt.mode("eager"):
        for _ in range(3):  # (checked, then on inputs that passed)
            for fn in laid:
                assert torch.equal(fn(x, i, j).cpu(), fn(x.cpu(), i.cpu(), j.cpu()))
            for w in (None, weight):
                got = F.nll_loss(
                    logits.to(DEV), target.to(DEV), weight=None if w is None else w.to(DEV)
                )
                torch.testing.assert_close(got.cpu(), F.nll_loss(logits, target, weight=w))
        with pytest.raises(IndexError, match="index 4 is out of bounds for dimension 1"):
            x[i, :, _t([1, 4], DEV)].cpu()
        with pytest.raises(IndexError, match="Target 5 is out of bounds"):
            F.nll_loss(logits.to(DEV), _t([0, 1, 5, 2], DEV), weight=weight.to(DEV)).cpu()


def test_a_passed_program_is_not_taken_for_another():
    """The mark names the program and the call's inputs in order: the same arrays given
    to another op, or in swapped places, are checked by it."""
    torch.pjrt.synchronize()
    with torch_pjrt.mode("eager"):
        a, b = _t([0, 1], DEV), _t([2, 0], DEV)
        torch.testing.assert_close((a // b.clamp(min=1)).cpu(), torch.tensor([0, 1]))
        c = _t([4, 2], DEV)
        (c // a.clamp(min=1)).cpu()
        # a // c passed with these arrays in these places; c // a divides by zero
        (a // c).cpu()
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            (c // a).cpu()
