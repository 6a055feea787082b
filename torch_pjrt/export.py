"""``torch.export`` programs as StableHLO artifacts that run with JAX alone.

:func:`save` lowers an ``ExportedProgram`` (made from a model on pjrt or on the CPU)
through the same lowering registry that ``torch.compile(backend="pjrt")`` uses into one
``jax.export`` program, and writes it with its weights to a directory; :func:`load`
gives it back as a callable on torch tensors; a process with only ``jax`` and ``numpy``
runs the directory too (docs/export.md shows the lines). Symbolic dimensions of the
export (``torch.export.Dim``) stay symbolic in the artifact.

The directory holds:

- ``program.jaxexport``: ``jax.export.Exported.serialize()`` of a function
  ``f(weights, *inputs) -> list of outputs``;
- ``weights.npz``: the weights, in order, as ``w0``, ``w1``, ...;
- ``meta.json``: the format version, the platforms, and the inputs' and outputs' dtypes
  and shapes (symbolic dimensions by name).

Value checks (an index past the end, docs/semantics.md) are not part of an exported
program: nothing would read them where it runs.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import tempfile

import jax
import numpy as np
import torch

__all__ = ["load", "save", "stablehlo"]

FORMAT = 1
_PROGRAM, _WEIGHTS, _META = "program.jaxexport", "weights.npz", "meta.json"

# nodes of an exported graph that only restate what the program's shapes already fix
_ASSERTS = (
    torch.ops.aten._assert_tensor_metadata.default,
    torch.ops.aten._assert_scalar.default,
    torch.ops.aten.sym_constrain_range_for_size.default,
)


def _sdpa_math(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw):
    """``scaled_dot_product_attention`` as PyTorch's math composite (one exported program
    runs on whatever chip loads it: no kernel is chosen at export). A boolean mask
    becomes the additive one first, as ATen's entry point does before the math."""
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros((), dtype=q.dtype, device=q.device).masked_fill(
            ~attn_mask, float("-inf")
        )
    return torch.ops.aten._scaled_dot_product_attention_math.default(
        q, k, v, attn_mask, dropout_p, is_causal, scale=scale, **kw
    )[0]


def _decomposed(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    from torch_pjrt.compile.compiler import _decompositions
    from torch_pjrt.kernels import attention

    table = torch.export.default_decompositions()
    for op, fn in _decompositions().items():
        table[op] = fn
    table[torch.ops.aten.scaled_dot_product_attention.default] = _sdpa_math
    with attention.unregistered():
        return ep.run_decompositions(table)


class _Lowered:
    """An ExportedProgram's graph as ``fn(weights, *inputs)`` on JAX arrays, with its
    weights (numpy, in the order ``fn`` takes them) and its inputs' shapes."""

    def __init__(self, ep: torch.export.ExportedProgram):
        from torch_pjrt.compile.nodes import Unsupported
        from torch_pjrt.compile.program import GraphProgram

        if not isinstance(ep, torch.export.ExportedProgram):
            raise TypeError(
                "torch_pjrt.export.save(): expected the ExportedProgram that "
                f"torch.export.export() returns, got {type(ep).__name__}"
            )
        ep = _decomposed(ep)
        gm = ep.graph_module
        for node in list(gm.graph.nodes):
            if node.op == "call_function" and node.target in _ASSERTS and not node.users:
                gm.graph.erase_node(node)
        gm.recompile()
        try:
            self.graph = GraphProgram(gm)
        except Unsupported as exc:
            raise NotImplementedError(
                f"torch_pjrt.export: in the exported program, {exc} and no decomposition: "
                "it cannot be saved as one StableHLO program. Replace that call, or keep "
                "the model in PyTorch."
            ) from None
        self.kinds, self.weights = [], []
        lifted = {**ep.state_dict, **ep.constants}
        for spec in ep.graph_signature.input_specs:
            if spec.kind.name == "USER_INPUT":
                self.kinds.append("input")
            elif spec.target in lifted:
                self.kinds.append("weight")
                value = lifted[spec.target]
                self.weights.append(value.detach().to("cpu").numpy())
            else:  # (a token, a custom object: nothing an array program can take)
                raise NotImplementedError(
                    f"torch_pjrt.export: the exported program's input {spec.arg} "
                    f"({spec.kind.name}) cannot be saved"
                )
        placeholders = self.graph.inputs
        self.inputs = [n.meta["val"] for n, k in zip(placeholders, self.kinds) if k == "input"]

    def fn(self, weights, *inputs):
        from torch_pjrt.runtime import asserts

        it_w, it_in = iter(weights), iter(inputs)
        values = [next(it_w) if k == "weight" else next(it_in) for k in self.kinds]
        with asserts.tracing(off=True):
            outs, _ = self.graph._evaluate(values, None, {})
        return outs

    def input_specs(self, scope):
        """The inputs as ``jax.ShapeDtypeStruct``s, PyTorch's symbolic sizes as JAX's."""
        from torch_pjrt.runtime.transfer import jax_dtype

        specs = []
        for val in self.inputs:
            shape = [_dim(d, scope) for d in val.shape]
            specs.append(jax.ShapeDtypeStruct(tuple(shape), jax_dtype(val.dtype)))
        return specs


def _dim(d, scope):
    if isinstance(d, torch.SymInt):
        return jax.export.symbolic_shape(str(d.node.expr), scope=scope)[0]
    return int(d)


def _exported(ep, platforms):
    from torch_pjrt.runtime import x64

    lowered = _Lowered(ep)
    scope = jax.export.SymbolicScope()
    weights = [jax.ShapeDtypeStruct(w.shape, w.dtype) for w in lowered.weights]
    prev = x64.on()
    try:
        exported = jax.export.export(jax.jit(lowered.fn), platforms=tuple(platforms))(
            weights, *lowered.input_specs(scope)
        )
    finally:
        x64.restore(prev)
    return lowered, exported


def save(ep, path, platforms=("cpu",)) -> pathlib.Path:
    """Write ``ep`` (a ``torch.export.ExportedProgram``) to the directory ``path`` as a
    StableHLO program for ``platforms`` ("cpu", "cuda", "rocm", "tpu"; several at once)
    and its weights. A failed save leaves no directory behind. Returns the path."""
    path = pathlib.Path(path)
    if isinstance(platforms, str):
        platforms = (platforms,)
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"torch_pjrt.export.save(): {path} exists and is not a directory")
    lowered, exported = _exported(ep, platforms)
    meta = {
        "format": FORMAT,
        "platforms": list(platforms),
        "inputs": [_describe(a) for a in exported.in_avals[len(lowered.weights) :]],
        "outputs": [_describe(a) for a in exported.out_avals],
    }
    parent = path.parent
    parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=parent))
    try:
        (staging / _PROGRAM).write_bytes(exported.serialize())
        np.savez(staging / _WEIGHTS, **{f"w{i}": w for i, w in enumerate(lowered.weights)})
        (staging / _META).write_text(json.dumps(meta, indent=1))
        if path.exists():
            shutil.rmtree(path)
        os.replace(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return path


def _describe(aval) -> dict:
    return {"dtype": str(aval.dtype), "shape": [str(d) for d in aval.shape]}


class Loaded:
    """A saved program as a callable on torch tensors (all on one pjrt device, or all on
    the CPU): returns its output, or a tuple when it has several, on the inputs' device."""

    def __init__(self, path):
        path = pathlib.Path(path)
        for name in (_PROGRAM, _WEIGHTS, _META):
            if not (path / name).is_file():
                raise FileNotFoundError(
                    f"torch_pjrt.export.load(): {path} has no {name}; expected a directory "
                    "written by torch_pjrt.export.save()"
                )
        self.meta = json.loads((path / _META).read_text())
        if self.meta.get("format") != FORMAT:
            raise ValueError(
                f"torch_pjrt.export.load(): {path} is format {self.meta.get('format')}; "
                f"this torch_pjrt reads format {FORMAT}"
            )
        self.exported = jax.export.deserialize(bytearray((path / _PROGRAM).read_bytes()))
        with np.load(path / _WEIGHTS) as npz:
            self.weights = [npz[f"w{i}"] for i in range(len(npz.files))]
        self._placed: dict = {}  # JAX device -> the weights there

    def __call__(self, *args):
        from torch_pjrt.runtime import x64
        from torch_pjrt.runtime.transfer import from_numpy, to_numpy

        if len(args) != len(self.meta["inputs"]):
            raise TypeError(
                f"the exported program takes {len(self.meta['inputs'])} tensor inputs, "
                f"got {len(args)}"
            )
        devices = {a.device for a in args if isinstance(a, torch.Tensor)}
        if len(devices) > 1:
            raise RuntimeError(
                "Expected all tensors to be on the same device, but found at least two "
                f"devices, {', '.join(sorted(map(str, devices)))}!"
            )
        device = devices.pop() if devices else torch.device("cpu")
        on_pjrt = device.type == "pjrt"
        prev = x64.on()
        try:
            if on_pjrt:
                from torch_pjrt.device.binding import array_of

                index = device.index or 0
                arrays = [array_of(a, index) for a in args]
                target = next(iter(arrays[0].devices())) if arrays else None
                weights = self._placed.get(target)
                if weights is None:
                    weights = self._placed[target] = jax.device_put(self.weights, target)
                outs = self.exported.call(weights, *arrays)
            else:
                outs = self.exported.call(self.weights, *[to_numpy(a) for a in args])
        finally:
            x64.restore(prev)
        if on_pjrt:
            from torch_pjrt.device.tensor import wrap

            results = [wrap(o, index) for o in outs]
        else:
            results = [from_numpy(np.array(o), _torch_dtype(o)) for o in outs]
        return results[0] if len(results) == 1 else tuple(results)

    def stablehlo(self) -> str:
        """The program's StableHLO text."""
        return self.exported.mlir_module()


def _torch_dtype(a):
    from torch_pjrt.runtime.transfer import torch_dtype

    return torch_dtype(a.dtype)


def load(path) -> Loaded:
    """The program :func:`save` wrote to ``path``, as a callable on torch tensors."""
    return Loaded(path)


def stablehlo(ep, platforms=("cpu",)) -> str:
    """The StableHLO text of ``ep`` (an ExportedProgram) as :func:`save` would write it."""
    if isinstance(platforms, str):
        platforms = (platforms,)
    return _exported(ep, platforms)[1].mlir_module()
