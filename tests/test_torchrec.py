"""TorchRec on pjrt (tests/torchrec_scripts/torchrec_check.py, in a process of its own):
KeyedJaggedTensor, EmbeddingBagCollection and a DLRM trained 20 steps, against the CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from torch_pjrt.runtime.launch import local_cpu_env

SCRIPT = Path(__file__).parent / "torchrec_scripts" / "torchrec_check.py"


def test_torchrec_matches_the_cpu():
    done = subprocess.run(
        [sys.executable, str(SCRIPT)],
        env=local_cpu_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, output[-6000:]
    result = json.loads(line[len("RESULT ") :])
    assert result["jagged"] == 0.0  # ids, lengths, offsets, weights: exact
    assert result["ebc"] <= 1e-5 and result["ebc_weighted"] <= 1e-5, result
    dlrm = result["dlrm"]
    assert dlrm["steps"] == 20 and dlrm["loss"] <= 1e-4 and dlrm["params"] <= 1e-4, dlrm
    assert dlrm["fallbacks"] == {}, dlrm  # the model's ops all lower to XLA
