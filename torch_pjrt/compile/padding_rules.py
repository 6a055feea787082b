"""How each op treats padding in a graph traced on values padded to buckets (``buckets.py``
explains the scheme): ``PaddedTrace`` evaluates a graph's nodes and tracks, beside each
value, where its padding is; a rule per op family says how padding propagates or what
it is filled with, and an op with no rule raises ``NotBucketable``."""

from __future__ import annotations

import math
import operator

import jax.numpy as jnp
import torch
import torch.fx
from jax import lax
from torch._ops import OpOverload

from torch_pjrt.compile.buckets import (
    NotBucketable,
    Sym,
    _any_tagged,
    _fill,
    _regroup,
    _tagged,
    _true_count,
    _untagged,
)
from torch_pjrt.runtime import asserts

# --- rules: how an op treats padding ----------------------------------------------------


def _wrap(d, ndim):
    return d % ndim if ndim and d < 0 else d


def _canonical(dim) -> tuple:
    """A dimension's factors with adjacent unpadded ones multiplied together: the same
    elements whether a merged (batch * heads) dim was made as 2 x 4 or 2 x 2 x 2 (a
    grouped-query expansion)."""
    out: list = []
    for n, t in dim:
        if n == 1 and t is None:
            continue
        if t is None and out and out[-1][1] is None:
            out[-1] = (out[-1][0] * n, None)
        else:
            out.append((n, t))
    return tuple(out)


def _same_padding(a, b) -> bool:
    return a == b or _canonical(a) == _canonical(b)


def _broadcast(facs, shape):
    """Pointwise ops: each output dim takes the tagged factors of its inputs."""
    ndim = len(shape)
    out = []
    for d in range(ndim):
        found = None
        for f in facs:
            if f is None:
                continue
            k = d - (ndim - len(f))
            if k < 0 or not _tagged(f[k]):
                continue
            if found is not None and not _same_padding(found, f[k]):
                raise NotBucketable("operands padded differently")
            found = f[k]
        out.append(found if found is not None else ((shape[d], None),))
    return tuple(out)


def _reduce_dims(node, args, ndim):
    dims = args[1] if len(args) > 1 else node.kwargs.get("dim")
    if dims is None or dims == []:
        return list(range(ndim))
    dims = [dims] if isinstance(dims, int) else dims
    return [_wrap(d, ndim) for d in dims]


_IDENTITY = {
    "sum": 0,
    "mean": 0,
    "amax": -math.inf,
    "amin": math.inf,
    "max": -math.inf,
    "min": math.inf,
    "argmax": -math.inf,
    "argmin": math.inf,
    "all": True,
    "any": False,
    "prod": 1,
    "logsumexp": -math.inf,
}

_POSITIONAL = {"tril", "triu", "clone", "alias", "detach", "lift_fresh_copy", "_to_copy"}
_POINTWISE_EXTRA = {"where", "masked_fill", "copy"}


def _name(op: OpOverload) -> str:
    return op._schema.name.split("::")[1]


class PaddedTrace:
    """Evaluates one graph on padded values (see the module docstring)."""

    def __init__(self, program, lengths, sizes=None):
        self.program = program
        self.lengths = lengths  # tag -> its true size (traced), the derived tags' added
        self.sizes = sizes or {}  # symbol -> its padded size (the bucket)
        self.fac: dict = {}
        # the tags of sizes computed from the symbols (a KV cache's ``s0 + 1``, made by
        # ``cat`` and size arithmetic): tag -> (padded size, constant, tags summed)
        self.derived: dict = {}

    def derive(self, size, padded: int, parts) -> str:
        """The tag of a size computed from the symbols (``size``: its SymInt in the
        graph's metadata, or a node and a dim of its value), the sum of ``parts`` (true
        sizes: ints, or tags), padded to ``padded``; its true size is added to
        ``lengths``. A tag is named by its sympy expression, so a cat's length and the
        size arithmetic that computes the same length agree (their padded sizes are the
        same sums)."""
        if isinstance(size, tuple):  # (node, dim)
            val = size[0].meta.get("val")
            size = val.shape[size[1]] if isinstance(val, torch.Tensor) else None
        if not isinstance(size, torch.SymInt) or size.node.expr.is_number:
            raise NotBucketable("a computed size Dynamo did not record")
        name = str(size.node.expr)
        const = sum(p for p in parts if isinstance(p, int))
        tags = tuple(p for p in parts if not isinstance(p, int))
        known = self.derived.get(name)
        if known is None and name in self.sizes:  # (a symbol again: F.pad then [1:])
            known = (self.sizes[name],)
        if known is not None and known[0] != padded or known is None and name in self.lengths:
            raise NotBucketable(f"the size {name} padded two ways")
        if known is None:
            self.derived[name] = (padded, const, tags)
            true = const
            for tag in tags:
                true = true + self.lengths[tag]
            self.lengths[name] = true
        return name

    def run_node(self, n, call, args, kwargs, raw_args, key):
        """The value of node n and its factors."""
        op = n.target
        name = _name(op)
        tensor_facs = [self.fac.get(a) for a in _flat_nodes(n.args, n.kwargs) if a in self.fac]
        padded = any(_any_tagged(f) for f in tensor_facs)
        syms = [a for a in _flat(raw_args) if isinstance(a, Sym)]
        if not padded and not syms:
            result = call(args, kwargs, key)
            return result, _facs_of_result(result)
        if syms:
            args = _sizes_as_values(op, raw_args, args)
        rule = _RULES.get(name)
        if rule is None:
            if torch.Tag.pointwise in op.tags or name in _POINTWISE_EXTRA:
                rule = _pointwise
            elif name in _POSITIONAL:
                rule = _same
            else:
                raise NotBucketable(str(op))
        return rule(self, n, call, args, kwargs, raw_args, key)

    def f(self, node_arg, value):
        """Factors of an argument (an FX node or a constant)."""
        if isinstance(node_arg, torch.fx.Node):
            return self.fac.get(node_arg, _untagged(getattr(value, "shape", ())))
        return _untagged(getattr(value, "shape", ()))


# the arguments where a padded size may stand as a size (its padded value): shapes, and
# the end of a slice from 0 (the slice rule); anywhere else (a slice's start, a select's
# index, tril's diagonal, a split's sizes) the padded value would be silently wrong
_SIZE_ARGS = {
    **{k: ("size",) for k in ("view", "_unsafe_view", "expand", "zeros", "ones", "full")},
    **{k: ("size",) for k in ("empty", "new_empty", "new_zeros", "new_ones", "new_full")},
    "reshape": ("shape",),
    "_reshape_alias": ("size", "stride"),
    "slice": ("end",),
    "arange": ("start", "end"),  # (its bounds are its size: the arange rule)
}


def _sizes_as_values(op: OpOverload, raw_args, args):
    """A padded size may be used as a size (its padded value, ``_SIZE_ARGS``); used as
    a tensor operand (``torch.arange(n) + past_length``, a position offset) it is its
    true size, traced; used as any other value its padded value would be wrong."""
    schema = op._schema.arguments
    args = list(args)
    sizes = _SIZE_ARGS.get(_name(op), ())
    for k, (a, value) in enumerate(zip(schema, raw_args)):
        if not any(isinstance(v, Sym) for v in _flat(value)):
            continue
        if str(a.type) == "Tensor" and isinstance(value, Sym):
            args[k] = jnp.asarray(value.true).astype(jnp.int64)
            continue
        if any(isinstance(v, Sym) and v.padded is None for v in _flat(value)):
            raise NotBucketable(f"a run-time value used as a size by {op}")
        if a.name not in sizes:
            raise NotBucketable(f"a dynamic size used as {a.name} by {op}")
    return tuple(args)


def _flat(x):
    if isinstance(x, (list, tuple)):
        for v in x:
            yield from _flat(v)
    elif isinstance(x, dict):
        for v in x.values():
            yield from _flat(v)
    else:
        yield x


def _flat_nodes(args, kwargs):
    return [a for a in _flat((args, kwargs)) if isinstance(a, torch.fx.Node)]


def _facs_of_result(result):
    if isinstance(result, (list, tuple)):
        return type(result)(_facs_of_result(r) for r in result)
    if hasattr(result, "shape"):
        return _untagged(result.shape)
    return None


def _pointwise(t, n, call, args, kwargs, raw, key):
    result = call(args, kwargs, key)
    facs = [t.f(a, v) for a, v in zip(n.args, args) if hasattr(v, "shape")]
    facs += [t.f(n.kwargs[k], kwargs[k]) for k in n.kwargs if hasattr(kwargs[k], "shape")]
    if isinstance(result, (list, tuple)):  # frexp: several outputs of one shape
        return result, type(result)(_broadcast(facs, r.shape) for r in result)
    return result, _broadcast(facs, result.shape)


def _same(t, n, call, args, kwargs, raw, key):
    result = call(args, kwargs, key)
    return result, t.f(n.args[0], args[0])


def _view(t, n, call, args, kwargs, raw, key):
    result = call(args, kwargs, key)
    return result, _regroup(t.f(n.args[0], args[0]), result.shape)


def _permute(t, n, call, args, kwargs, raw, key):
    result = call(args, kwargs, key)
    f = t.f(n.args[0], args[0])
    name = _name(n.target)
    ndim = len(f)
    if name == "t":
        order = list(range(ndim))[::-1]
    elif name == "transpose":
        order = list(range(ndim))
        a, b = _wrap(args[1], ndim), _wrap(args[2], ndim)
        order[a], order[b] = order[b], order[a]
    else:
        order = [_wrap(d, ndim) for d in args[1]]
    return result, tuple(f[d] for d in order)


def _expand(t, n, call, args, kwargs, raw, key):
    result = call(args, kwargs, key)
    f = t.f(n.args[0], args[0])
    sizes = raw[1]
    lead = len(sizes) - len(f)
    out = []
    for d, s in enumerate(sizes):
        if d >= lead and (f[d - lead][0][0] != 1 or len(f[d - lead]) > 1):
            out.append(f[d - lead])
        elif isinstance(s, Sym):
            if s.factors is None:
                raise NotBucketable("expand to a computed size")
            out.append(s.factors)
        else:
            out.append(((result.shape[d], None),))
    return result, tuple(out)


def _unsqueeze(t, n, call, args, kwargs, raw, key):
    result = call(args, kwargs, key)
    f = list(t.f(n.args[0], args[0]))
    f.insert(_wrap(args[1], len(f) + 1), ((1, None),))
    return result, tuple(f)


def _squeeze(t, n, call, args, kwargs, raw, key):
    result = call(args, kwargs, key)
    f = t.f(n.args[0], args[0])
    kept = [d for d in f if not (len(d) == 1 and d[0][0] == 1)] if len(result.shape) < len(f) else f
    if len(kept) != len(result.shape):
        kept = _regroup(f, result.shape)
    return result, tuple(kept)


def _on_untagged_dim(t, n, call, args, kwargs, raw, key):
    """Ops that work along one dimension (split, select, slice...): it must not be padded."""
    result = call(args, kwargs, key)
    first = args[0][0] if isinstance(args[0], (list, tuple)) else args[0]
    first_node = n.args[0][0] if isinstance(n.args[0], (list, tuple)) else n.args[0]
    f = t.f(first_node, first)
    name = _name(n.target)
    dim = args[1] if len(args) > 1 and isinstance(args[1], int) else kwargs.get("dim", 0)
    if name in ("split", "split_with_sizes", "slice", "narrow"):
        dim = args[2] if len(args) > 2 else kwargs.get("dim", 0)
        if name in ("slice", "narrow"):
            dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    dim = _wrap(dim, len(f))
    if name == "slice" and not _tagged(f[dim]):
        # x[:, :n] with a symbolic n (a buffer of positions cut to the sequence length)
        start, end = (list(raw[2:4]) + [None, None])[:2]
        step = raw[4] if len(raw) > 4 else 1
        if isinstance(end, Sym):
            if start not in (0, None) or step != 1:
                raise NotBucketable("a slice to a symbolic size from a start")
            if end.factors is None or result.shape[dim] != end.padded:
                raise NotBucketable("slice to a symbolic size past the end")
            return result, f[:dim] + (end.factors,) + f[dim + 1 :]
    if name == "slice" and result.shape[dim] == first.shape[dim] and (len(raw) < 5 or raw[4] == 1):
        return result, f  # a full slice (x[:, 0:], logits_to_keep=0): nothing changes
    if _tagged(f[dim]) and len(f[dim]) == 1:
        # the first elements of a padded dimension are always valid: Dynamo keeps 0
        # and 1 static, so a symbolic size is at least 2
        start = raw[2] if name == "slice" and len(raw) > 2 else None
        end = raw[3] if name == "slice" and len(raw) > 3 else None
        step = raw[4] if name == "slice" and len(raw) > 4 else 1
        if (
            name == "slice"
            and start in (0, None)
            and step == 1
            and isinstance(end, int)
            and 0 <= end <= 2
        ):
            return result, f[:dim] + (((result.shape[dim], None),),) + f[dim + 1 :]
        if name == "select" and isinstance(raw[2], int) and 0 <= raw[2] < 2:
            return result, f[:dim] + f[dim + 1 :]
        first_n = start or 0
        if name == "slice" and isinstance(first_n, int) and first_n >= 0 and step == 1:
            if isinstance(end, int) and (end < 0 or end >= first.shape[dim]):
                # x[..., k:-m] (a label shift's 1:, gpt-oss's sink column's :-1): the
                # valid elements from k to m before the true end are a prefix again
                cut = first_n - (end if end < 0 else 0)
                tag = t.derive((n, dim), result.shape[dim], [f[dim][0][1], -cut])
                return result, f[:dim] + (((result.shape[dim], tag),),) + f[dim + 1 :]
    if _tagged(f[dim]):
        raise NotBucketable(f"{name} along a padded dimension")
    if name == "select":
        return result, f[:dim] + f[dim + 1 :]
    if name == "unbind":
        return result, type(result)(f[:dim] + f[dim + 1 :] for _ in result)
    pieces = result if isinstance(result, (list, tuple)) else [result]
    out = [f[:dim] + (((p.shape[dim], None),),) + f[dim + 1 :] for p in pieces]
    return result, (type(result)(out) if isinstance(result, (list, tuple)) else out[0])


def _constant_pad(t, n, call, args, kwargs, raw, key):
    """F.pad with a constant. Along an unpadded dim nothing changes; along a padded one
    (a label shift's ``F.pad(labels, (0, 1), value=-100)``) the input's padding is
    filled with the value and the input written at its left pad, so the valid elements
    (left pad, input, right pad) are a prefix, under a derived size (``s0 + 1``)."""
    x, pad = args[0], list(args[1])
    value = args[2] if len(args) > 2 else kwargs.get("value", 0)
    result = call(args, kwargs, key)
    f = list(t.f(n.args[0], x))
    pairs = {x.ndim - 1 - k: (pad[2 * k], pad[2 * k + 1]) for k in range(len(pad) // 2)}
    tagged = [d for d, (lo, hi) in pairs.items() if (lo or hi) and _tagged(f[d])]
    if tagged:
        if any(lo < 0 or hi < 0 for lo, hi in pairs.values()) or any(len(f[d]) > 1 for d in tagged):
            raise NotBucketable("constant_pad_nd cropping, or along a merged padded dim")
        x = _fill(x, tuple(f), t.lengths, value).astype(result.dtype)
        starts = [pairs.get(d, (0, 0))[0] for d in range(x.ndim)]
        result = lax.dynamic_update_slice(jnp.full(result.shape, value, result.dtype), x, starts)
    for d, (lo, hi) in pairs.items():
        if d in tagged:
            f[d] = ((result.shape[d], t.derive((n, d), result.shape[d], [f[d][0][1], lo + hi])),)
        elif not _tagged(f[d]):
            f[d] = ((result.shape[d], None),)
    return result, tuple(f)


def _cat(t, n, call, args, kwargs, raw, key):
    """cat. Along an unpadded dimension padding stays where it was. Along a padded one
    (a dynamic cache's ``cat([keys, new], -2)``) the pieces are written one after the
    other at their true lengths, so the valid elements are a prefix again and the
    pieces' padding all comes at the end: the result is padded by their padding
    together, under a tag of its own (``s0 + 1``, :meth:`PaddedTrace.derive`)."""
    result = call(args, kwargs, key)
    pieces, nodes = args[0], n.args[0]
    dim = _wrap(args[1] if len(args) > 1 else kwargs.get("dim", 0), result.ndim)
    # (a 1-d empty piece is skipped by cat whatever the other pieces' shapes)
    kept = [(t.f(a, v), v) for a, v in zip(nodes, pieces) if not (v.ndim == 1 and v.shape[0] == 0)]
    along = [g[dim] for g, _ in kept]
    others = [
        tuple(x if i != dim else ((result.shape[dim], None),) for i, x in enumerate(g))
        for g, _ in kept
    ]
    out = list(_broadcast(others, result.shape))
    if not any(_tagged(d) for d in along):
        return result, tuple(out)
    nonempty = [(g, v) for g, v in kept if v.shape[dim]]
    if len(nonempty) == 1:  # an empty cache then the new keys: the one padded piece
        return result, _broadcast([nonempty[0][0]], result.shape)
    if any(len(d) > 1 for d in along if _tagged(d)):
        raise NotBucketable("cat along a padded dimension merged with another")
    value = jnp.zeros(result.shape, result.dtype)
    at, parts = 0, []
    for d, (_, v) in zip(along, kept):
        if not v.shape[dim]:
            continue
        value = lax.dynamic_update_slice_in_dim(value, v.astype(result.dtype), at, dim)
        ((size, tag),) = d if len(d) == 1 else (((v.shape[dim], None),))
        parts.append(size if tag is None else tag)
        at = at + (size if tag is None else t.lengths[tag])
    out[dim] = ((result.shape[dim], t.derive((n, dim), result.shape[dim], parts)),)
    return value, tuple(out)


def _scatter_into(t, n, call, args, kwargs, raw, key):
    """slice_scatter / select_scatter along an unpadded dimension (``x[..., :8] = y``
    lowered functionally): the padding of both stays where it was."""
    result = call(args, kwargs, key)
    f = t.f(n.args[0], args[0])
    dim = _wrap(args[2] if len(args) > 2 else kwargs.get("dim", 0), len(f))
    if _tagged(f[dim]):
        raise NotBucketable(f"{_name(n.target)} along a padded dimension")
    fs = list(t.f(n.args[1], args[1]))
    if _name(n.target) == "select_scatter":
        fs.insert(dim, f[dim])
    else:
        fs[dim] = f[dim]
    return result, _broadcast([f, tuple(fs)], result.shape)


def _reduction(t, n, call, args, kwargs, raw, key):
    f = t.f(n.args[0], args[0])
    name = _name(n.target)
    dims = _reduce_dims(n, args, len(f))
    keepdim = bool(args[2] if len(args) > 2 else kwargs.get("keepdim", False))
    if name in ("argmax", "argmin", "max", "min") and not isinstance(
        args[1] if len(args) > 1 else kwargs.get("dim"), int
    ):
        raise NotBucketable(f"{name} over every element")
    if any(_tagged(f[d]) for d in dims):
        x = _fill(args[0], f, t.lengths, _IDENTITY[name])
        args = (x,) + tuple(args[1:])
    result = call(args, kwargs, key)
    if name == "mean" and any(_tagged(f[d]) for d in dims):
        total = math.prod(args[0].shape[d] for d in dims)
        result = result * (total / _true_count(f, dims, t.lengths)).astype(result.dtype)
    kept = tuple(((1, None),) if d in dims else f[d] for d in range(len(f)))
    if not keepdim:
        kept = tuple(x for d, x in enumerate(kept) if d not in dims)
    if isinstance(result, (list, tuple)):
        return result, type(result)(kept for _ in result)
    return result, kept


def _softmax(t, n, call, args, kwargs, raw, key):
    f = t.f(n.args[0], args[0])
    dim = _wrap(args[1], len(f))
    if _tagged(f[dim]):
        args = (_fill(args[0], f, t.lengths, -math.inf),) + tuple(args[1:])
    return call(args, kwargs, key), f


def _matmul(t, n, call, args, kwargs, raw, key):
    name = _name(n.target)
    a_pos, b_pos = (1, 2) if name in ("addmm", "baddbmm") else (0, 1)
    fa, fb = t.f(n.args[a_pos], args[a_pos]), t.f(n.args[b_pos], args[b_pos])
    if _tagged(fa[-1]) or _tagged(fb[-2]):
        if not _same_padding(fa[-1], fb[-2]):
            raise NotBucketable("a product of differently padded operands")
        args = list(args)
        args[a_pos] = _fill(args[a_pos], fa, t.lengths, 0)
        args[b_pos] = _fill(args[b_pos], fb, t.lengths, 0)
        args = tuple(args)
    result = call(args, kwargs, key)
    batch = _broadcast([fa[:-2], fb[:-2]], result.shape[:-2]) if result.ndim > 2 else ()
    out = batch + (fa[-2], fb[-1])
    if a_pos == 1:
        out = _broadcast([out, t.f(n.args[0], args[0])], result.shape)
    return result, out


def _layer_norm(t, n, call, args, kwargs, raw, key):
    f = t.f(n.args[0], args[0])
    k = len(args[1])
    if any(_tagged(d) for d in f[-k:]):
        raise NotBucketable("layer_norm over a padded dimension")
    out, mean, rstd = call(args, kwargs, key)
    stats = f[:-k] + (((1, None),),) * k
    return (out, mean, rstd), (f, stats, stats)


def _gather_rows(t, n, call, args, kwargs, raw, key):
    """embedding / index_select / index with integer indices into an unpadded table."""
    name = _name(n.target)
    if name == "embedding":
        table, idx_node, idx = args[0], n.args[1], args[1]
        table_node = n.args[0]
    elif name == "index_select":
        table, table_node, idx_node, idx = args[0], n.args[0], n.args[2], args[2]
        if _wrap(args[1], table.ndim) != 0:
            raise NotBucketable("index_select along an inner dimension")
    else:  # index.Tensor
        indices = args[1]
        if len(indices) != 1 or indices[0] is None:
            raise NotBucketable("index with several index tensors")
        table, table_node, idx_node, idx = args[0], n.args[0], n.args[1][0], indices[0]
    if _any_tagged(t.f(table_node, table)):
        raise NotBucketable(f"{name} from a padded table")
    # padded index positions hold any valid index: clamp them to 0
    fi = t.f(idx_node, idx)
    safe = _fill(idx, fi, t.lengths, 0)
    if name == "embedding":
        args = (args[0], safe) + tuple(args[2:])
    elif name == "index_select":
        args = (args[0], args[1], safe)
    else:
        args = (args[0], [safe])
    result = call(args, kwargs, key)
    rest = _untagged(result.shape[idx.ndim :])
    return result, tuple(fi) + rest


def _index(t, n, call, args, kwargs, raw, key):
    """``table[i, j, ...]`` with integer index tensors for its leading dims (a padding
    mask read at a cache's positions). Into a table padded along an indexed dim, an
    index is checked against the dim's true size (CPU's error, not the padding read)
    and a negative one counts from it; padded index positions read index 0."""
    table, indices = args[0], args[1]
    if len(indices) == 1 and indices[0] is not None and not _any_tagged(t.f(n.args[0], table)):
        return _gather_rows(t, n, call, args, kwargs, raw, key)
    if any(i is None or i.dtype == jnp.bool_ for i in indices):
        raise NotBucketable("index with a slice or a mask between its index tensors")
    ft = t.f(n.args[0], table)
    facs, safe = [], []
    for d, (node, i) in enumerate(zip(n.args[1], indices)):
        fi = t.f(node, i)
        i = _fill(i, fi, t.lengths, 0)
        if _tagged(ft[d]):
            if len(ft[d]) > 1:
                raise NotBucketable("index into a merged padded dimension")
            ((size, tag),) = ft[d]
            true = t.lengths[tag]
            ok = (i < true) & (i >= -true)
            message = "index {} is out of bounds for dimension {} with size {}"
            asserts.check(ok, IndexError, message, asserts.first_bad(i, ok), d, true)
            i = jnp.where(ok, jnp.where(i < 0, i + true, i), 0).astype(i.dtype)
        facs.append(fi)
        safe.append(i)
    result = call((table, safe) + tuple(args[2:]), kwargs, key)
    k = len(indices)
    lead = result.ndim - (table.ndim - k)
    return result, _broadcast(facs, result.shape[:lead]) + tuple(ft[k:])


def _factory(t, n, call, args, kwargs, raw, key):
    """ones/zeros/full/empty/arange with symbolic sizes: tag those dimensions."""
    result = call(args, kwargs, key)
    name = _name(n.target)
    if name == "arange":
        sizes = [raw[0] if len(raw) == 1 else None]
        if len(raw) > 1 and not (raw[0] == 0 and len(raw) == 2):
            raise NotBucketable("arange with a start")
        sizes = [raw[-1] if len(raw) == 2 else raw[0]]
    elif name.endswith("_like"):
        return result, t.f(n.args[0], args[0])
    else:
        sizes = raw[1] if name.startswith("new_") else raw[0]
    out = []
    for d, s in enumerate(sizes):
        if isinstance(s, Sym):
            if s.factors is None:
                raise NotBucketable(f"{name} of a computed size")
            out.append(s.factors)
        else:
            out.append(((result.shape[d], None),))
    return result, tuple(out)


def _nll_target(t, n, args, target_pos, ignore_pos):
    target, ft = args[target_pos], t.f(n.args[target_pos], args[target_pos])
    ignore = args[ignore_pos] if len(args) > ignore_pos else -100
    args = list(args)
    args[target_pos] = _fill(target, ft, t.lengths, ignore)  # padding is ignored
    return args, ft


def _nll_loss_forward(t, n, call, args, kwargs, raw, key):
    args, ft = _nll_target(t, n, args, 1, 4)
    out, total = call(tuple(args), kwargs, key)
    return (out, total), (ft if out.ndim else (), ())


def _nll_loss_backward(t, n, call, args, kwargs, raw, key):
    args, _ = _nll_target(t, n, args, 2, 5)
    result = call(tuple(args), kwargs, key)
    return result, _broadcast([t.f(n.args[1], args[1])], result.shape)


def _layer_norm_backward(t, n, call, args, kwargs, raw, key):
    f = t.f(n.args[1], args[1])
    k = len(args[2])
    if any(_tagged(d) for d in f[-k:]):
        raise NotBucketable("layer_norm over a padded dimension")
    args = list(args)
    args[0] = _fill(args[0], t.f(n.args[0], args[0]), t.lengths, 0)
    args[1] = _fill(args[1], f, t.lengths, 0)
    grads = call(tuple(args), kwargs, key)
    facs = tuple(
        None if g is None else (f if i == 0 else _untagged(g.shape)) for i, g in enumerate(grads)
    )
    return grads, facs


def _embedding_backward(t, n, call, args, kwargs, raw, key):
    if args[4]:
        raise NotBucketable("embedding with scale_grad_by_freq")
    args = list(args)
    args[0] = _fill(args[0], t.f(n.args[0], args[0]), t.lengths, 0)
    args[1] = _fill(args[1], t.f(n.args[1], args[1]), t.lengths, 0)
    result = call(tuple(args), kwargs, key)
    return result, _untagged(result.shape)


def _softmax_backward(t, n, call, args, kwargs, raw, key):
    fg = t.f(n.args[0], args[0])
    fo = t.f(n.args[1], args[1])
    dim = _wrap(args[2], len(fg))
    if _tagged(fg[dim]) or _tagged(fo[dim]):
        log = _name(n.target) == "_log_softmax_backward_data"
        args = (
            _fill(args[0], fg, t.lengths, 0),
            _fill(args[1], fo, t.lengths, -math.inf if log else 0),
        ) + tuple(args[2:])
    result = call(args, kwargs, key)
    return result, _broadcast([fg, fo], result.shape)


_RULES = {
    **{k: _view for k in ("view", "_unsafe_view", "reshape", "_reshape_alias")},
    **{k: _permute for k in ("t", "transpose", "permute")},
    "expand": _expand,
    "unsqueeze": _unsqueeze,
    "squeeze": _squeeze,
    **{
        k: _on_untagged_dim
        for k in ("split", "split_with_sizes", "select", "slice", "narrow", "unbind")
    },
    "cat": _cat,
    "constant_pad_nd": _constant_pad,
    "slice_scatter": _scatter_into,
    "select_scatter": _scatter_into,
    **{k: _reduction for k in _IDENTITY},
    "_softmax": _softmax,
    "_log_softmax": _softmax,
    "_safe_softmax": _softmax,  # (-inf padding changes no row: one of -inf stays one)
    **{k: _matmul for k in ("mm", "bmm", "addmm", "baddbmm")},
    "native_layer_norm": _layer_norm,
    "native_layer_norm_backward": _layer_norm_backward,
    "nll_loss_forward": _nll_loss_forward,
    "nll_loss_backward": _nll_loss_backward,
    "embedding_dense_backward": _embedding_backward,
    "_softmax_backward_data": _softmax_backward,
    "_log_softmax_backward_data": _softmax_backward,
    **{k: _gather_rows for k in ("embedding", "index_select")},
    "index": _index,
    **{
        k: _factory
        for k in (
            "ones",
            "zeros",
            "full",
            "empty",
            "arange",
            "zeros_like",
            "ones_like",
            "empty_like",
            "full_like",
            "new_empty",
            "new_zeros",
            "new_ones",
            "new_full",
        )
    },
}

_SYM_OPS = {operator.mul, operator.add, operator.sub, operator.floordiv}


def sym_op(target, args, trace=None, node=None):
    """Size arithmetic on symbolic sizes: padded and true values side by side. A sum of
    padded sizes and ints (``past_length + 1``) is a size padded by the sum of their
    padding, under the tag ``cat`` gives the same length (:meth:`PaddedTrace.derive`)."""
    if target is torch.sym_sum:  # (Dynamo's sum of several sizes: one list)
        target, args = operator.add, list(args[0])
    if any(isinstance(a, Sym) and a.padded is None for a in args):
        # a run-time value (buckets._only_a_value): its true value alone
        trues = [a.true if isinstance(a, Sym) else a for a in args]
        if target in (torch.sym_max, torch.sym_min):
            pick = jnp.maximum if target is torch.sym_max else jnp.minimum
            return Sym(None, pick(*trues), None)
        if target not in _SYM_OPS:
            raise NotBucketable(f"size arithmetic {target.__name__}")
        return Sym(None, sum(trues) if target is operator.add else target(*trues), None)
    if target not in _SYM_OPS:
        raise NotBucketable(f"size arithmetic {target.__name__}")
    if target is operator.add:
        padded = sum([a.padded if isinstance(a, Sym) else a for a in args])
        true = sum([a.true if isinstance(a, Sym) else a for a in args])
    else:
        padded = target(*(a.padded if isinstance(a, Sym) else a for a in args))
        true = target(*(a.true if isinstance(a, Sym) else a for a in args))
    factors = None
    if target is operator.mul:
        factors = ()
        for a in args:
            if isinstance(a, Sym) and a.factors is not None:
                factors += a.factors
            elif isinstance(a, int):
                factors += ((a, None),)
            else:
                factors = None
                break
    elif target is operator.add and trace is not None:
        parts = []
        for a in args:
            if isinstance(a, int):
                parts.append(a)
            elif a.factors is not None and len(a.factors) == 1 and a.factors[0][1] is not None:
                parts.append(a.factors[0][1])
            else:
                parts = None
                break
        if parts is not None:
            factors = ((padded, trace.derive(node.meta.get("val"), padded, parts)),)
    return Sym(padded, true, factors)
