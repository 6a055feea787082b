"""Faults and timeouts of the pjrt process group: a failing rank never leaves the others hung.

A pjrt collective is a JAX program that every rank of the group must run with the same
shapes, in the same order. When one rank raises, dies, or calls something else, the
others would wait in JAX's collective forever (JAX's CPU gloo collectives have no
timeout, and a failing process's exit waits up to 300 s in JAX's shutdown barrier).
So, before each pjrt collective, the ranks agree on it:

- every rank sends a short descriptor (``#7 all_reduce(float32[4], sum)``: its collective
  count, the call, the tensor's dtype and shape, the options) to every other through a
  gloo group of its own, with the group's timeout;
- different descriptors raise :class:`torch.distributed.DistBackendError` on every rank,
  naming each rank's call ("rank 0 called ..., rank 1 called ...");
- a rank that raises an uncaught exception reports it in the group's store (a
  ``sys.excepthook``) and closes its gloo connections, so the others raise at once,
  naming it and its exception; a rank that is killed closes its connections too (the OS
  does), and one that hangs elsewhere makes the exchange time out. Either way the others
  raise ``DistBackendError`` naming the rank(s) that did not arrive.

The timeout is the group's (``init_process_group(timeout=...)``; PyTorch's default is 30
minutes), or ``TORCH_PJRT_COLLECTIVE_TIMEOUT`` seconds when set.
``TORCH_PJRT_DISTRIBUTED_CHECKS=0`` turns the exchange off (no per-collective cost; a
failure then hangs the others as before).

After a fault, the process skips JAX's shutdown barrier at exit (the failed peer would
never reach it), so every rank exits promptly.
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import os
import sys
import threading
import time
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist

from torch_pjrt.config import settings

log = logging.getLogger("torch_pjrt")

__all__ = ["CollectiveChecker", "checks_enabled", "collective_timeout", "describe"]

_SIZE = 256  # bytes of one descriptor
_REPORT = "pjrt_fault/report/"  # + global rank: what a failing rank reports
_ALIVE = "pjrt_fault/alive/"  # + global rank: written by ranks that saw a failure
_GRACE_S = 1.0  # how long a rank that saw a failure waits for the others' reports

_checkers: weakref.WeakSet = weakref.WeakSet()
_state = {"hooked": False, "faulted": False, "peer_failed": False, "uncaught": 0}
_lock = threading.Lock()


def checks_enabled() -> bool:
    """``TORCH_PJRT_DISTRIBUTED_CHECKS`` (default on)."""
    return settings.distributed_checks


def collective_timeout(group_timeout: timedelta | None) -> timedelta:
    """``TORCH_PJRT_COLLECTIVE_TIMEOUT`` (seconds) when set, else the group's timeout."""
    seconds = settings.collective_timeout
    if seconds is not None:
        return timedelta(seconds=seconds)
    return group_timeout if group_timeout is not None else timedelta(minutes=30)


def describe(name: str, tensor: torch.Tensor, extra=None) -> str:
    """``all_reduce(float32[4], sum)``: what a rank calls, as the others will see it."""
    dtype = str(tensor.dtype).removeprefix("torch.")
    shape = ",".join(str(s) for s in tensor.shape)
    more = "" if extra is None else f", {extra}"
    return f"{name}({dtype}[{shape}]{more})"


class CollectiveChecker:
    """Agreement before each collective of one group (see the module docstring)."""

    def __init__(self, store, rank: int, size: int, ranks: tuple, timeout: timedelta):
        self._store = store
        self._rank, self._size, self._ranks = rank, size, ranks
        self.timeout = timeout
        me = ranks[rank]
        for key in (f"{_REPORT}{me}", f"{_ALIVE}{me}"):  # an earlier group's, same store
            store.delete_key(key)
        # the gloo group's rendezvous below orders these deletions before any report
        self._gloo = dist.ProcessGroupGloo(
            dist.PrefixStore("pjrt_checks/", store), rank, size, timeout
        )
        self._seq = 0
        self._aborted = False
        _install_hooks()
        _checkers.add(self)

    def check(self, descriptor: str) -> None:
        """Exchange ``descriptor`` with every rank; raise ``DistBackendError`` on a
        difference, a failed rank or the timeout."""
        self._seq += 1
        data = f"#{self._seq} {descriptor}".encode()[:_SIZE]
        mine = data.decode(errors="ignore")  # as the others will read it
        data = data.ljust(_SIZE, b"\0")
        sent = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        got = torch.empty(self._size * _SIZE, dtype=torch.uint8)
        try:
            self._gloo._allgather_base(got, sent).wait()
        except RuntimeError as e:
            raise self._failure(descriptor, e) from e
        raw = got.numpy().tobytes()
        calls = [
            raw[i * _SIZE : (i + 1) * _SIZE].rstrip(b"\0").decode(errors="ignore")
            for i in range(self._size)
        ]
        if any(c != mine for c in calls):
            sides = ", ".join(f"rank {self._ranks[i]} called {c}" for i, c in enumerate(calls))
            raise dist.DistBackendError(
                "pjrt process group: the ranks called different collectives (or in a "
                f"different order, or with different shapes): {sides}. Every rank of the "
                "group must call the same collectives in the same order with the same "
                "shapes and dtypes."
            )

    def _failure(self, descriptor: str, cause: Exception) -> dist.DistBackendError:
        """The exchange failed: find out which ranks failed and how."""
        _state["faulted"] = _state["peer_failed"] = True
        me = self._ranks[self._rank]
        others = [r for r in self._ranks if r != me]
        store_error = None
        try:
            self._store.set(f"{_ALIVE}{me}", str(self._seq))
            reports = self._wait_reports(others)
        except (RuntimeError, dist.DistError) as e:  # the store's host is gone too
            reports, store_error = {}, e
        seconds = self.timeout.total_seconds()
        lines = []
        for r in others:
            if f"{_REPORT}{r}" in reports:
                lines.append(f"rank {r} {reports[f'{_REPORT}{r}']}")
            elif f"{_ALIVE}{r}" not in reports:
                lines.append(
                    f"rank {r} did not reach it (the process exited or was killed without a "
                    "Python exception, or it is stuck elsewhere)"
                )
        if not lines:
            lines.append("no rank reported a failure")
        where = f"rank {me} was waiting in collective #{self._seq} {descriptor}"
        where += f", timeout {seconds:g} s"
        text = f"pjrt process group: {'; '.join(lines)} ({where}). Cause: {cause}"
        if store_error is not None:
            text += (
                f". The store is unreachable too ({store_error}): its host (rank 0 or the "
                "launcher) may have exited"
            )
        return dist.DistBackendError(text)

    def _wait_reports(self, others: list[int]) -> dict[str, str]:
        """Reports and alive marks of ``others``, waiting up to the grace period."""
        deadline = time.monotonic() + min(_GRACE_S, self.timeout.total_seconds())
        found: dict[str, str] = {}
        while True:
            for r in others:
                for key in (f"{_REPORT}{r}", f"{_ALIVE}{r}"):
                    if key not in found and self._store.check([key]):
                        found[key] = self._store.get(key).decode()
            settled = all(f"{_REPORT}{r}" in found or f"{_ALIVE}{r}" in found for r in others)
            if settled or time.monotonic() > deadline:
                return found
            time.sleep(0.05)

    def report(self, text: str) -> None:
        """Tell the other ranks this one failed (``text``), and close the connections."""
        me = self._ranks[self._rank]
        try:
            self._store.set(f"{_REPORT}{me}", text)
        except (RuntimeError, dist.DistError) as e:
            log.warning("torch_pjrt: could not report the failure to the store: %s", e)
        self.abort()

    def abort(self) -> None:
        if not self._aborted:
            self._aborted = True
            self._gloo.abort()

    def shutdown(self) -> None:
        _checkers.discard(self)
        if not self._aborted:
            self._aborted = True
            self._gloo.shutdown()


def report_failure(text: str) -> None:
    """Record that this process failed (``text``) in every group and close them."""
    with _lock:
        _state["faulted"] = True
        for checker in list(_checkers):
            checker.report(text)


def _excepthook(kind, value, tb):
    _state["uncaught"] = 130 if issubclass(kind, KeyboardInterrupt) else 1  # the exit status
    if _state["peer_failed"]:  # the error names the failed peer already: just let go
        with _lock:
            for checker in list(_checkers):
                checker.abort()
    else:
        report_failure(f"raised {kind.__name__}: {value}")
    _previous_hook(kind, value, tb)


_previous_hook = sys.excepthook


def _install_hooks() -> None:
    global _previous_hook
    with _lock:
        if _state["hooked"]:
            return
        _state["hooked"] = True
        _previous_hook = sys.excepthook
        sys.excepthook = _excepthook
        # registered after JAX's own (at jax's import), so it runs before it
        atexit.register(_skip_jax_shutdown_after_fault)


def _skip_jax_shutdown_after_fault() -> None:
    """After a fault, JAX's shutdown barrier would wait (300 s) for a rank that is gone,
    and tearing down JAX's coordination service makes the other processes' JAX clients
    abort them. A process ending with an uncaught exception exits here (status 1, 130
    after a KeyboardInterrupt), skipping the later exit handlers; one that caught the
    error keeps JAX's distributed objects alive to the end instead."""
    if not _state["faulted"]:
        return
    from jax._src import distributed

    state = distributed.global_state
    if state.client is None:
        return
    if _state["uncaught"]:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(_state["uncaught"])
    log.info("torch_pjrt: a rank failed; skipping JAX's distributed shutdown barrier")
    for obj in (state.preemption_sync_manager, state.client, state.service):
        if obj is not None:
            # NOTE: never destroyed, not even when the interpreter clears the modules:
            # destroying the service or client ends the process (SIGABRT) from JAX's side
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
    state.preemption_sync_manager = state.client = state.service = None
