"""Hardware-aware lints: code that runs on an XLA device, but slowly. Reported, never
rewritten. Heuristics on the syntax tree (no types, no execution):

- ``head-dim``: an attention head size that is not a multiple of 128, where it can be
  computed from integer literals: ``head_dim = 64``-like names, ``d_model // n_heads``
  of known constants, ``nn.MultiheadAttention(embed_dim, num_heads)``,
  ``nn.Transformer*(d_model, nhead)`` and config keywords (``hidden_size`` with
  ``num_attention_heads``, ``n_embd`` with ``n_head``, ...).
- ``host-sync``: ``.item()``, ``.cpu()``, ``.numpy()``, ``.tolist()`` or ``print(x)`` in
  a training loop (a ``for``/``while`` whose body calls ``.backward()`` or
  ``<optimizer>.step()``), unless under an ``if`` that tests a modulo (``step % 10``:
  logged every N steps, the fix).
- ``tensor-loop``: a Python loop over a tensor's elements: ``for x in t`` where ``t`` was
  made by a torch factory (or ``.to``/``.cuda``/...), ``for i in range(len(t))``,
  ``range(t.shape[0])`` or ``range(t.size(0))`` whose body indexes ``t[i]``.
- ``dynamic-shape``: in a loop, a slice whose length depends on the loop variable
  (``x[:i]``; ``x[i:i + n]`` keeps its length and is not reported), or a tensor factory
  whose size does (``torch.randn(i)``, ``torch.randint(0, 9, (n,))`` with ``n`` drawn
  in the loop by ``random.*``, ``.item()`` or ``torch.randint``).
- ``float64``: ``torch.float64`` / ``torch.double`` and ``.double()``.
"""

from __future__ import annotations

import re

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider, QualifiedNameProvider

from torch_pjrt.migrate.findings import Finding
from torch_pjrt.migrate.rewrite import qualified_name

__all__ = ["lint_module"]

_HEAD_NAME = re.compile(
    r"(head_?dim|d_?head|head_?size|dim_?head|d_k|d_v|attention_head_size)", re.I
)
# keyword pairs (model width, head count) of layers and model configs
_HEAD_KEYWORDS = (
    ("hidden_size", "num_attention_heads"),
    ("n_embd", "n_head"),
    ("d_model", "nhead"),
    ("d_model", "n_heads"),
    ("d_model", "num_heads"),
    ("embed_dim", "num_heads"),
    ("dim", "heads"),
    ("dim", "n_heads"),
)
# positional (width, heads) of torch.nn layers
_HEAD_POSITIONAL = {
    "torch.nn.MultiheadAttention": ("embed_dim", "num_heads"),
    "torch.nn.Transformer": ("d_model", "nhead"),
    "torch.nn.TransformerEncoderLayer": ("d_model", "nhead"),
    "torch.nn.TransformerDecoderLayer": ("d_model", "nhead"),
}
_FACTORIES = {
    "randn", "rand", "zeros", "ones", "empty", "full", "arange", "randint", "tensor",
    "linspace", "randperm", "stack", "cat", "from_numpy", "as_tensor",
}  # fmt: skip
_SIZED = {"randn", "rand", "zeros", "ones", "empty", "full", "arange", "randint", "randperm"}
_TENSOR_METHODS = {"to", "cuda", "float", "half", "bfloat16", "detach", "clone", "view",
                   "reshape", "contiguous"}  # fmt: skip
_SYNC_METHODS = {"item", "cpu", "numpy", "tolist"}

_WHY = {
    "head-dim": (
        "the matrix units of TPUs (128x128) and the tensor cores of GPUs work on tiles of "
        "128: a smaller or odd head size is padded, wasting up to half of the attention "
        "FLOPs. Fix: a head size of 128 (fewer, wider heads) where the model allows."
    ),
    "host-sync": (
        "it copies a device value to the host every step: the host waits for the device "
        "and, in fused mode, the recorded graph is cut there. Fix: keep the values on the "
        "device (accumulate a tensor) and read them every N steps or after the loop."
    ),
    "tensor-loop": (
        "each iteration launches its own small device computations (and `t[i]` reads "
        "may sync): the loop runs at Python speed. Fix: one vectorized expression "
        "(broadcasting, torch.where, gather, cumsum, ...)."
    ),
    "dynamic-shape": (
        "XLA compiles one program per input shape: a shape that changes every step "
        "compiles every step (seconds each). Fix: pad to a few fixed sizes (buckets) and "
        "mask, or keep the shape fixed."
    ),
    "float64": (
        "TPUs have no float64 hardware (it is emulated, or demoted to float32 unless JAX "
        "runs with x64) and GPUs run it at a fraction of float32's rate. Fix: float32, or "
        "bfloat16 under autocast; keep float64 on the CPU where it is needed."
    ),
}
_RISK = {"head-dim": "low", "host-sync": "medium", "tensor-loop": "medium",
         "dynamic-shape": "medium", "float64": "medium"}  # fmt: skip


def _names(node: cst.CSTNode) -> set[str]:
    """The plain names an expression mentions."""
    found: set[str] = set()

    class _Collect(cst.CSTVisitor):
        def visit_Name(self, n: cst.Name) -> None:
            found.add(n.value)

        def visit_Attribute(self, n: cst.Attribute) -> bool:
            n.value.visit(self)  # `x.shape`: x, not shape
            return False

    node.visit(_Collect())
    return found


def _targets(node: cst.BaseAssignTargetExpression) -> set[str]:
    if isinstance(node, cst.Name):
        return {node.value}
    if isinstance(node, (cst.Tuple, cst.List)):
        return {n for e in node.elements for n in _targets(e.value)}
    return set()


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def _calls(node: cst.CSTNode):
    """Every call in ``node``, not looking into nested functions, classes or lambdas."""
    out: list[cst.Call] = []

    class _Collect(cst.CSTVisitor):
        def visit_Call(self, n: cst.Call) -> None:
            out.append(n)

        def visit_FunctionDef(self, n) -> bool:
            return False

        def visit_ClassDef(self, n) -> bool:
            return False

        def visit_Lambda(self, n) -> bool:
            return False

    node.visit(_Collect())
    return out


def _is_training_loop(loop: cst.CSTNode) -> bool:
    for call in _calls(loop.body):
        func = call.func
        if isinstance(func, cst.Attribute):
            if func.attr.value == "backward":
                return True
            owner = _code(func.value).lower()
            if func.attr.value == "step" and ("opt" in owner or "scaler" in owner):
                return True
    return False


class _Linter(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider, QualifiedNameProvider)

    def __init__(self, path: str):
        super().__init__()
        self.path = path
        self.findings: dict[tuple[int, int, str], Finding] = {}
        self.constants: dict[str, int] = {}
        self.tensors: set[str] = set()  # names bound to something tensor-like
        self._training = 0  # depth of training loops around the node
        self._loop_names: list[set[str]] = []  # per enclosing loop: names that vary per step
        self._loop_targets: list[set[str]] = []  # per enclosing loop: its targets (and outer)
        self._modulo = 0  # depth of `if ... % ...:` blocks

    def _add(self, node, kind: str, what: str) -> None:
        pos = self.get_metadata(PositionProvider, node).start
        key = (pos.line, pos.column, kind)
        self.findings.setdefault(
            key,
            Finding(
                self.path,
                pos.line,
                pos.column + 1,
                kind,
                what,
                _WHY[kind],
                _RISK[kind],
                "lint",
                False,
            ),  # fmt: skip
        )

    def _eval(self, node) -> int | None:
        """An integer expression of literals and known constants, else None."""
        if isinstance(node, cst.Integer):
            return int(node.evaluated_value)
        if isinstance(node, cst.Name):
            return self.constants.get(node.value)
        if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name):
            if node.value.value == "self":
                return self.constants.get(node.attr.value)
        if isinstance(node, cst.BinaryOperation):
            a, b = self._eval(node.left), self._eval(node.right)
            if a is None or b is None:
                return None
            ops = {cst.FloorDivide: lambda: a // b if b else None,
                   cst.Multiply: lambda: a * b, cst.Add: lambda: a + b,
                   cst.Subtract: lambda: a - b}  # fmt: skip
            fn = ops.get(type(node.operator))
            return fn() if fn is not None else None
        return None

    def _head(self, node, head: int | None, detail: str) -> None:
        if head is not None and head > 0 and head % 128 != 0:
            self._add(node, "head-dim", f"attention head size {head} ({detail})")

    # -- assignments: constants, tensors, head sizes ---------------------------------

    def visit_Assign(self, node: cst.Assign) -> None:
        value = self._eval(node.value)
        names = set().union(*(_targets(t.target) for t in node.targets))
        for t in node.targets:
            target = t.target
            if isinstance(target, cst.Tuple) and isinstance(node.value, cst.Tuple):
                if len(target.elements) == len(node.value.elements):  # a, b = 1, 2
                    for e, v in zip(target.elements, node.value.elements):
                        n, val = e.value, self._eval(v.value)
                        if isinstance(n, cst.Name) and val is not None:
                            self.constants[n.value] = val
                continue
            name = target.attr.value if isinstance(target, cst.Attribute) else None
            name = target.value if isinstance(target, cst.Name) else name
            if name is None:
                continue
            if value is not None:
                self.constants[name] = value
            if name and _HEAD_NAME.fullmatch(name):
                self._head(node, value, f"{name} = {_code(node.value)}")
        if self._tensor_valued(node.value):
            self.tensors |= names
        else:
            self.tensors -= names
        if self._loop_names and self._varies(node.value):
            self._loop_names[-1].update(names)

    def _tensor_valued(self, value) -> bool:
        if not isinstance(value, cst.Call):
            return False
        q = qualified_name(self, value.func) or ""
        if q.startswith("torch.") and q.rsplit(".", 1)[-1] in _FACTORIES:
            return True
        func = value.func
        return (
            isinstance(func, cst.Attribute)
            and func.attr.value in _TENSOR_METHODS
            and (self._tensor_valued(func.value) or _code(func.value) in self.tensors)
        )

    def _varies(self, value) -> bool:
        """A value drawn per step: random.*, .item(), torch.randint(...)."""
        for call in _calls(value) if not isinstance(value, cst.Call) else [value, *_calls(value)]:
            q = qualified_name(self, call.func) or ""
            func = call.func
            if q.startswith(("random.", "numpy.random.", "torch.randint")):
                return True
            if isinstance(func, cst.Attribute) and func.attr.value == "item":
                return True
        return bool(self._loop_names) and bool(_names(value) & self._loop_names[-1])

    # -- loops -----------------------------------------------------------------------

    def visit_For(self, node: cst.For) -> None:
        self._tensor_loop(node)
        self._enter_loop(node, _targets(node.target))

    def leave_For(self, node: cst.For) -> None:
        self._leave_loop(node)

    def visit_While(self, node: cst.While) -> None:
        self._enter_loop(node, set())

    def leave_While(self, node: cst.While) -> None:
        self._leave_loop(node)

    def _enter_loop(self, node, names: set[str]) -> None:
        outer = self._loop_names[-1] if self._loop_names else set()
        self._loop_names.append(set(outer) | names)
        self._loop_targets.append((self._loop_targets[-1] if self._loop_targets else set()) | names)
        if _is_training_loop(node):
            self._training += 1

    def _leave_loop(self, node) -> None:
        self._loop_names.pop()
        self._loop_targets.pop()
        if _is_training_loop(node):
            self._training -= 1

    def _tensor_loop(self, node: cst.For) -> None:
        it = node.iter
        if isinstance(it, cst.Name) and it.value in self.tensors:
            self._add(node, "tensor-loop", f"for ... in {it.value} (a tensor)")
            return
        if not (isinstance(it, cst.Call) and _code(it.func) == "range" and it.args):
            return
        bound = it.args[-1].value if len(it.args) == 1 else None
        owner = None
        if isinstance(bound, cst.Call) and _code(bound.func) == "len" and bound.args:
            owner = _code(bound.args[0].value)
        elif isinstance(bound, cst.Subscript) and isinstance(bound.value, cst.Attribute):
            if bound.value.attr.value == "shape":
                owner = _code(bound.value.value)
        elif isinstance(bound, cst.Call) and isinstance(bound.func, cst.Attribute):
            if bound.func.attr.value == "size":
                owner = _code(bound.func.value)
        index = _targets(node.target)
        if owner is None or not index:
            return
        indexed = False

        class _Find(cst.CSTVisitor):
            def visit_Subscript(self, s: cst.Subscript) -> None:
                nonlocal indexed
                if _code(s.value) == owner and any(_names(e.slice) & index for e in s.slice):
                    indexed = True

        node.body.visit(_Find())
        if indexed:
            self._add(node, "tensor-loop", f"{_code(it)} indexing {owner}[...]")

    def visit_If(self, node: cst.If) -> None:
        if "%" in _code(node.test):
            self._modulo += 1

    def leave_If(self, node: cst.If) -> None:
        if "%" in _code(node.test):
            self._modulo -= 1

    # -- expressions -----------------------------------------------------------------

    def visit_Call(self, node: cst.Call) -> None:
        q = qualified_name(self, node.func) or ""
        func = node.func
        method = func.attr.value if isinstance(func, cst.Attribute) else None
        self._head_call(node, q)
        if method == "double" and not node.args:
            self._add(node, "float64", ".double()")
        if self._training and not self._modulo:
            if method in _SYNC_METHODS:
                self._add(node, "host-sync", f".{method}() in a training loop")
            elif q == "" and _code(func) == "print" and self._prints_values(node):
                self._add(node, "host-sync", "print(...) of a value in a training loop")
        if self._loop_names and q.startswith("torch.") and q.rsplit(".", 1)[-1] in _SIZED:
            sizes = node.args[2:] if q.endswith("randint") else node.args
            sizes = [a for a in sizes if a.keyword is None or a.keyword.value == "size"]
            if any(_names(a.value) & self._loop_names[-1] for a in sizes):
                self._add(node, "dynamic-shape", f"{q}(...) sized by a per-step value")

    def _prints_values(self, node: cst.Call) -> bool:
        loop = self._loop_targets[-1] if self._loop_targets else set()
        for a in node.args:
            v = a.value
            if isinstance(v, (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString)):
                continue
            if isinstance(v, (cst.Integer, cst.Float)) or (
                isinstance(v, cst.Name) and v.value in loop
            ):
                continue
            func = v.func if isinstance(v, cst.Call) else None
            if isinstance(func, cst.Attribute) and func.attr.value in _SYNC_METHODS:
                continue  # print(x.item()): reported once, as .item()
            return True
        return False

    def _head_call(self, node: cst.Call, q: str) -> None:
        keywords = {a.keyword.value: a.value for a in node.args if a.keyword is not None}
        positional = [a.value for a in node.args if a.keyword is None and not a.star]
        pairs = list(_HEAD_KEYWORDS)
        if q in _HEAD_POSITIONAL:
            width, heads = _HEAD_POSITIONAL[q]
            keywords = {**dict(zip((width, heads), positional)), **keywords}
            pairs = [(width, heads)]
        if "head_dim" in keywords:
            self._head(node, self._eval(keywords["head_dim"]), "head_dim=")
            return
        for width, heads in pairs:
            if width in keywords and heads in keywords:
                w, h = self._eval(keywords[width]), self._eval(keywords[heads])
                if w is not None and h:
                    self._head(node, w // h, f"{width} {w} / {heads} {h}")
                return

    def visit_Subscript(self, node: cst.Subscript) -> None:
        if not self._loop_names:
            return
        varying = self._loop_names[-1]
        for element in node.slice:
            s = element.slice
            if not isinstance(s, cst.Slice):
                continue
            lower = _names(s.lower) & varying if s.lower is not None else set()
            upper = _names(s.upper) & varying if s.upper is not None else set()
            if not (lower or upper):
                continue
            same_length = (
                s.lower is not None
                and isinstance(s.upper, cst.BinaryOperation)
                and isinstance(s.upper.operator, cst.Add)
                and _code(s.upper.left) == _code(s.lower)
                and not (_names(s.upper.right) & varying)
            )
            if not same_length:
                self._add(node, "dynamic-shape", f"{_code(node)}: a slice sized per step")
                return

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if qualified_name(self, node) in ("torch.float64", "torch.double"):
            self._add(node, "float64", _code(node))


def lint_module(module: cst.Module, path: str) -> list[Finding]:
    """The hardware lints of ``module`` (a parsed file), in source order."""
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    linter = _Linter(path)
    wrapper.visit(linter)
    return sorted(linter.findings.values(), key=lambda f: (f.line, f.column))
