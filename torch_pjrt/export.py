"""``torch.export`` programs as StableHLO artifacts that run with JAX alone, and models
as LiteRT flatbuffers.

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

:func:`to_litert` converts a module (on pjrt or the CPU) to a ``.tflite`` file through
litert-torch, and :func:`load_litert` runs one in the LiteRT interpreter.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import shutil
import tempfile

import jax
import numpy as np
import torch

__all__ = ["load", "load_litert", "save", "stablehlo", "to_litert"]

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


def _check_static_sizes(ep: torch.export.ExportedProgram, target: str) -> None:
    """Refuse a program with a size that depends on tensor values (``x[x > 0]``,
    ``nonzero``): neither export target can hold one. Names the op and the user's line."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    from torch_pjrt.compile.nodes import source_line

    for node in ep.graph.nodes:
        if node.op != "call_function":
            continue
        for val in torch.utils._pytree.tree_leaves(node.meta.get("val")):
            if isinstance(val, torch.Tensor) and free_unbacked_symbols(val.shape):
                raise RuntimeError(
                    f"torch_pjrt.export: the output of {node.target} (from "
                    f"{source_line(node) or 'a line the program did not record'}) has a "
                    f"size that depends on the tensor's values (shape {tuple(val.shape)}); "
                    f"{target} needs sizes fixed by the input shapes. Use a fixed-size form "
                    "(torch.where with the mask, or a padded result), or keep this step "
                    "in PyTorch."
                )


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
        _check_static_sizes(ep, "a StableHLO program")
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
    _check_writable(path, "torch_pjrt.export.save()")
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


def _check_writable(path: pathlib.Path, who: str) -> None:
    """Refuse, before any work, a path whose folder cannot be made or written."""
    folder = path.absolute().parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise NotADirectoryError(f"{who}: cannot write {path}: {folder} is not a directory")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PermissionError(f"{who}: cannot write {path}: {folder} is not writable")


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
        device = _one_device(args)
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


def _one_device(args) -> torch.device:
    """The device all of ``args`` are on (the CPU for none), PyTorch's error otherwise."""
    from torch_pjrt.device.binding import same_device_error

    devices = {a.device for a in args if isinstance(a, torch.Tensor)}
    if len(devices) > 1:
        raise same_device_error(*sorted(map(str, devices))[:2])
    return devices.pop() if devices else torch.device("cpu")


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


# --- LiteRT -------------------------------------------------------------------------

QUANTIZE = ("dynamic_int8",)
_NEEDS_LITERT = (
    "torch_pjrt's LiteRT export needs litert-torch ({exc}): pip install --no-deps -r "
    "requirements-litert-lock.txt (docs/export.md says why --no-deps)"
)


@contextlib.contextmanager
def _litert():
    """litert-torch, imported without its process-wide side effects: its import turns on
    JAX's global ``jax_enable_x64`` (put back here at once; its own lowerings get 64-bit
    types for the conversion's thread, as torch_pjrt's programs do), and a conversion
    would set PyTorch's loggers to WARNING for the rest of the process (told not to)."""
    prev = jax.config.jax_enable_x64
    try:
        import litert_torch
    except ImportError as exc:
        raise ImportError(_NEEDS_LITERT.format(exc=exc)) from None
    finally:
        jax.config.update("jax_enable_x64", prev)
    key = "LITERT_TORCH_SILENCE_TORCH_LOGS"
    saved = os.environ.get(key)
    os.environ[key] = "n"
    try:
        with jax.enable_x64(True):
            yield litert_torch
    finally:
        if saved is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = saved


def to_litert(
    module: torch.nn.Module, example_args, path, *, quantize: str | None = None
) -> pathlib.Path:
    """Convert ``module`` to a LiteRT flatbuffer (``.tflite``) at ``path`` through
    litert-torch, for inputs shaped like ``example_args`` (a tuple of tensors, or one).

    The module may live on pjrt (or the CPU): it is converted from a CPU copy, in eval
    mode, as ``torch.onnx.export`` does; the module itself is not touched. 64-bit inputs
    and outputs become 32-bit in the file (LiteRT's runtimes want them so).
    ``quantize="dynamic_int8"`` stores weights as int8 per channel and quantizes
    activations at run time. A failed conversion leaves no file. Returns the path."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(
            f"torch_pjrt.export.to_litert(): expected a torch.nn.Module, got "
            f"{type(module).__name__}"
        )
    if isinstance(example_args, torch.Tensor):
        example_args = (example_args,)
    if not isinstance(example_args, (tuple, list)):
        raise TypeError(
            "torch_pjrt.export.to_litert(): example_args must be a tuple of tensors, got "
            f"{type(example_args).__name__}"
        )
    if quantize is not None and quantize not in QUANTIZE:
        raise ValueError(
            f"torch_pjrt.export.to_litert(): quantize must be None or one of {QUANTIZE}, "
            f"got {quantize!r}"
        )
    path = pathlib.Path(path)
    if path.is_dir():
        raise IsADirectoryError(
            f"torch_pjrt.export.to_litert(): {path} is a directory; give a file path "
            "such as model.tflite"
        )
    _check_writable(path, "torch_pjrt.export.to_litert()")
    from torch_pjrt.runtime.transfer import module_on_cpu, tree_on_cpu

    cpu_module, cpu_args = module_on_cpu(module).eval(), tuple(tree_on_cpu(example_args))
    # (exported here first, as litert-torch will, for the clear error on a
    # data-dependent size that its JAX lowerings would otherwise raise)
    _check_static_sizes(torch.export.export(cpu_module, cpu_args, strict=False), "LiteRT")
    with _litert() as litert_torch:
        quant_config = None
        if quantize == "dynamic_int8":
            from litert_torch.generative.quantize import quant_recipes

            quant_config = quant_recipes.full_dynamic_recipe()
        try:
            converted = litert_torch.convert(cpu_module, cpu_args, quant_config=quant_config)
        except RuntimeError as exc:
            _raise_if_unlowered(exc)
            raise
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, staging = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        os.close(fd)
        try:
            converted.export(staging)
            os.replace(staging, path)
        except BaseException:
            pathlib.Path(staging).unlink(missing_ok=True)
            raise
    return path


def _raise_if_unlowered(exc: RuntimeError) -> None:
    """litert-torch's 'Lowering not found' as torch_pjrt's error for an op that cannot be
    exported: the op and the user's line."""
    from torch_pjrt.compile.nodes import source_of

    found = re.match(r"Lowering not found: (\S+)", str(exc))
    if found:
        where = source_of(str(exc).partition("Original traceback:")[2])
        raise NotImplementedError(
            f"torch_pjrt.export.to_litert: {found.group(1)} (from "
            f"{where or 'a line the program did not record'}) has no LiteRT lowering in "
            "litert-torch; replace that call, or export to StableHLO instead "
            "(torch_pjrt.export.save)."
        ) from None


def _numbered(names, prefix):
    """Signature names ``prefix0``, ``prefix1``, ... in number order."""
    return sorted(names, key=lambda n: int(n[len(prefix) :]))


class LiteRT:
    """A ``.tflite`` file in the LiteRT interpreter, as a callable on torch tensors (on
    any device; computed on the host): returns its output, or a tuple when it has
    several, on the inputs' device. Inputs are cast to the dtypes the file declares
    (int64 token ids to int32)."""

    def __init__(self, path):
        path = pathlib.Path(path)
        if not path.is_file():
            raise FileNotFoundError(
                f"torch_pjrt.export.load_litert(): no file {path}; expected a .tflite file "
                "written by torch_pjrt.export.to_litert()"
            )
        try:
            from ai_edge_litert.interpreter import Interpreter
        except ImportError as exc:
            raise ImportError(_NEEDS_LITERT.format(exc=exc)) from None

        self._runner = Interpreter(model_path=str(path)).get_signature_runner()
        details = self._runner.get_input_details()
        self._inputs = [(n, details[n]["dtype"]) for n in _numbered(details, "args_")]

    def __call__(self, *args):
        if len(args) != len(self._inputs):
            raise TypeError(
                f"the LiteRT model takes {len(self._inputs)} tensor inputs, got {len(args)}"
            )
        device = _one_device(args)
        feed = {
            name: a.detach().to("cpu").numpy().astype(dtype, copy=False)
            for (name, dtype), a in zip(self._inputs, args)
        }
        outs = self._runner(**feed)
        results = [
            torch.from_numpy(np.array(outs[n])).to(device) for n in _numbered(outs, "output_")
        ]
        return results[0] if len(results) == 1 else tuple(results)


def load_litert(path) -> LiteRT:
    """The ``.tflite`` file at ``path`` as a callable on torch tensors (LiteRT's
    interpreter on the host)."""
    return LiteRT(path)
