"""examples/llama_distributed/train.py under torchrun: training, checkpoint and resume.

Each test launches the example with 4 processes on the CPU platform (one CPU device per
process, as in tests/test_distributed.py) and reads rank 0's ``step S/N loss L`` lines.
The key property: a run resumed from a distributed checkpoint continues with the same
losses as a run that was never interrupted. They are compared exactly, as printed with 9
significant digits, which round-trip a float32: the resumed run loads the same parameter
and optimizer bits, reads the same batches (they depend only on the seed and the step)
and runs the same programs in the same order, so nothing may differ.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.test_distributed import _launch

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "llama_distributed" / "train.py"
# small and quick: most of a run's time is start-up and compiling each op once
SIZES = ["--vocab", "128", "--dim", "32", "--heads", "4", "--hidden", "64", "--seq-len", "32"]


def _run(nproc: int, *args: str, timeout: float = 600) -> dict[int, float]:
    """Run the example; {step: loss} from rank 0's log (checked rc 0)."""
    output = _launch(nproc, EXAMPLE, *SIZES, *args, timeout=timeout)
    losses = {int(s): float(v) for s, v in re.findall(r"step (\d+)/\d+ loss (\S+)", output)}
    assert losses, output[-6000:]
    return losses


def _resume_matches(tmp_path: Path, nproc: int, plan: list[str], steps: int, at: int) -> None:
    """An uninterrupted run of ``steps`` against one stopped after ``at`` and resumed."""
    full = _run(nproc, *plan, "--steps", str(steps))
    assert sorted(full) == list(range(1, steps + 1))
    assert full[steps] < full[1] - 0.05, full  # it learns

    ckpt = tmp_path / "ckpt"
    checkpoints = ["--checkpoint-dir", str(ckpt), "--checkpoint-every", str(at)]
    first = _run(nproc, *plan, "--steps", str(steps), "--stop-after", str(at), *checkpoints)
    assert first == {s: full[s] for s in range(1, at + 1)}
    resumed = _run(nproc, *plan, "--steps", str(steps), "--checkpoint-dir", str(ckpt), "--resume")
    assert resumed == {s: full[s] for s in range(at + 1, steps + 1)}, (resumed, full)


def test_fsdp2_x_tp_resume_equals_uninterrupted(tmp_path):
    """dp 2 x tp 2 (eager: PyTorch cannot compile FSDP2 x TP). Two launches: one run of 6
    steps that checkpoints at step 3 and 6; the step-6 checkpoint is removed, as if the
    run had stopped after step 3, and a second run resumes from step 3."""
    plan = ["--dp", "2", "--tp", "2"]
    ckpt = tmp_path / "ckpt"
    full = _run(4, *plan, "--steps", "6", "--checkpoint-dir", str(ckpt), "--checkpoint-every", "3")
    assert sorted(full) == list(range(1, 7))
    assert full[6] < full[1] - 0.05, full  # it learns
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-000003", "step-000006"]
    shutil.rmtree(ckpt / "step-000006")
    resumed = _run(4, *plan, "--steps", "6", "--checkpoint-dir", str(ckpt), "--resume")
    assert resumed == {s: full[s] for s in (4, 5, 6)}, (resumed, full)


@pytest.mark.slow
def test_fsdp2_x_tp_stop_and_resume(tmp_path):
    """Three launches: uninterrupted, stopped after step 3 (--stop-after), resumed."""
    _resume_matches(tmp_path, 4, ["--dp", "2", "--tp", "2"], steps=6, at=3)


@pytest.mark.slow
def test_fsdp2_compiled_stop_and_resume(tmp_path):
    """FSDP2 over 4 ranks, the model under torch.compile(backend="pjrt")."""
    _resume_matches(tmp_path, 4, ["--dp", "4", "--compile"], steps=6, at=3)


@pytest.mark.slow
def test_tp_compiled_stop_and_resume(tmp_path):
    """TP over 4 ranks, the model under torch.compile(backend="pjrt")."""
    _resume_matches(tmp_path, 4, ["--tp", "4", "--compile"], steps=6, at=3)
