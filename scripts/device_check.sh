#!/usr/bin/env bash
# One run of the checks that need an accelerator, on a machine that has one:
#
#   OUT=/tmp/out scripts/device_check.sh [PLATFORM] [PYTEST_SECONDS]
#
# PLATFORM is a JAX platform name (default cuda). It uses the machine's own python3 and
# its packages (no venv, no downloads: an accelerator machine may have no network), and
# installs this checkout on top of them without dependencies. Each stage has its own
# time limit and writes its log under $OUT as it goes, so a stage that runs out of time
# still leaves the others' results:
#
#   env.txt          accelerator, driver and package versions
#   platform.log     scripts/platform_check.py: precision, a GPT step and autocast
#                    against CPU PyTorch (and CUDA PyTorch, where there is one)
#   eager_ops.log    benchmarks/eager_ops.py (per-op host cost, CUDA PyTorch column)
#   compile_step.log benchmarks/compile_step.py (a training step five ways)
#   paged_attention.log benchmarks/paged_attention.py (the paged decode kernel against
#                    its XLA path: where TORCH_PJRT_ATTENTION=auto should take it)
#   kernels.log      the kernel library's tests on PLATFORM (Pallas compiled)
#   pytest.log       the fast suite on PLATFORM (TORCH_PJRT_TEST_PLATFORM), verbose
set -u
PLATFORM=${1:-cuda}
PYTEST_SECONDS=${2:-300}
OUT=${OUT:-/tmp/device_check}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false HF_HUB_OFFLINE=1
export PJRT_DEVICE=${PLATFORM^^}

{
    date
    nvidia-smi 2>/dev/null | head -15
    $PY --version
    $PY -m pip list 2>/dev/null |
        grep -iE '^(torch|jax|jaxlib|jax-cuda[0-9]+-(plugin|pjrt)|numpy|transformers|pytest|pytest-xdist) '
    nproc
} >"$OUT/env.txt" 2>&1

if ! $PY -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1; then
    # the package from the tree; its entry points (PyTorch's autoload, the compile
    # backend) from a carried torch_pjrt.egg-info, if there is one
    echo "install failed (see install.log): using PYTHONPATH=$PWD" | tee -a "$OUT/env.txt"
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi

stage() {  # stage NAME SECONDS command...
    local name=$1 seconds=$2
    shift 2
    echo "== $name (limit ${seconds}s)"
    local start=$SECONDS
    timeout "$seconds" "$@" >"$OUT/$name.log" 2>&1
    echo "== $name: exit $? after $((SECONDS - start))s" | tee -a "$OUT/$name.log"
}

stage platform 90 $PY scripts/platform_check.py --json "$OUT/platform.json"
stage eager_ops 90 $PY benchmarks/eager_ops.py --repeat 300 --rounds 5
stage compile_step 120 $PY benchmarks/compile_step.py --steps 10
stage paged_attention 90 $PY benchmarks/paged_attention.py
TORCH_PJRT_TEST_PLATFORM=$PLATFORM stage kernels 120 \
    $PY -m pytest -q -n 8 -p no:cacheprovider tests/test_kernel_paged_attention.py \
    tests/test_kernel_flash_attention.py tests/test_kernel_norms.py tests/test_kernel_rotary.py
# the suite on the chip; the files that need several processes per device, several
# virtual CPU devices or packages a bare accelerator image lacks are left out
TORCH_PJRT_TEST_PLATFORM=$PLATFORM stage pytest "$PYTEST_SECONDS" \
    $PY -m pytest -v -n 8 -m "not slow" -p no:cacheprovider \
    tests/test_device.py tests/test_semantics.py tests/test_errors.py tests/test_amp.py \
    tests/test_random.py tests/test_variants.py tests/test_core_aten.py tests/test_modes.py \
    tests/test_compile.py tests/test_training.py tests/test_serialization.py \
    tests/test_hf_integration.py tests/test_ops.py
grep -cE '\bPASSED\b' "$OUT/pytest.log" | sed 's/^/passed: /'
grep -cE '\b(FAILED|ERROR)\b' "$OUT/pytest.log" | sed 's/^/failed or error: /'
tail -3 "$OUT/pytest.log"
