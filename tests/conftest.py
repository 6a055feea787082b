"""Shared pytest setup for the torch_pjrt suite.

The environment is fixed here, before anything imports JAX or torch_pjrt (importing
torch imports torch_pjrt through PyTorch's device-backend autoload), so every test
process runs on JAX's CPU platform with two devices:

- ``JAX_PLATFORMS=cpu``
- ``XLA_FLAGS`` gets ``--xla_force_host_platform_device_count=2`` appended.

``TORCH_PJRT_TEST_PLATFORM`` (default ``cpu``) runs the suite on another chip instead,
e.g. ``TORCH_PJRT_TEST_PLATFORM=cuda``: JAX sees that platform first and the CPU second
(the CPU stays for host-side work), ``PJRT_DEVICE`` names it, and JAX allocates GPU
memory on demand so that several pytest workers can share one card. Tests written
for the two virtual CPU devices then meet the chip's own device count
(``scripts/device_check.sh`` is the run used on a GPU machine).
- ``TORCH_PJRT_CACHE=0``: no persistent compilation cache, so compile counts and times
  do not depend on earlier runs (the cache's own test turns it on in a temporary dir).
- ``HF_HUB_OFFLINE=1``: Hugging Face models are built from small configs, never fetched.

Slow tests carry the ``slow`` marker and are left out of a plain run (``make test``).
They run with ``--exhaustive``, with ``TORCH_PJRT_EXHAUSTIVE=1``, or when ``-m`` names
the marker (``make test-all`` passes ``-m "slow or not slow"``).
"""

from __future__ import annotations

import os

import pytest

_DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"

_TEST_PLATFORM = os.environ.get("TORCH_PJRT_TEST_PLATFORM", "cpu").strip().lower() or "cpu"
if _TEST_PLATFORM == "cpu":
    os.environ["JAX_PLATFORMS"] = "cpu"
else:
    os.environ["JAX_PLATFORMS"] = f"{_TEST_PLATFORM},cpu"
    os.environ["PJRT_DEVICE"] = _TEST_PLATFORM.upper()
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("TORCH_PJRT_CACHE", "0")
os.environ["HF_HUB_OFFLINE"] = "1"  # models are built from configs: nothing downloads
_flags = os.environ.get("XLA_FLAGS", "")
if _DEVICE_COUNT_FLAG not in _flags:
    os.environ["XLA_FLAGS"] = f"{_flags} {_DEVICE_COUNT_FLAG}=2".strip()


def pytest_addoption(parser):
    parser.addoption(
        "--exhaustive",
        action="store_true",
        default=False,
        help="also run tests marked slow (e.g. every OpInfo sample, not the first few)",
    )


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: exhaustive runs, not in make test")
    config.addinivalue_line(
        "markers",
        "devices(n): needs n pjrt devices; skipped on a test platform with fewer "
        "(TORCH_PJRT_TEST_PLATFORM), never on the CPU, which always has 2",
    )


@pytest.fixture(autouse=True)
def _enough_devices(request):
    """The one place where tests are skipped for want of devices (``devices`` marker;
    the reason is ``SKIP_TOO_FEW_DEVICES`` in tests/expectations.py)."""
    marker = request.node.get_closest_marker("devices")
    if marker is None:
        return
    import torch

    from tests.expectations import SKIP_TOO_FEW_DEVICES

    wanted, have = marker.args[0], torch.pjrt.device_count()
    if have >= wanted:
        return
    if _TEST_PLATFORM == "cpu":
        pytest.fail(
            f"needs {wanted} pjrt devices and the CPU platform has {have}: "
            "tests/conftest.py asks for 2 (XLA_FLAGS)"
        )
    pytest.skip(SKIP_TOO_FEW_DEVICES.format(wanted=wanted, platform=_TEST_PLATFORM, have=have))


def exhaustive(config) -> bool:
    """Whether slow tests are selected for this run."""
    env = os.environ.get("TORCH_PJRT_EXHAUSTIVE", "").strip().lower()
    return (
        config.getoption("--exhaustive")
        or env not in ("", "0", "false", "no", "off")
        or "slow" in (config.getoption("markexpr") or "")
    )


# How the suite is spread over pytest-xdist's workers (the Makefile's ``--dist loadscope
# --no-loadscope-reorder``): a module (or a test class) is one unit of work, handed to
# the next free worker in collection order, and:
# - LONG: modules whose tests each start other programs for a minute or more (vLLM's
#   engine and server, torchrun's ranks, TorchTitan's, Ray's and TorchRec's runs) are
#   one unit, first, so they run one after another on one worker while the other runs
#   the rest (two of them at once on two cores took a third longer than in turn);
# - BIG: the modules of many tests that take longest in all come next;
# - then the others in name order, so that a run ends with short modules, not with one
#   worker still busy for minutes while the other has nothing left.
LONG = (
    "test_vllm.py",
    "test_torchtitan.py",
    "test_distributed.py",
    "test_example_distributed.py",
    "test_ray.py",
    "test_torchrec.py",
)
BIG = ("test_ops.py", "test_compile.py", "test_variants.py", "test_training.py")


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadscope``'s scheduler with the LONG modules as one unit."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class LongFirst(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.split("::", 1)[0].rsplit("/", 1)[-1] in LONG:
                return "long"
            return super()._split_scope(nodeid)

    return LongFirst(config, log)


def pytest_collection_modifyitems(config, items):
    order = {name: i for i, name in enumerate(LONG + BIG)}
    items.sort(key=lambda item: order.get(item.path.name, len(order)))  # (stable)
    if exhaustive(config):
        return
    keep, dropped = [], []
    for item in items:
        (dropped if item.get_closest_marker("slow") else keep).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


@pytest.fixture
def programs(monkeypatch):
    """The kinds of the compiled graph programs made while a test runs (a graph split
    around eager nodes makes parts), Dynamo's caches reset first."""
    import torch

    from torch_pjrt.compile import program

    made = []
    real = program.GraphProgram.__init__

    def init(self, gm, kind="inference", *a, **k):
        made.append(kind)
        real(self, gm, kind, *a, **k)

    monkeypatch.setattr(program.GraphProgram, "__init__", init)
    torch._dynamo.reset()
    return made
