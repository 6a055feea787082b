"""Code to run once a module has loaded, without importing it: one ``sys.meta_path`` finder.

Registering the device must not import heavy packages (Dynamo, transformers), yet some
of them need a word from torch_pjrt once they load: Dynamo's skip list, transformers'
attention registry. :func:`after_import` runs an action at once if the module has
loaded, else right after it does: the finder lets the other finders find the module and
wraps its loader's ``exec_module``. A module still loading when the action is asked for
(``import torch`` from inside that module's own import registers torch_pjrt) is settled
at the next import after it finished.

Example:
    >>> after_import("transformers.modeling_utils", register)  # imports nothing now
"""

from __future__ import annotations

import importlib.abc
import logging
import sys
from collections.abc import Callable

__all__ = ["after_import"]

log = logging.getLogger("torch_pjrt")


def _loaded(name: str):
    """The module ``name`` if it has finished loading, else None."""
    module = sys.modules.get(name)
    if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
        return None
    return module


def _run(actions, module) -> None:
    for action in actions:
        try:
            action(module)
        except Exception as exc:  # noqa: BLE001  (a user's import must never fail for it)
            log.warning("torch_pjrt: %s after %s loaded failed: %s", action, module.__name__, exc)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the loader of the modules with pending actions."""

    def __init__(self):
        self.pending: dict[str, list[Callable]] = {}

    def find_spec(self, name, path=None, target=None):
        for waiting in [n for n in self.pending if n in sys.modules]:
            module = _loaded(waiting)
            if module is not None:
                _run(self.pending.pop(waiting, ()), module)
        if name not in self.pending or name in sys.modules:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                break
        else:
            return None
        run = getattr(spec.loader, "exec_module", None)
        if run is None:
            return spec

        def exec_module(module):
            run(module)
            _run(self.pending.pop(name, ()), module)

        spec.loader.exec_module = exec_module
        return spec


_finder = _Finder()


def after_import(name: str, action: Callable) -> None:
    """Call ``action(module)`` once the module ``name`` has loaded (now, if it has)."""
    module = _loaded(name)
    if module is not None:
        _run((action,), module)
        return
    _finder.pending.setdefault(name, []).append(action)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
