"""Run a program torch_pjrt.export.save() wrote, with jax and numpy alone (the lines of
docs/export.md). Usage: run_without_torch.py DIR INPUTS.npz OUTPUTS.npz

torch is made unimportable first: the run must not need it.
"""

import sys

sys.modules["torch"] = None  # (an import of torch now raises ImportError)

import pathlib  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

# --- the lines of docs/export.md ---------------------------------------------------
jax.config.update("jax_enable_x64", True)  # (int64 inputs, as PyTorch's)
path = pathlib.Path(sys.argv[1])
program = jax.export.deserialize(bytearray((path / "program.jaxexport").read_bytes()))
with np.load(path / "weights.npz") as saved:
    weights = [saved[f"w{i}"] for i in range(len(saved.files))]
# -------------------------------------------------------------------------------------

with np.load(sys.argv[2]) as given:
    inputs = [given[f"x{i}"] for i in range(len(given.files))]
outputs = program.call(weights, *inputs)
np.savez(sys.argv[3], **{f"y{i}": np.asarray(y) for i, y in enumerate(outputs)})
print("JAX ONLY OK", "torch" in sys.modules and sys.modules["torch"] is None)
