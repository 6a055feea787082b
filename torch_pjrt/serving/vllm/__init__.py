"""vLLM's platform plugin for the pjrt device (docs/serving.md).

vLLM reads the entry point group ``vllm.platform_plugins`` the first time
``vllm.platforms.current_platform`` is used, in every process it starts (front end,
engine core, workers), and calls :func:`register`. An out-of-tree platform that
answers wins over vLLM's own (CUDA, CPU, ...), so installing ``torch_pjrt[vllm]``
is the switch; ``VLLM_PLUGINS`` (vLLM's list of plugins to load) turns it off.

Nothing heavy is imported here: vLLM is still choosing its platform.
"""

from __future__ import annotations


def register() -> str:
    """The qualified name of the Platform class vLLM should use."""
    return "torch_pjrt.serving.vllm.platform.PjrtPlatform"
