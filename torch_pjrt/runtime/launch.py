"""Starting JAX's multi-controller runtime from ``torchrun``'s environment.

Under ``torchrun`` (or any launcher that sets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``
and ``MASTER_PORT``) with ``WORLD_SIZE > 1``, each process is one JAX process:
``jax.distributed.initialize`` runs when torch_pjrt's runtime starts (the first use of
a pjrt device, or ``init_process_group``), before JAX creates its PJRT client, with

- the coordinator at ``MASTER_ADDR:(MASTER_PORT + 1)`` (``TORCH_PJRT_COORDINATOR_PORT``
  overrides the port; ``MASTER_PORT`` itself is torch's TCPStore),
- ``num_processes = WORLD_SIZE`` and ``process_id = RANK``, so torch rank r is JAX
  process r,
- on GPU platforms with several processes per host, ``local_device_ids = [LOCAL_RANK]``:
  each process owns one GPU. On the CPU each process has its own CPU device(s), and
  JAX's gloo collectives carry cross-process collectives.

Launchers that set no ``MASTER_PORT``/``RANK`` pair for the process (Ray Train, which
sets ``RANK`` only after the process group exists; ``torch.multiprocessing.spawn`` with a
``file://`` or ``tcp://`` init_method) still start the pjrt process group: its store
names the coordinator instead (:func:`init_jax_from_store`).

``TORCH_PJRT_DISTRIBUTED=0`` turns this off (each process is then a separate JAX world).
``TORCH_PJRT_INIT_TIMEOUT`` (seconds, JAX's default 300) bounds the wait for every
process to join; ``TORCH_PJRT_HEARTBEAT_TIMEOUT`` (seconds, JAX's default 100) is how long
JAX's coordination service waits for a silent process before it ends every process.
"""

from __future__ import annotations

import logging
import os

from torch_pjrt.config import settings

log = logging.getLogger("torch_pjrt")

__all__ = [
    "coordinator_address",
    "init_jax_from_env",
    "init_jax_from_store",
    "jax_timeouts",
    "torchrun_env",
]


def torchrun_env() -> dict | None:
    """RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT as a dict,
    or None when this process was not started by a multi-process launcher."""
    env = os.environ
    try:
        world = int(env.get("WORLD_SIZE", "1"))
    except ValueError:
        return None
    if world <= 1 or "RANK" not in env or "MASTER_ADDR" not in env or "MASTER_PORT" not in env:
        return None
    return {
        "rank": int(env["RANK"]),
        "world_size": world,
        "local_rank": int(env.get("LOCAL_RANK", "0")),
        "local_world_size": int(env.get("LOCAL_WORLD_SIZE", "1")),
        "master_addr": env["MASTER_ADDR"],
        "master_port": int(env["MASTER_PORT"]),
    }


def coordinator_address(env: dict) -> str:
    """Where JAX's coordination service listens: MASTER_ADDR, port MASTER_PORT + 1."""
    port = settings.coordinator_port  # TORCH_PJRT_COORDINATOR_PORT
    port = port if port is not None else env["master_port"] + 1
    host = env["master_addr"]
    if ":" in host and not host.startswith("["):  # an IPv6 address
        host = f"[{host}]"
    return f"{host}:{port}"


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out to outgoing connections and ``bind(0)``."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default; other systems: IANA's range starts higher


def free_port(host: str = "127.0.0.1", count: int = 1) -> int:
    """A local port p with p .. p + count - 1 free now, drawn at random *below* the
    ephemeral range: a port that ``bind(0)`` picked would be free only until the next
    outgoing connection on the machine takes it as its local port (the RPC servers
    that bind it a second later then fail with "address in use")."""
    import random
    import socket

    high = max(1024 + count + 1, _ephemeral_low() - count)
    low = max(1024, high - 20000)
    for _ in range(200):
        port = random.randrange(low, high)
        try:
            for p in range(port, port + count):
                with socket.socket() as s:
                    s.bind((host, p))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no {count} free consecutive ports on {host} between {low} and {high}")


def free_port_pair(host: str = "127.0.0.1") -> int:
    """A ``--master_port`` for torchrun on one machine: torch's store on p, JAX's
    coordinator on p + 1 (:func:`coordinator_address`), both free."""
    return free_port(host, count=2)


def local_cpu_env(base: dict | None = None) -> dict:
    """``base`` (default: this process's environment) for ranks started on this machine
    on JAX's CPU platform with one device each: the platform named, any forced CPU
    device count dropped, and an enclosing launch's rank variables removed (tests and
    benchmarks launch several processes on one host this way)."""
    env = dict(os.environ if base is None else base)
    env.update(JAX_PLATFORMS="cpu", PJRT_DEVICE="CPU")
    flags = [f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f]
    env["XLA_FLAGS"] = " ".join(flags)
    for name in (
        "TORCH_PJRT_CPU_DEVICES", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
    ):  # fmt: skip
        env.pop(name, None)
    return env


def local_torchrun_command(nproc: int, *args: str) -> list[str]:
    """``python -m torch.distributed.run`` with ``nproc`` processes on this machine, on a
    free port pair (:func:`free_port_pair`), then ``args`` (the script and its
    arguments)."""
    import sys

    return [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
        "--master_addr", "127.0.0.1", "--master_port", str(free_port_pair()), *args,
    ]  # fmt: skip


def jax_timeouts() -> dict:
    """``jax.distributed.initialize``'s timeout arguments (whole seconds) from
    ``TORCH_PJRT_INIT_TIMEOUT`` and ``TORCH_PJRT_HEARTBEAT_TIMEOUT``, where set."""
    out = {}
    for seconds, arg in (
        (settings.init_timeout, "initialization_timeout"),
        (settings.heartbeat_timeout, "heartbeat_timeout_seconds"),
    ):
        if seconds is not None:
            out[arg] = max(1, round(seconds))
    return out


def init_jax_from_env(platform: str | None = None) -> bool:
    """Initialize ``jax.distributed`` from torchrun's environment when it applies.

    Called by the runtime before JAX's backends start; does nothing in a single process,
    when ``TORCH_PJRT_DISTRIBUTED=0``, or when JAX's distributed runtime is already up
    (a user who called ``jax.distributed.initialize`` themselves keeps their settings).
    Returns whether this call initialized it.
    """
    if not settings.distributed:  # TORCH_PJRT_DISTRIBUTED
        return False
    env = torchrun_env()
    if env is None:
        return False
    import jax

    if jax.distributed.is_initialized():
        return False
    local_ids = _local_ids(platform, env["local_world_size"], env["local_rank"])
    _initialize(coordinator_address(env), env["world_size"], env["rank"], local_ids)
    return True


_COORDINATOR_KEY = "torch_pjrt/jax_coordinator"


def init_jax_from_store(store, rank: int, world_size: int, platform: str | None = None) -> bool:
    """Initialize ``jax.distributed`` for a process group whose launcher left no
    torchrun environment: rank 0 picks a free port on ``MASTER_ADDR`` (else 127.0.0.1)
    for JAX's coordinator and publishes it in the group's store; every rank reads it.
    ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``, where set, give a GPU process its own GPU,
    as under torchrun. Does nothing in one process, with ``TORCH_PJRT_DISTRIBUTED=0``,
    under torchrun's environment (:func:`init_jax_from_env`) or when JAX's distributed
    runtime is up. Returns whether this call initialized it."""
    if not settings.distributed or world_size <= 1 or torchrun_env() is not None:
        return False
    import jax

    if jax.distributed.is_initialized():
        return False
    if rank == 0:
        host = os.environ.get("MASTER_ADDR", "127.0.0.1")
        env = {"master_addr": host, "master_port": free_port_pair(host)}
        store.set(_COORDINATOR_KEY, coordinator_address(env))  # the pair's second port
    address = store.get(_COORDINATOR_KEY).decode()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    local_ids = _local_ids(platform, local_world, int(os.environ.get("LOCAL_RANK", "0") or 0))
    _initialize(address, world_size, rank, local_ids)
    return True


def _local_ids(platform: str | None, local_world: int, local_rank: int) -> list[int] | None:
    """The devices this process takes: on a GPU platform with several processes a host,
    its local rank's GPU alone (each would see them all); otherwise None, all of them."""
    from torch_pjrt.runtime.platform import GPU_PLATFORMS  # (platform imports this module)

    if (platform or "").lower() in GPU_PLATFORMS and local_world > 1:
        return [local_rank]
    return None


def _initialize(address: str, num_processes: int, process_id: int, local_ids) -> None:
    import jax

    log.info(
        "torch_pjrt: jax.distributed.initialize(%s, num_processes=%d, process_id=%d)",
        address,
        num_processes,
        process_id,
    )
    jax.distributed.initialize(
        coordinator_address=address,
        num_processes=num_processes,
        process_id=process_id,
        local_device_ids=local_ids,
        cluster_detection_method="deactivate",
        **jax_timeouts(),
    )
