"""Ray Train on pjrt: Ray's own TorchTrainer, started as users start it, with 2 workers
doing DDP on pjrt through ``torch_pjrt.ray_train`` (tests/ray_scripts/ray_trainer.py),
against the same steps in one process on the CPU."""

from __future__ import annotations

from pathlib import Path

from tests.scripts import script_result

SCRIPT = Path(__file__).parent / "ray_scripts" / "ray_trainer.py"


def test_torch_trainer_trains_on_pjrt(tmp_path):
    result = script_result(SCRIPT, str(tmp_path), RAY_USAGE_STATS_ENABLED="0")
    trained, reference = result["trained"], result["reference"]
    assert trained["placed"] == ["pjrt"]  # the model and every batch
    assert trained["device"] == "pjrt:0"  # one CPU device a worker
    assert trained["rays_device"] == "cpu"  # Ray's own answer, which the helper replaces
    assert trained["backend"] == "pjrt" and trained["ddp"] and trained["epoch_set"]
    assert len(trained["losses"]) == len(reference["losses"]) == 6
    for got, want in zip(trained["losses"], reference["losses"], strict=True):
        assert abs(got - want) <= 1e-4, (trained["losses"], reference["losses"])
    for got, want in zip(trained["params"], reference["params"], strict=True):
        assert max(abs(a - b) for a, b in zip(got, want, strict=True)) <= 1e-4
