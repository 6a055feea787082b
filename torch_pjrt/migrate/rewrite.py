"""Find CUDA-only code in one module and rewrite it to device-generic code (libcst).

:func:`rewrite_module` returns the findings and the rewritten source. The rewrite keeps
the file's formatting and comments (libcst edits the concrete syntax tree), refers to a
module-level ``_DEVICE`` (``torch.accelerator.current_accelerator()``, else the CPU)
that it adds after the imports, and changes nothing on a second run.
"""

from __future__ import annotations

import re

import libcst as cst
from libcst.helpers import get_full_name_for_node
from libcst.metadata import (
    MetadataWrapper,
    ParentNodeProvider,
    PositionProvider,
    QualifiedNameProvider,
    QualifiedNameSource,
)

from torch_pjrt.migrate.findings import Finding
from torch_pjrt.migrate.rules import (
    CUDA_API,
    CUDA_API_DEFAULT,
    CUDA_LIBRARIES,
    DEVICE_COMMENT,
    DEVICE_LINE,
    DEVICE_NAME,
    MARK,
)

__all__ = ["rewrite_module", "qualified_name"]

_CUDA_STRING = re.compile(r"cuda(?::(\d*))?")
_NCCL_ENV = re.compile(r"NCCL_[A-Z0-9_]+")
_AUTOCAST = {"torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast"}
_GRAD_SCALER = {"torch.amp.GradScaler", "torch.amp.grad_scaler.GradScaler"}
_DATA_PARALLEL = {"torch.nn.DataParallel", "torch.nn.parallel.DataParallel"}
_CUDNN_COMMENT = f"# {MARK} cuDNN only; other accelerators ignore it (XLA picks its algorithms)"
_DEVICE_TYPE = f"{DEVICE_NAME}.type"
_BACKEND_NOTE = (
    "init_process_group() without a backend: PyTorch picks the device's (nccl on CUDA, "
    "pjrt on pjrt, gloo on the CPU)"
)


def qualified_name(visitor, node: cst.CSTNode) -> str | None:
    """The imported name ``node`` refers to (``torch.cuda.synchronize``), or None."""
    for q in visitor.get_metadata(QualifiedNameProvider, node, set()):
        if q.source == QualifiedNameSource.IMPORT:
            return q.name
    return None


def _is_import(stmt: cst.CSTNode) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and all(
        isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body
    )


def _arg(call: cst.Call, position: int, keyword: str) -> cst.Arg | None:
    """The argument passed as ``keyword=`` or as the ``position``-th positional one."""
    positional = [a for a in call.args if a.keyword is None and not a.star]
    for a in call.args:
        if a.keyword is not None and a.keyword.value == keyword:
            return a
    return positional[position] if position is not None and len(positional) > position else None


class _CudaRewriter(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider, QualifiedNameProvider, ParentNodeProvider)

    def __init__(self, path: str):
        super().__init__()
        self.path = path
        self.findings: list[Finding] = []
        self.uses_device = False  # a rewrite refers to _DEVICE
        self.uses_torch = False  # a rewrite refers to torch
        self._labels: dict[int, str] = {}  # id(string node) -> what the finding says
        self._consumed: set[int] = set()  # nodes an enclosing rule handles
        self._drop: set[int] = set()  # arguments to remove (id of the original Arg)
        self._tf32: dict[int, bool] = {}  # statements setting allow_tf32 to a literal
        self._imports = 0

    # -- helpers --------------------------------------------------------------------

    def _add(self, node, kind, what, proposal, risk, rewritten=False):
        pos = self.get_metadata(PositionProvider, node).start
        self.findings.append(
            Finding(
                self.path, pos.line, pos.column + 1, kind, what, proposal, risk, "cuda", rewritten
            )  # fmt: skip
        )

    def _expr(self, code: str) -> cst.BaseExpression:
        self.uses_torch = self.uses_torch or "torch." in code
        self.uses_device = self.uses_device or DEVICE_NAME in code
        return cst.parse_expression(code)

    def _qname(self, node) -> str | None:
        return qualified_name(self, node)

    # -- imports: CUDA-only libraries ------------------------------------------------

    def visit_Import(self, node: cst.Import) -> None:
        self._imports += 1
        for alias in node.names:
            self._library(node, get_full_name_for_node(alias.name) or "")

    def leave_Import(self, original, updated):
        self._imports -= 1
        return updated

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        self._imports += 1
        if node.relative or node.module is None:
            return
        module = get_full_name_for_node(node.module) or ""
        names = [] if isinstance(node.names, cst.ImportStar) else node.names
        if module == "torch.utils" and any(a.name.value == "cpp_extension" for a in names):
            module = "torch.utils.cpp_extension"
        self._library(node, module)

    def leave_ImportFrom(self, original, updated):
        self._imports -= 1
        return updated

    def _library(self, node, module: str) -> None:
        for lib, proposal in CUDA_LIBRARIES.items():
            if module == lib or module.startswith(lib + "."):
                risk = "medium" if lib.startswith("torch.") else "high"
                self._add(node, "cuda-library", f"import {module}", proposal, risk)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        for d in node.decorators:
            target = d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator
            name = self._qname(target) or get_full_name_for_node(target) or ""
            if name.split(".")[0] == "triton":
                self._add(
                    node, "triton-kernel", f"@{name} kernel {node.name.value}",
                    "rewrite it as plain torch ops (XLA fuses them) or as a Pallas kernel "
                    "(torch_pjrt/kernels); Triton kernels run on CUDA only", "high",
                )  # fmt: skip
                return

    # -- calls -----------------------------------------------------------------------

    def visit_Call(self, node: cst.Call) -> None:
        q = self._qname(node.func)
        label = None
        if q in _AUTOCAST:
            arg, label = _arg(node, 0, "device_type"), q + '("{}")'
        elif q in _GRAD_SCALER:
            arg, label = _arg(node, 0, "device"), q + '("{}")'
        elif q == "torch.device":
            arg, label = _arg(node, 0, "type"), 'torch.device("{}")'
        elif isinstance(node.func, cst.Attribute) and node.func.attr.value == "to":
            arg, label = _arg(node, 0, "device"), '.to("{}")'
        elif q in ("torch.distributed.init_process_group", "torch.distributed.new_group"):
            position = 0 if q.endswith("init_process_group") else None
            arg = _arg(node, position, "backend")
            if isinstance(arg, cst.Arg) and isinstance(arg.value, cst.SimpleString):
                if arg.value.evaluated_value == "nccl":
                    self._drop.add(id(arg))
                    keyword = arg.keyword is not None
                    self._labels[id(arg.value)] = f'{q}({"backend=" if keyword else ""}"nccl")'
            arg = None
        elif q in ("torch.cuda.amp.autocast", "torch.cuda.amp.GradScaler"):
            self._consumed.add(id(node.func))
            arg = None
        else:
            arg = None
        if arg is not None and isinstance(arg.value, cst.SimpleString):
            self._labels[id(arg.value)] = label
        self._report_only(node, q)

    def _report_only(self, node: cst.Call, q: str | None) -> None:
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value == "pin_memory":
            self._add(node, "pin-memory", ".pin_memory()", _PIN_NOTE, "low")
        for a in node.args:
            key = a.keyword.value if a.keyword is not None else None
            if key == "pin_memory":
                self._add(a, "pin-memory", "pin_memory=", _PIN_NOTE, "low")
            elif key in ("device_ids", "output_device"):
                self._add(
                    a, "device-ids", f"{key}=",
                    "CUDA device indices: for DistributedDataParallel on other devices "
                    "pass none (the module's device is used): `device_ids=None`", "medium",
                )  # fmt: skip
        if q in _DATA_PARALLEL:
            self._add(
                node, "data-parallel", "torch.nn.DataParallel",
                "DataParallel runs on CUDA only: use DistributedDataParallel (one process "
                "per device) or torch_pjrt's SPMD sharding", "high",
            )  # fmt: skip

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        q = self._qname(original.func)
        if q in ("torch.cuda.amp.autocast", "torch.cuda.amp.GradScaler"):
            new = "torch.autocast" if q.endswith("autocast") else "torch.amp.GradScaler"
            args = [cst.Arg(self._expr(_DEVICE_TYPE)), *updated.args]
            self._add(
                original, "amp", f"{q}(...)",
                f"{new}({_DEVICE_TYPE}, ...) ({q} is deprecated)", "low", True,
            )  # fmt: skip
            return updated.with_changes(func=self._expr(new), args=args)
        if q in _GRAD_SCALER and _arg(original, 0, "device") is None:
            self._add(
                original, "amp", f'{q}() (its device defaults to "cuda")',
                f"{q}({_DEVICE_TYPE}, ...)", "low", True,
            )  # fmt: skip
            return updated.with_changes(args=[cst.Arg(self._expr(_DEVICE_TYPE)), *updated.args])
        if any(id(a) in self._drop for a in original.args):
            kept = [u for o, u in zip(original.args, updated.args) if id(o) not in self._drop]
            if kept and original.args[-1].comma == cst.MaybeSentinel.DEFAULT:
                kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            return updated.with_changes(args=kept)
        func = original.func
        if isinstance(func, cst.Attribute) and func.attr.value == "cuda" and q != "torch.cuda":
            return self._dot_cuda(original, updated)
        return updated

    def _dot_cuda(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        index = _arg(original, 0, "device")
        rest = [u for o, u in zip(original.args, updated.args) if o is not index]
        if index is None:
            device = self._expr(DEVICE_NAME)
            what, becomes = ".cuda()", f".to({DEVICE_NAME})"
        else:
            idx = cst.Module([]).code_for_node(index.value)
            device = self._expr(f"torch.device({_DEVICE_TYPE}, {idx})")
            what, becomes = f".cuda({idx})", f".to(torch.device({_DEVICE_TYPE}, {idx}))"
        self._add(original, "cuda-method", what, becomes, "low", True)
        func = updated.func.with_changes(attr=cst.Name("to"))
        return updated.with_changes(func=func, args=[cst.Arg(device), *rest])

    # -- torch.cuda.*, torch.backends.* ----------------------------------------------

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute):
        if self._imports or id(original) in self._consumed:
            return updated
        if self._inner(original):
            return updated
        q = self._qname(original)
        if q is None:
            if original.attr.value == "is_cuda":
                self._add(
                    original, "is-cuda", ".is_cuda",
                    f'`x.device.type == {_DEVICE_TYPE}` (is_cuda is False on other '
                    "devices)", "medium",
                )  # fmt: skip
            return updated
        return self._torch_name(original, updated, q)

    def leave_Name(self, original: cst.Name, updated: cst.Name):
        if self._imports or id(original) in self._consumed or self._inner(original):
            return updated
        q = self._qname(original)
        return updated if q is None else self._torch_name(original, updated, q)

    def _inner(self, node) -> bool:
        """``node`` is the ``value`` of an attribute: the enclosing name is the one to match."""
        parent = self.get_metadata(ParentNodeProvider, node)
        return isinstance(parent, cst.Attribute) and parent.value is node

    def _torch_name(self, original, updated, q: str):
        if q.startswith("torch.cuda."):
            return self._torch_cuda(original, updated, q[len("torch.cuda.") :])
        if q.startswith("torch.backends.cudnn."):
            self._add(
                original, "cudnn-flag", q,
                "kept, with a comment: a cuDNN setting, ignored elsewhere (for "
                "determinism everywhere: torch.use_deterministic_algorithms(True))",
                "low" if not q.endswith("deterministic") else "medium",
            )  # fmt: skip
        elif q.startswith("torch.backends.cuda."):
            self._add(
                original, "cuda-backend-flag", q,
                'torch.set_float32_matmul_precision("high") for TF32 matmuls; '
                "torch.nn.attention.sdpa_kernel(...) for the attention kernel choice",
                "medium",
            )  # fmt: skip
        return updated

    def _torch_cuda(self, original, updated, rest: str):
        api = CUDA_API.get(rest) or CUDA_API.get(rest.removeprefix("memory.")) or CUDA_API_DEFAULT
        what = f"torch.cuda.{rest}"
        if api.becomes is None or "..." in api.becomes:
            self._add(original, "cuda-api", what, api.note, api.risk)
            return updated
        code = api.becomes.format(D=DEVICE_NAME)
        note = f" ({api.note})" if api.note else ""
        self._add(original, "cuda-api", what, code + note, api.risk, True)
        return self._expr(code)

    # -- statements: cudnn and TF32 flags --------------------------------------------

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        stmt = node.body[0] if len(node.body) == 1 else None
        if not (isinstance(stmt, cst.Assign) and len(stmt.targets) == 1):
            return
        target = stmt.targets[0].target
        value = stmt.value
        if (
            self._qname(target) == "torch.backends.cuda.matmul.allow_tf32"
            and isinstance(value, cst.Name)
            and value.value in ("True", "False")
        ):
            self._consumed.add(id(target))
            self._tf32[id(node)] = value.value == "True"

    def leave_SimpleStatementLine(self, original, updated):
        if id(original) in self._tf32:
            precision = "high" if self._tf32[id(original)] else "highest"
            code = f'torch.set_float32_matmul_precision("{precision}")'
            self._add(
                original, "cuda-backend-flag",
                f"torch.backends.cuda.matmul.allow_tf32 = {self._tf32[id(original)]}",
                code + " (TF32 on CUDA; the matmul precision on every device)", "low", True,
            )  # fmt: skip
            self.uses_torch = True
            return updated.with_changes(body=[cst.Expr(cst.parse_expression(code))])
        targets = [t.target for s in original.body if isinstance(s, cst.Assign) for t in s.targets]
        cudnn = any((self._qname(t) or "").startswith("torch.backends.cudnn.") for t in targets)
        if not cudnn or any(
            line.comment is not None and MARK in line.comment.value
            for line in updated.leading_lines
        ):
            return updated
        note = cst.EmptyLine(comment=cst.Comment(_CUDNN_COMMENT))
        return updated.with_changes(leading_lines=[*updated.leading_lines, note])

    # -- strings: device names, backends, NCCL variables -----------------------------

    def leave_SimpleString(self, original: cst.SimpleString, updated: cst.SimpleString):
        if self._imports:
            return updated
        value = original.evaluated_value
        if not isinstance(value, str):
            return updated
        m = _CUDA_STRING.fullmatch(value)
        if m is not None:
            what = self._labels.get(id(original), '"{}" device string').format(value)
            if m.group(1) is None and ":" not in value:
                code = _DEVICE_TYPE
            else:
                q = original.quote
                code = f"f{q}{{{_DEVICE_TYPE}}}:{m.group(1)}{q}"
            self._add(
                original, "device-string", what,
                f"{code} (the current accelerator, else the CPU)", "low", True,
            )  # fmt: skip
            return self._expr(code)
        if value == "nccl":
            what = self._labels.get(id(original), '"nccl" backend')
            if what != '"nccl" backend':
                self._add(original, "nccl-backend", what, _BACKEND_NOTE, "low", True)
                return updated  # the argument goes (leave_Call)
            code = f"torch.distributed.get_default_backend_for_device({DEVICE_NAME})"
            self._add(original, "nccl-backend", what, f"{code} (the device's backend)", "low",
                      True)  # fmt: skip
            return self._expr(code)
        if _NCCL_ENV.fullmatch(value):
            self._add(
                original, "nccl-env", value,
                "NCCL_* variables configure NCCL only; the pjrt backend ignores them "
                "(XLA's collectives take XLA_FLAGS): keep for CUDA runs, or remove",
                "low",
            )  # fmt: skip
        return updated

    def leave_FormattedString(self, original, updated):
        parts = updated.parts
        first = parts[0] if parts else None
        if self._imports or not isinstance(first, cst.FormattedStringText):
            return updated
        if not (first.value == "cuda" or first.value.startswith("cuda:")):
            return updated
        rest = first.value[len("cuda") :]
        head = [cst.FormattedStringExpression(self._expr(_DEVICE_TYPE))]
        if rest:
            head.append(cst.FormattedStringText(rest))
        code = cst.Module([]).code_for_node(original)
        self._add(
            original, "device-string", code,
            f"f\"{{{_DEVICE_TYPE}}}{rest}...\" (the current accelerator, else the CPU)",
            "low", True,
        )  # fmt: skip
        return updated.with_changes(parts=[*head, *parts[1:]])


_PIN_NOTE = (
    "kept: harmless (DataLoader pins for the current accelerator), but host-to-device "
    "copies to an XLA device do not use pinned memory; pin_memory=False saves host memory"
)


def _binds_torch(stmt) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and any(
        isinstance(s, cst.Import)
        and any(
            a.asname is None and (get_full_name_for_node(a.name) or "").split(".")[0] == "torch"
            for a in s.names
        )
        for s in stmt.body
    )


def _defines_device(stmt) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and any(
        isinstance(s, cst.Assign)
        and any(isinstance(t.target, cst.Name) and t.target.value == DEVICE_NAME for t in s.targets)
        for s in stmt.body
    )


def _add_device(module: cst.Module, uses_torch: bool, uses_device: bool) -> cst.Module:
    """Add ``import torch`` and the ``_DEVICE`` definition where the rewrites need them."""
    body = list(module.body)
    if uses_device and any(_defines_device(s) for s in body):
        uses_device = False
    has_torch = any(_binds_torch(s) for s in body)
    if not uses_device and (has_torch or not uses_torch):
        return module
    # after the leading docstring and imports, and after `import torch` wherever it is
    pos = 0
    for i, stmt in enumerate(body):
        docstring = (
            i == 0
            and isinstance(stmt, cst.SimpleStatementLine)
            and isinstance(stmt.body[0], cst.Expr)
            and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
        )
        if not (docstring or _is_import(stmt)):
            break
        pos = i + 1
    torch_at = [i for i, s in enumerate(body) if _binds_torch(s)]
    if torch_at:
        pos = max(pos, torch_at[0] + 1)
        while pos < len(body) and _is_import(body[pos]):
            pos += 1
    new = []
    if not has_torch:
        new.append(cst.parse_statement("import torch\n"))
    if uses_device:
        line = cst.parse_statement(DEVICE_LINE + "\n")
        comment = cst.EmptyLine(comment=cst.Comment(DEVICE_COMMENT))
        new.append(line.with_changes(leading_lines=[cst.EmptyLine(), comment]))
    rest = body[pos:]
    if uses_device and rest and not rest[0].leading_lines:
        rest[0] = rest[0].with_changes(leading_lines=[cst.EmptyLine()])
    return module.with_changes(body=[*body[:pos], *new, *rest])


def rewrite_module(module: cst.Module, path: str) -> tuple[list[Finding], cst.Module]:
    """The CUDA findings in ``module`` and its device-generic rewrite."""
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    rewriter = _CudaRewriter(path)
    new = wrapper.visit(rewriter)
    new = _add_device(new, rewriter.uses_torch, rewriter.uses_device)
    return rewriter.findings, new
