"""Prototype vLLM platform plugin for the torch_pjrt "pjrt" device.

vLLM calls ``register()`` (entry point group ``vllm.platform_plugins``) in
every process the first time ``vllm.platforms.current_platform`` is read
(vllm/platforms/__init__.py, resolve_current_platform_cls_qualname). It must
return the qualified name of the Platform class, or None to stay inactive.
Nothing heavy may be imported here: vllm.platforms is still being resolved.
"""

import os


def register() -> str | None:
    if os.environ.get("PJRT_VLLM_DISABLE", "0") == "1":  # opt-out switch
        return None
    try:
        import importlib.util

        if importlib.util.find_spec("torch_pjrt") is None:
            return None
    except Exception:
        return None
    return "vllm_pjrt.platform.PjrtPlatform"
