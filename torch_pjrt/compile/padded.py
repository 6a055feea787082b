"""A compiled graph with symbolic sizes, run on inputs padded to buckets.

A graph whose sizes Dynamo made symbolic is compiled once per bucket of sizes rather
than once per size (``buckets.py`` has the plan, ``padding_rules.py`` how each op
treats the padding). :class:`PaddedProgram` is the graph's second program: it pads the
inputs, passes the true sizes in as one array, and returns views with the true sizes
(the activations a training forward saves for the backward stay padded).
"""

from __future__ import annotations

import math
import operator

import jax
import jax.numpy as jnp
import torch
import torch.fx

from torch_pjrt.compile import buckets, padding_rules
from torch_pjrt.compile.nodes import FREE
from torch_pjrt.device import random as pjrt_random
from torch_pjrt.runtime import events as metrics
from torch_pjrt.runtime import executor

aten = torch.ops.aten

__all__ = ["PaddedProgram"]


class PaddedProgram:
    """The padded program of one :class:`~torch_pjrt.compile.program.GraphProgram`
    (whose :meth:`arguments`, nodes and constants it uses): one XLA program per bucket
    of sizes, counted in the ``graph`` scope under the graph's name."""

    def __init__(self, graph, plan):
        self.graph = graph
        self.plan = plan
        self.program = executor.Program(
            "graph", graph.name, self._build, _describe, kind=graph.kind,
            contents=lambda key: [str(n.target) for n in graph.calls],
        )  # fmt: skip
        self.records: dict = {}  # key -> the static outputs its trace recorded
        # the tags of computed sizes (PaddedTrace.derive): tag -> (constant, tags summed),
        # in the order they were made (each after those it sums)
        self.derived: dict = {}

    def _evaluate(self, values, lengths, rng, record, input_factors, sizes):
        """Like ``GraphProgram._evaluate``, on values padded to buckets, tracking the
        padding (``padding_rules.PaddedTrace``)."""
        env: dict = dict(zip(self.graph.inputs, values))
        trace = padding_rules.PaddedTrace(self.graph, lengths, sizes)
        for i, dims in self.plan.tensor_dims.items():
            factors = list(buckets._untagged(values[i].shape))
            for d, name in dims:
                factors[d] = ((values[i].shape[d], name),)
            trace.fac[self.graph.inputs[i]] = tuple(factors)
        for i, factors in input_factors:  # saved activations that arrive padded
            trace.fac[self.graph.inputs[i]] = factors
        next_key = self.graph._keys(rng)

        def raw(a):
            return env[a] if isinstance(a, torch.fx.Node) else a

        def load(a):
            v = env[a] if isinstance(a, torch.fx.Node) else a
            return v.padded if isinstance(v, buckets.Sym) else v  # (a value's: None)

        free = self.graph.free_nodes
        for n in self.graph.body:
            if n.op == "get_attr":
                env[n] = self.graph._constant(n)
                continue
            if n in free:
                env[n] = FREE
                continue
            raw_args = torch.fx.node.map_aggregate(n.args, raw)
            call = self.graph.calls.get(n)
            if n.target is operator.getitem:  # an output of a multi-output op
                src, i = n.args
                env[n] = env[src][i]
                facs = trace.fac.get(src)
                if facs is not None and facs[i] is not None:
                    trace.fac[n] = facs[i]
                continue
            if call is None:  # size arithmetic
                flat = list(padding_rules._flat(raw_args))
                if any(isinstance(a, buckets.Sym) for a in flat):
                    env[n] = padding_rules.sym_op(n.target, raw_args, trace, n)
                else:
                    env[n] = n.target(*raw_args, **torch.fx.node.map_aggregate(n.kwargs, raw))
                continue
            args = torch.fx.node.map_aggregate(n.args, load)
            kwargs = torch.fx.node.map_aggregate(n.kwargs, load)
            if n.target is aten.sym_size.int:
                f = trace.f(n.args[0], args[0])
                d = padding_rules._wrap(args[1], len(f))
                env[n] = buckets.Sym(args[0].shape[d], buckets._true_count(f, [d], lengths), f[d])
                continue
            key = next_key() if call.random else None
            env[n], trace.fac[n] = trace.run_node(n, call, args, kwargs, raw_args, key)
        for name, (_, const, tags) in trace.derived.items():
            self.derived.setdefault(name, (const, tags))
        outs = []
        for i, o in enumerate(self.graph.outputs):
            v = env[o] if isinstance(o, torch.fx.Node) else o
            if isinstance(v, jax.Array):
                record[i] = trace.f(o, v)
                outs.append(v)
            elif v is FREE:  # (computed at each call: GraphProgram.host_outputs)
                record[i] = FREE
                outs.append(None)
            elif isinstance(v, buckets.Sym):
                if v.factors is None:
                    if o not in self.graph.inputs and o not in self.graph.host_nodes:
                        raise buckets.NotBucketable("a computed size is an output")
                    record[i] = FREE  # (arithmetic on ints: computed on the host)
                else:
                    record[i] = ("size", v.factors)
                outs.append(None)
            elif v is not None:
                raise buckets.NotBucketable("a value is an output")
            else:
                record[i] = None
                outs.append(None)
        return outs

    def __call__(self, args):
        """Run on inputs padded to buckets; outputs are views with the true sizes."""
        plan = self.plan
        given = args
        true = {name: int(args[i]) for i, name in plan.symbols.items()}
        padded = {name: buckets.bucket(v) for name, v in true.items()}
        # (the lengths vector: the symbols' true sizes, the derived inputs', the values')
        derived_true = [int(args[i]) for i in sorted(plan.derived)]
        derived_true += [int(args[i]) for i in sorted(plan.values)]
        args = list(args)
        for i in plan.values:  # (run-time values: not static arguments)
            args[i] = 0
        for i, name in plan.symbols.items():
            args[i] = padded[name]
        for i in plan.derived:
            args[i] = plan.padded_value(i, padded)
        # (a view of a padded output, the last step's KV cache: its padded array as it is)
        stored = {}
        for i, dims in plan.tensor_dims.items():
            if i not in plan.merged and isinstance(args[i], torch.Tensor):
                a = buckets.prefix_array(args[i], dims)
                if a is not None:
                    stored[i] = a
        _, arrays, statics, index, kinds, _ = self.graph.arguments(args, stored)
        positions = [i for i, k in enumerate(kinds) if k == "a"]
        input_factors = []
        for j, i in enumerate(positions):
            arrived = buckets.padded_of(args[i])
            if arrived is not None:  # a saved activation, still padded
                if any(arrived.true.get(name) != v for name, v in true.items()):
                    raise buckets.NotBucketable("an input padded for other sizes")
                if any(t is not None and t not in true for d in arrived.factors for _, t in d):
                    raise buckets.NotBucketable("an input padded by a computed size")
                arrays[j] = arrived.array
                input_factors.append((i, arrived.factors))
            elif i in plan.merged:
                raise buckets.NotBucketable("an input with a merged dynamic size")
            elif i in plan.tensor_dims and i not in stored:
                arrays[j] = buckets.pad_input(arrays[j], plan.tensor_dims[i], padded)
        input_factors = tuple(input_factors)
        avals = tuple([a.aval for a in arrays])
        precision = torch.get_float32_matmul_precision()
        sizes = tuple([padded[name] for name in plan.names])  # (stored arrays' shapes vary)
        key = ("padded", statics, kinds, avals, input_factors, precision, sizes)
        program = self.program
        rng = pjrt_random.next_key_parts(index) if self.graph.random_nodes else (0, 0)
        lengths = jnp.asarray([true[name] for name in plan.names] + derived_true, jnp.int32)
        metrics.count("graph_executions")
        if key not in program.cache and self.graph.dumper is not None and self.graph.dumper.active:
            self.graph.dumper.write(self.graph, program.lower(key, arrays, lengths, rng))
        outs = program(key, arrays, lengths, rng)
        for name, (const, tags) in self.derived.items():  # (the computed sizes' tags)
            true[name] = const + sum([true[t] for t in tags])
        record = self.records[key]
        results = []
        n_user = len(outs) if self.graph.n_user_outputs is None else self.graph.n_user_outputs
        hosted = None
        for i, a in enumerate(outs):
            info = record[i]
            if info is FREE:
                if hosted is None:  # (every free output at once)
                    hosted = self.graph.host_outputs(given)
                results.append(hosted[i])
            elif a is None:
                results.append(
                    None if info is None else math.prod(buckets.true_shape((info[1],), true))
                )
            elif i < n_user:
                results.append(buckets.true_view(a, info, true, index))
            else:  # saved for the backward: stays padded (a view of it if that can be)
                results.append(buckets.saved(a, info, true, index))
        return results

    def _build(self, key):
        statics, kinds, input_factors, sizes = key[1], key[2], key[4], key[6]
        plan = self.plan
        record: dict = {}
        names = plan.names

        derived = {i: len(names) + k for k, i in enumerate(sorted(plan.derived))}
        only_values = {i: len(names) + len(derived) + k for k, i in enumerate(sorted(plan.values))}

        def run(arrays, lengths_vec, rng):
            metrics.count("compile_traces")
            lengths = {name: lengths_vec[k] for k, name in enumerate(names)}
            values, it_arrays, it_statics = [], iter(arrays), iter(statics)
            for i, kind in enumerate(kinds):
                if kind == "a":
                    values.append(next(it_arrays))
                    continue
                if kind == "h":
                    values.append(FREE)
                    continue
                value = next(it_statics)
                name = plan.symbols.get(i)
                if name is not None:
                    value = buckets.Sym(value, lengths[name], ((value, name),))
                elif i in derived:
                    value = buckets.Sym(value, lengths_vec[derived[i]], None)
                elif i in only_values:  # (no padded value: a size it is not)
                    value = buckets.Sym(None, lengths_vec[only_values[i]], None)
                values.append(value)
            padded, arrived = dict(zip(names, sizes)), dict(input_factors)
            for i, dims in plan.tensor_dims.items():  # (stored arrays cut or padded here)
                if kinds[i] == "a" and i not in arrived:
                    values[i] = buckets.pad_input(values[i], dims, padded)
            return self._evaluate(values, lengths, rng, record, input_factors, padded)

        run.__name__ = run.__qualname__ = self.graph.name
        self.records[key] = record
        return run, False


def _describe(key, traced) -> list:
    """What a padded graph program was compiled for: the bucket sizes show in its
    inputs' shapes."""
    _, statics, kinds, avals, input_factors, precision, sizes = key
    return [
        ("float32 matmul precision", precision),
        ("padded sizes", sizes),
        ("argument kinds", kinds),
        ("static arguments", statics),
        ("padding of saved activations", input_factors),
        *((f"input {i}", a) for i, a in enumerate(avals)),
    ]
