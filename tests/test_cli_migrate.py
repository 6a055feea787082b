"""``torch-pjrt migrate``: static analysis and rewrite of CUDA-style code.

The corpus in ``tests/cuda_corpus`` (12 runnable CUDA-style training and inference
scripts, and ``cuda_only_libs.py``, analyzed only) is checked three ways:

- the findings of each file, exactly (line, kind, what, risk);
- ``migrate --apply`` on a copy: every file still compiles, a second run changes nothing;
- each runnable script's final ``LOSS`` three times, in subprocesses: the original under
  ``torch-pjrt run --cuda-compat`` (pjrt), the migrated copy under plain ``python``
  (PyTorch's device-backend autoload imports torch_pjrt, so pjrt is the accelerator), and
  the migrated copy with ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` as the CPU reference: with
  no accelerator, the migrated code's ``_DEVICE`` is the CPU. Both pjrt runs must agree
  with the CPU within 1e-4 (``DEVICE`` lines say where each ran).

Script runs cost 15 to 30 s per script on two busy cores: two of them run in
``make test``, the rest are marked slow.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from torch_pjrt import cli
from torch_pjrt.migrate import MigrateError, analyze_source, migrate

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "cuda_corpus"
ANALYZED_ONLY = {"cuda_only_libs.py"}  # its libraries are not installed: never run

# Every finding of every corpus file: (line, kind, what, risk).
EXPECTED = {
    "amp_gradscaler.py": [
        (7, "cuda-api", "torch.cuda.is_available", "low"),
        (8, "device-string", '"cuda" device string', "low"),
        (15, "amp", "torch.cuda.amp.GradScaler(...)", "low"),
        (19, "amp", "torch.cuda.amp.autocast(...)", "low"),
    ],
    "autocast_inference.py": [
        (7, "cuda-api", "torch.cuda.is_available", "low"),
        (8, "device-string", '"cuda" device string', "low"),
        (9, "cudnn-flag", "torch.backends.cudnn.enabled", "low"),
        (15, "device-string", 'torch.amp.GradScaler("cuda")', "low"),
        (24, "device-string", 'torch.autocast("cuda")', "low"),
    ],
    "cuda_only_libs.py": [
        (5, "cuda-library", "import apex", "high"),
        (6, "cuda-library", "import bitsandbytes", "high"),
        (8, "cuda-library", "import triton", "high"),
        (9, "cuda-library", "import triton.language", "high"),
        (10, "cuda-library", "import flash_attn", "high"),
        (11, "cuda-library", "import xformers.ops", "high"),
        (15, "triton-kernel", "@triton.jit kernel add_kernel", "high"),
        (23, "data-parallel", "torch.nn.DataParallel", "high"),
        (23, "cuda-method", ".cuda()", "low"),
        (23, "device-ids", "device_ids=", "medium"),
        (26, "device-string", '"cuda" device string', "low"),
        (28, "cuda-api", "torch.cuda.CUDAGraph", "high"),
        (29, "cuda-api", "torch.cuda.nvtx.range_push", "high"),
        (30, "cuda-api", "torch.cuda.Event", "medium"),
    ],
    "cudnn_conv.py": [
        (6, "cudnn-flag", "torch.backends.cudnn.benchmark", "low"),
        (7, "cudnn-flag", "torch.backends.cudnn.deterministic", "medium"),
        (8, "cuda-backend-flag", "torch.backends.cuda.matmul.allow_tf32 = False", "low"),
        (9, "device-string", '"cuda:0" device string', "low"),
        (13, "device-string", '.to("cuda:0")', "low"),
    ],
    "ddp_nccl.py": [
        (12, "nccl-env", "NCCL_DEBUG", "low"),
        (14, "nccl-backend", 'torch.distributed.init_process_group("nccl")', "low"),
        (15, "cuda-api", "torch.cuda.set_device", "low"),
        (19, "cuda-method", ".cuda(local_rank)", "low"),
        (20, "cuda-method", ".cuda(local_rank)", "low"),
        (21, "cuda-api", "torch.cuda.is_available", "low"),
        (22, "cuda-method", ".cuda(local_rank)", "low"),
        (22, "device-ids", "device_ids=", "medium"),
    ],
    "grad_accum.py": [
        (6, "device-string", '"cuda" device string', "low"),
        (6, "cuda-api", "torch.cuda.is_available", "low"),
        (14, "cuda-api", "torch.cuda.is_available", "low"),
        (15, "cuda-api", "torch.cuda.reset_peak_memory_stats", "medium"),
        (25, "cuda-api", "torch.cuda.is_available", "low"),
        (26, "cuda-api", "torch.cuda.max_memory_allocated", "medium"),
        (27, "cuda-api", "torch.cuda.empty_cache", "medium"),
    ],
    "hf_bert_classify.py": [
        (6, "device-string", '"cuda" device string', "low"),
        (6, "cuda-api", "torch.cuda.is_available", "low"),
        (8, "cuda-api", "torch.cuda.is_available", "low"),
        (9, "cuda-api", "torch.cuda.manual_seed", "medium"),
        (10, "head-dim", "attention head size 32 (hidden_size 64 / num_attention_heads 2)", "low"),
    ],
    "hf_gpt2_lm.py": [
        (8, "cuda-api", "torch.cuda.manual_seed", "medium"),
        (9, "head-dim", "attention head size 12 (n_embd 48 / n_head 4)", "low"),
        (13, "device-string", '.to("cuda:0")', "low"),
        (15, "device-string", '.to("cuda:0")', "low"),
    ],
    "mha_transformer.py": [
        (9, "head-dim", "attention head size 32 (HEAD_DIM = D_MODEL // N_HEADS)", "low"),
        (15, "head-dim", "attention head size 32 (embed_dim 96 / num_heads 3)", "low"),
        (16, "head-dim", "attention head size 32 (d_model 96 / nhead 3)", "low"),
        (27, "cuda-method", ".cuda()", "low"),
        (28, "cuda-method", ".cuda()", "low"),
        (29, "cuda-method", ".cuda()", "low"),
        (36, "host-sync", "print(...) of a value in a training loop", "medium"),
        (37, "host-sync", ".item() in a training loop", "medium"),
        (38, "cuda-api", "torch.cuda.synchronize", "low"),
    ],
    "mlp_hardcoded.py": [
        (9, "device-string", 'torch.device("cuda")', "low"),
        (10, "cudnn-flag", "torch.backends.cudnn.benchmark", "low"),
        (12, "cuda-api", "torch.cuda.manual_seed_all", "medium"),
        (15, "cuda-method", ".cuda()", "low"),
        (17, "cuda-method", ".cuda()", "low"),
        (20, "cuda-api", "torch.cuda.synchronize", "low"),
        (27, "cuda-api", "torch.cuda.synchronize", "low"),
    ],
    "pinned_loader.py": [
        (10, "pin-memory", "pin_memory=", "low"),
        (11, "cuda-method", ".cuda()", "low"),
        (15, "cuda-method", ".cuda()", "low"),
        (16, "cuda-method", ".cuda()", "low"),
        (21, "host-sync", ".item() in a training loop", "medium"),
    ],
    "set_device_rank.py": [
        (9, "cuda-api", "torch.cuda.device_count", "low"),
        (10, "cuda-api", "torch.cuda.set_device", "low"),
        (11, "device-string", 'f"cuda:{local_rank}"', "low"),
        (12, "cuda-api", "torch.cuda.current_device", "low"),
        (25, "device-string", '"cuda" device string', "low"),
        (26, "cuda-api", "torch.cuda.synchronize", "low"),
    ],
    "varlen_loops.py": [
        (9, "cuda-method", ".cuda()", "low"),
        (10, "cuda-method", ".cuda()", "low"),
        (11, "cuda-method", ".cuda()", "low"),
        (12, "cuda-method", ".cuda()", "low"),
        (17, "dynamic-shape", "seq[:, : step + 4]: a slice sized per step", "medium"),
        (23, "tensor-loop", "range(seq.shape[0]) indexing seq[...]", "medium"),
        (25, "float64", ".double()", "medium"),
    ],
}


def _env(**overrides: str) -> dict:
    env = os.environ.copy()
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("PJRT_DEVICE", None)
    env.pop("TORCH_PJRT_PLATFORM", None)
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    env["PYTHONWARNINGS"] = "ignore"
    env["HF_HUB_OFFLINE"] = "1"
    env.update(overrides)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _run(*args: str, **env: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=_env(**env), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def _value(out: str, key: str) -> str:
    m = re.search(rf"^{re.escape(key)} (.*)$", out, re.M)
    assert m, f"no '{key}' line in:\n{out}"
    return m.group(1)


def _copy_corpus(tmp_path: Path) -> Path:
    dest = tmp_path / "corpus"
    shutil.copytree(CORPUS, dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


# -- findings ---------------------------------------------------------------------------


def test_corpus_is_complete():
    files = sorted(p.name for p in CORPUS.glob("*.py"))
    assert files == sorted(EXPECTED)
    assert len(set(files) - ANALYZED_ONLY) >= 12


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corpus_findings(name):
    findings, _ = analyze_source((CORPUS / name).read_bytes(), name)
    assert [(f.line, f.kind, f.what, f.risk) for f in findings] == EXPECTED[name]
    for f in findings:
        assert f.proposal, f
        # lints and the constructs that need a hand-made change are never rewritten
        if f.category == "lint" or f.risk == "high":
            assert not f.rewritten, f


def test_apply_corpus_compiles_and_is_idempotent(tmp_path, capsys):
    corpus = _copy_corpus(tmp_path)
    assert cli.main(["migrate", str(corpus), "--apply"]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith(f"{len(EXPECTED)} file(s) rewritten")
    before = {}
    for path in sorted(corpus.glob("*.py")):
        text = path.read_text()
        compile(text, str(path), "exec")
        before[path.name] = text
        assert "torch.accelerator.current_accelerator()" in text
        remaining = analyze_source(text, path.name)[0]
        # after the rewrite only what --apply leaves alone is left to report
        assert all(not f.rewritten for f in remaining), [f for f in remaining if f.rewritten]
        if path.name not in ANALYZED_ONLY:  # (`from torch.cuda.amp import ...` is left)
            tree = ast.parse(text)
            refs = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Attribute)]
            assert not [r for r in refs if r.startswith("torch.cuda")], path.name
    report = migrate(str(corpus), apply=True)
    assert report.as_dict()["files_changed"] == 0
    assert {p.name: p.read_text() for p in corpus.glob("*.py")} == before


# -- rewrites of small cases ------------------------------------------------------------

_DEVICE_DEF = (
    "# torch-pjrt migrate: the current accelerator (CUDA, pjrt, XPU, ...), else the CPU\n"
    '_DEVICE = torch.accelerator.current_accelerator() or torch.device("cpu")\n'
)
_CUDNN = "# torch-pjrt migrate: cuDNN only; other accelerators ignore it (XLA picks its algorithms)"

REWRITES = {
    "alias": (
        "import torch as th\n\nth.cuda.synchronize()  # wait\n",
        "import torch as th\nimport torch\n\n" + _DEVICE_DEF
        + "\ntorch.get_device_module(_DEVICE).synchronize()  # wait\n",
    ),
    "amp-imports": (
        '"""Doc."""\nimport torch\nfrom torch.cuda.amp import GradScaler, autocast\n\n'
        "scaler = GradScaler()\nwith autocast(dtype=torch.bfloat16):  # kept\n    pass\n",
        '"""Doc."""\nimport torch\nfrom torch.cuda.amp import GradScaler, autocast\n\n'
        + _DEVICE_DEF + "\nscaler = torch.amp.GradScaler(_DEVICE.type)\n"
        "with torch.autocast(_DEVICE.type, dtype=torch.bfloat16):  # kept\n    pass\n",
    ),
    "nccl": (
        "import torch.distributed as dist\n\n"
        'dist.init_process_group("nccl", rank=0, world_size=1)\n'
        'dist.init_process_group(backend="nccl")\ng = dist.new_group([0], backend="nccl")\n',
        "import torch.distributed as dist\n\n"
        "dist.init_process_group(rank=0, world_size=1)\n"
        "dist.init_process_group()\ng = dist.new_group([0])\n",
    ),
    "nccl-variable": (
        'import torch\n\nbackend = "nccl" if torch.cuda.is_available() else "gloo"\n',
        "import torch\n\n" + _DEVICE_DEF + "\nbackend = "
        "torch.distributed.get_default_backend_for_device(_DEVICE) if "
        'torch.accelerator.is_available() else "gloo"\n',
    ),
    "flags": (
        "import torch\n\ntorch.backends.cudnn.benchmark = True  # fast\n"
        "torch.backends.cuda.matmul.allow_tf32 = True\n"
        "if x:\n    torch.backends.cudnn.deterministic = True\n",
        f"import torch\n\n{_CUDNN}\ntorch.backends.cudnn.benchmark = True  # fast\n"
        'torch.set_float32_matmul_precision("high")\n'
        f"if x:\n    {_CUDNN}\n    torch.backends.cudnn.deterministic = True\n",
    ),
    "no-torch-import": (
        'def to_gpu(model, rank):\n    return model.cuda(rank), f"cuda:{rank}"\n',
        "import torch\n\n" + _DEVICE_DEF + "\ndef to_gpu(model, rank):\n"
        '    return model.to(torch.device(_DEVICE.type, rank)), f"{_DEVICE.type}:{rank}"\n',
    ),
    "strings": (
        'import torch\n\nx = torch.ones(2, device="cuda:1")\n'
        'if x.device.type == "cuda":\n    x = x.to("cuda", non_blocking=True)\n',
        "import torch\n\n" + _DEVICE_DEF + '\nx = torch.ones(2, device=f"{_DEVICE.type}:1")\n'
        "if x.device.type == _DEVICE.type:\n    x = x.to(_DEVICE.type, non_blocking=True)\n",
    ),
    "from-imports": (
        "from torch import cuda\nfrom torch.cuda import amp\n\n"
        "cuda.synchronize()\ns = amp.GradScaler()\n",
        "from torch import cuda\nfrom torch.cuda import amp\nimport torch\n\n" + _DEVICE_DEF
        + "\ntorch.get_device_module(_DEVICE).synchronize()\n"
        "s = torch.amp.GradScaler(_DEVICE.type)\n",
    ),
    "nothing-to-do": (
        "import torch\n\nx = torch.ones(2)  # cpu\n",
        "import torch\n\nx = torch.ones(2)  # cpu\n",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(REWRITES))
def test_rewrite(case):
    source, expected = REWRITES[case]
    _, new = analyze_source(source)
    assert new == expected
    assert analyze_source(new)[1] == new  # idempotent
    compile(new, case, "exec")


def test_report_only_constructs_are_not_rewritten():
    source = (
        "import torch\nimport apex\n\ne = torch.cuda.Event(enable_timing=True)\n"
        "torch.cuda.nvtx.range_push('x')\nok = t.is_cuda\n"
    )
    findings, new = analyze_source(source)
    assert new == source
    assert [(f.line, f.kind, f.risk, f.rewritten) for f in findings] == [
        (2, "cuda-library", "high", False),
        (4, "cuda-api", "medium", False),
        (5, "cuda-api", "high", False),
        (6, "is-cuda", "medium", False),
    ]


def test_lints():
    source = """import random
import torch
from torch import nn

N_EMBD, N_HEAD = 256, 4
d_head = 256 // 2
mha = nn.MultiheadAttention(512, 4)
cfg = dict(hidden_size=N_EMBD, num_attention_heads=8)
x = torch.randn(10, 4)
for row in x:
    pass
for i in range(len(x)):
    y = x[i] + 1
opt = torch.optim.SGD([x], lr=0.1)
for step in range(10):
    n = random.randint(1, 5)
    b = torch.zeros(n, 4, dtype=torch.float64)
    window = x[step : step + 2]
    prefix = x[:step]
    loss = b.sum()
    loss.backward()
    opt.step()
    print(step, loss)
    if step % 10 == 0:
        print(loss.item())
"""
    findings, _ = analyze_source(source)
    assert [(f.line, f.kind, f.what) for f in findings] == [
        (8, "head-dim", "attention head size 32 (hidden_size 256 / num_attention_heads 8)"),
        (10, "tensor-loop", "for ... in x (a tensor)"),
        (12, "tensor-loop", "range(len(x)) indexing x[...]"),
        (17, "dynamic-shape", "torch.zeros(...) sized by a per-step value"),
        (17, "float64", "torch.float64"),
        (19, "dynamic-shape", "x[:step]: a slice sized per step"),
        (23, "host-sync", "print(...) of a value in a training loop"),
    ]
    assert all(f.category == "lint" and "Fix:" in f.proposal for f in findings)


# -- the command: report formats, exit status -------------------------------------------


def test_text_and_json_and_markdown_reports(tmp_path, capsys):
    script = tmp_path / "a.py"
    script.write_text("import torch\nimport flash_attn\n\ntorch.cuda.synchronize()\n")
    report = tmp_path / "report.json"
    assert cli.main(["migrate", str(script), "--report", str(report)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == f"{script}:2:1  high    cuda-library      import flash_attn"
    assert out[2].startswith("    manual: torch.nn.functional.scaled_dot_product_attention")
    assert out[3] == f"{script}:4:1  low     cuda-api          torch.cuda.synchronize"
    assert out[4].startswith("    rewrite: torch.get_device_module(_DEVICE).synchronize")
    assert out[-1] == (
        "1 file(s), 2 finding(s) (2 CUDA, 0 lint; 1 high, 0 medium, 1 low risk); "
        "1 file(s) to rewrite (run with --apply)"
    )
    data = json.loads(report.read_text())
    assert data["totals"] == {"low": 1, "medium": 0, "high": 1}
    assert (data["files_scanned"], data["files_to_change"], data["errors"]) == (1, 1, [])
    assert [(f["line"], f["kind"], f["rewritten"]) for f in data["findings"]] == [
        (2, "cuda-library", False),
        (4, "cuda-api", True),
    ]
    assert "torch.cuda" in script.read_text()  # no --apply: nothing written
    md = tmp_path / "report.md"
    assert cli.main(["migrate", str(script), "--apply", "--report", str(md)]) == 0
    text = md.read_text()
    assert "| where | risk | kind | what | change |" in text
    assert f"| {script}:4 | low | cuda-api | `torch.cuda.synchronize` | rewritten: " in text
    assert "torch.cuda" not in script.read_text()


def test_libcst_is_imported_only_by_migrate():
    code = "import sys, torch_pjrt.cli; print('libcst' in sys.modules)"
    assert _run("-c", code).stdout.strip() == "False"


# -- bad input --------------------------------------------------------------------------


def test_missing_path(tmp_path, capsys):
    assert cli.main(["migrate", str(tmp_path / "nope")]) == 2
    assert f"no such file or folder: {tmp_path / 'nope'}" in capsys.readouterr().err
    assert cli.main(["migrate"]) == 2  # usage error


def test_syntax_error_is_reported_and_not_rewritten(tmp_path, capsys):
    good = tmp_path / "good.py"
    bad = tmp_path / "bad.py"
    good.write_text("import torch\ntorch.cuda.synchronize()\n")
    bad_text = "import torch\ntorch.cuda.synchronize(\nx = 'cuda'\n"
    bad.write_text(bad_text)
    assert cli.main(["migrate", str(tmp_path), "--apply"]) == 1
    captured = capsys.readouterr()
    assert f"{bad}: not valid Python (line 2)" in captured.err
    assert "not analyzed, not rewritten" in captured.err
    assert bad.read_text() == bad_text
    assert "torch.cuda" not in good.read_text()  # the other files are still migrated
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.py", "good.py"]


def test_binary_file(tmp_path, capsys):
    blob = tmp_path / "blob.py"
    blob.write_bytes(b"\x7fELF\x00\x01\x02cuda")
    assert cli.main(["migrate", str(tmp_path), "--apply"]) == 1
    assert f"{blob}: a binary file (it contains NUL bytes)" in capsys.readouterr().err
    assert blob.read_bytes() == b"\x7fELF\x00\x01\x02cuda"


def test_symlink_loops(tmp_path, capsys):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("import torch\nx = torch.cuda.is_available()\n")
    (tmp_path / "pkg" / "back").symlink_to(tmp_path)  # a folder loop: skipped, noted
    assert cli.main(["migrate", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"note: skipped {tmp_path / 'pkg' / 'back'}: a symbolic link back to" in out
    assert out.count("torch.cuda.is_available") == 1
    (tmp_path / "self.py").symlink_to(tmp_path / "self.py")  # a file loop: an error
    assert cli.main(["migrate", str(tmp_path)]) == 1
    assert f"{tmp_path / 'self.py'}: a symbolic link loop" in capsys.readouterr().err
    assert cli.main(["migrate", str(tmp_path / "self.py")]) == 2
    assert "a symbolic link that leads nowhere" in capsys.readouterr().err


def test_symlinked_file_is_rewritten_through_the_link(tmp_path):
    real = tmp_path / "real.py"
    real.write_text("import torch\nx = torch.cuda.is_available()\n")
    (tmp_path / "sub").mkdir()
    link = tmp_path / "sub" / "link.py"
    link.symlink_to(real)
    report = migrate(str(tmp_path / "sub"), apply=True)
    assert report.as_dict()["files_changed"] == 1
    assert link.is_symlink()
    assert "torch.accelerator.is_available()" in real.read_text()


def test_read_only_file_is_not_rewritten(tmp_path, capsys):
    path = tmp_path / "ro.py"
    text = "import torch\ntorch.cuda.synchronize()\n"
    path.write_text(text)
    path.chmod(0o444)
    try:
        assert cli.main(["migrate", str(path), "--apply"]) == 1
        assert f"{path}: read-only; not rewritten" in capsys.readouterr().err
        assert path.read_text() == text
        assert stat.S_IMODE(path.stat().st_mode) == 0o444
        assert cli.main(["migrate", str(path)]) == 0  # the analysis alone is fine
    finally:
        path.chmod(0o644)
    assert os.listdir(tmp_path) == ["ro.py"]


def test_failed_write_leaves_the_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "a.py"
    text = "import torch\ntorch.cuda.synchronize()\n"
    path.write_text(text)
    path.chmod(0o640)

    def fail(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    report = migrate(str(path), apply=True)
    assert "not rewritten, the file is unchanged" in report.errors[0].error
    assert path.read_text() == text
    assert os.listdir(tmp_path) == ["a.py"]  # the temporary file is gone
    monkeypatch.undo()
    assert migrate(str(path), apply=True).as_dict()["files_changed"] == 1
    assert stat.S_IMODE(path.stat().st_mode) == 0o640  # permissions kept


def test_rewrite_that_would_not_compile_is_not_written(tmp_path, monkeypatch):
    import torch_pjrt.migrate as m

    path = tmp_path / "a.py"
    path.write_text("import torch\ntorch.cuda.synchronize()\n")
    monkeypatch.setattr(m, "analyze_source", lambda data, p: ([], b"def (:\n"))
    report = m.migrate(str(path), apply=True)
    assert "the rewrite does not compile" in report.errors[0].error
    assert path.read_text() == "import torch\ntorch.cuda.synchronize()\n"


def test_analyze_source_rejects_invalid_python():
    with pytest.raises(MigrateError, match=r"x.py: not valid Python \(line 1\)"):
        analyze_source("def f(:\n", "x.py")


# -- the corpus, run: original with --cuda-compat, migrated on pjrt and on the CPU ----

_FAST = {"mlp_hardcoded.py", "ddp_nccl.py"}
_RUNNABLE = [
    pytest.param(n, marks=() if n in _FAST else pytest.mark.slow)
    for n in sorted(set(EXPECTED) - ANALYZED_ONLY)
]


@pytest.mark.parametrize("name", _RUNNABLE)
def test_corpus_runs_migrated_and_matches_cpu(name, tmp_path):
    with socket.socket() as s:  # for ddp_nccl.py: a free port per run
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    compat = _run("-m", "torch_pjrt.cli", "run", "--cuda-compat", str(CORPUS / name),
                  MASTER_PORT=port)  # fmt: skip
    migrated = tmp_path / name
    shutil.copy(CORPUS / name, migrated)
    assert migrate(str(migrated), apply=True).as_dict()["files_changed"] == 1
    on_pjrt = _run(str(migrated), MASTER_PORT=port)
    on_cpu = _run(str(migrated), MASTER_PORT=port, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert _value(compat.stdout, "DEVICE") == "pjrt:0"
    assert _value(on_pjrt.stdout, "DEVICE") == "pjrt:0"
    assert _value(on_cpu.stdout, "DEVICE") == "cpu"
    want = float(_value(on_cpu.stdout, "LOSS"))
    assert abs(float(_value(compat.stdout, "LOSS")) - want) <= 1e-4
    assert abs(float(_value(on_pjrt.stdout, "LOSS")) - want) <= 1e-4
