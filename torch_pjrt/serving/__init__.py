"""Serving stacks on the pjrt device.

``torch_pjrt.serving.vllm`` is vLLM's platform plugin (entry point group
``vllm.platform_plugins``); vLLM imports it, nothing in torch_pjrt does.
"""
