"""TorchRec on pjrt (tests/torchrec_scripts/torchrec_check.py, in a process of its own):
KeyedJaggedTensor, EmbeddingBagCollection and a DLRM trained 20 steps, against the CPU."""

from __future__ import annotations

from pathlib import Path

from tests.scripts import script_result

SCRIPT = Path(__file__).parent / "torchrec_scripts" / "torchrec_check.py"


def test_torchrec_matches_the_cpu():
    result = script_result(SCRIPT)
    assert result["jagged"] == 0.0  # ids, lengths, offsets, weights: exact
    assert result["ebc"] <= 1e-5 and result["ebc_weighted"] <= 1e-5, result
    dlrm = result["dlrm"]
    assert dlrm["steps"] == 20 and dlrm["loss"] <= 1e-4 and dlrm["params"] <= 1e-4, dlrm
    assert dlrm["fallbacks"] == {}, dlrm  # the model's ops all lower to XLA
