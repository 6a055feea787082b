"""Every expected failure of the test suite, and every skip, each with its reason.

The one place they are listed: every suite takes its marks from here. An expected failure
is a strict xfail (``xfail``: a test listed here that passes fails the run, so a fix is
noticed and its entry removed). A skip is for a test that has nothing to compare (an op
whose results are random or uninitialised, an op the CPU cannot run) or hardware the
platform lacks; none stands for a failure.

OpInfo ops (tests/test_ops.py, tests/test_variants.py, tests/test_core_aten.py), keyed
``"op_name"`` or ``"op_name.variant"``:

- ``SKIP``: ops that cannot be compared with the CPU, with the reason. Hand-kept.
- ``SHAPE_ONLY``: ops whose CPU result is uninitialised memory; only shape, dtype and
  device are compared. Hand-kept.
- ``XFAIL``: ops failing within the first 3 samples (``make test``) in both execution
  modes, eager and fused, with the error.
- ``XFAIL_EAGER`` and ``XFAIL_FUSED``: ops failing within the first 3 samples in that
  mode only. The modes should agree, so each entry is a bug.
- ``XFAIL_EXHAUSTIVE``: ops that pass the first 3 samples but fail a later one (only
  the exhaustive run, ``--exhaustive``, expects them to fail; it runs in fused mode).
- ``XFAIL_GRAD``, ``XFAIL_GRAD_EAGER``, ``XFAIL_GRAD_FUSED`` and
  ``XFAIL_GRAD_EXHAUSTIVE``: the same for float32 gradients (``test_grad``; ``make
  test`` runs the first 2 samples of each op).
- ``XFAIL_COMPLEX``: ops failing within their first 3 complex64 samples
  (``test_op_complex``, for ops tested in another dtype above). Hand-kept.
- ``XFAIL_VARIANTS``: ops whose in-place or ``out=`` variants differ from the CPU in
  both modes (``tests/test_variants.py``); ``XFAIL_VARIANTS_EAGER`` and
  ``XFAIL_VARIANTS_FUSED`` in one mode only. Hand-kept.
- ``GRAD_TOLERANCES``: wider gradient tolerances for a few ops, with the measurement
  that justifies each. Hand-kept.

OpInfo error inputs (tests/test_error_inputs.py), keyed like the op tables:

- ``XFAIL_ERROR_INPUTS``: ops with an error input that pjrt accepts, or refuses with
  another exception type (in either mode), with the reason. Hand-kept.
- ``ERROR_MESSAGES``: ops whose error inputs all raise the right type, some with a message
  of PyTorch's own that the OpInfo's regex does not match (a decomposition's or a Meta
  kernel's wording of the check): only the type is asserted, and the test fails once every
  message matches. Hand-kept.

The other suites: ``XFAIL_CORE_EXAMPLES`` (tests/test_core_aten.py),
``XFAIL_HF_FAMILIES``, ``XFAIL_HF_GENERATE``, ``XFAIL_HF_INTEGRATION``
(tests/test_hf_*.py), ``XFAIL_DISTRIBUTED`` (tests/test_distributed.py) and
``XFAIL_TORCHTITAN`` (tests/test_torchtitan.py), ``XFAIL_BACKEND_CONTRACT``
(tests/test_backend_contract.py), ``XFAIL_COMPILED_NUMBERS`` (tests/test_errors.py); the skips
that remain, with their reasons, are at the end (``SKIP_*``).

The op xfail tables are strict and generated: after lowerings land, run

    .venv/bin/python scripts/op_coverage.py --write-expectations

which reruns every op (every sample in fused mode, the first ones in eager mode too) and
rewrites the part of this file between the GENERATED markers (and docs/op_coverage.md).
Edit the other tables by hand.
"""

from __future__ import annotations

import pytest


def xfail(reason: str):
    """The mark of an expected failure: strict, so that a fix fails the run until its
    entry is removed."""
    return pytest.mark.xfail(strict=True, reason=reason)


def marks(table: dict, key) -> list:
    """``[xfail(reason)]`` when ``table`` lists ``key``, else ``[]``."""
    return [xfail(table[key])] if key in table else []


def expected(table: dict):
    """A decorator marking a test function as expected to fail when ``table`` lists its
    name."""

    def mark(test):
        reason = table.get(test.__name__)
        return xfail(reason)(test) if reason is not None else test

    return mark


# --- OpInfo ops ---------------------------------------------------------------------------

_RANDOM = "random: checked statistically elsewhere"

SKIP: dict[str, str] = {
    # samples draw random numbers: the CPU and pjrt generators differ by design
    "bernoulli": _RANDOM,
    "cauchy": _RANDOM,
    "exponential": _RANDOM,
    "geometric": _RANDOM,
    "log_normal": _RANDOM,
    "multinomial": _RANDOM,
    "normal": _RANDOM,
    "normal.in_place": _RANDOM,
    "normal.number_mean": _RANDOM,
    "rand_like": _RANDOM,
    "randint": _RANDOM,
    "randint_like": _RANDOM,
    "randn": _RANDOM,
    "randn_like": _RANDOM,
    "uniform": _RANDOM,
    "nn.functional.alpha_dropout": _RANDOM,
    "nn.functional.dropout": _RANDOM,
    "nn.functional.dropout2d": _RANDOM,
    "nn.functional.dropout3d": _RANDOM,
    "nn.functional.feature_alpha_dropout.with_train": _RANDOM,
}

_UNINITIALISED = "CPU result is uninitialised memory: shape, dtype and device compared only"

SHAPE_ONLY: dict[str, str] = {
    "empty": _UNINITIALISED,
    "empty_like": _UNINITIALISED,
    "empty_permuted": _UNINITIALISED,
    "empty_strided": _UNINITIALISED,
    "new_empty": _UNINITIALISED,
    "new_empty_strided": _UNINITIALISED,
}

# In-place and out= variants (tests/test_variants.py) known to differ from the CPU in
# both modes, and why. Hand-kept.
XFAIL_VARIANTS: dict[str, str] = {
    "addbmm": "in place, the CPU resizes a [1] self to the [5, 10] result (addbmm_ skips "
    "the broadcast check other in-place ops make); pjrt refuses, as it does for any op",
    "nansum": "an int64 out= computes in int64 (as PyTorch's nansum does); the CPU has no "
    "integer kernel and raises NotImplementedError: \"nansum_cpu\" not implemented for 'Long'",
    "nanmean": "an int64 out=: pjrt raises RuntimeError (result type Float can't be cast), "
    "the CPU NotImplementedError (\"nansum_cpu\" not implemented for 'Long')",
    "eye": "no lowering: aten.eye.out and aten.eye.m_out (factories' out= forms are not "
    "derived from their functional lowerings)",
    "linalg.eigvals": "no lowering: aten.linalg_eigvals.out",
    "hash_tensor": "no lowering: aten.hash_tensor.out (as in XFAIL)",
    "linalg.eigh": "out=[1]: eigenvectors differ from the CPU's (as in XFAIL)",
    "nn.functional.rrelu": "random: training=True draws slopes, differently on CPU and pjrt",
}

# ... in one execution mode only (the modes should agree: each entry is a bug). Hand-kept.
XFAIL_VARIANTS_EAGER: dict[str, str] = {}
XFAIL_VARIANTS_FUSED: dict[str, str] = {}

# Gradient tolerances wider than the op's own, where the CPU's float32 gradient is itself
# that far from the exact one (measured against the CPU's float64 gradient). Hand-kept.
GRAD_TOLERANCES: dict[str, tuple[dict, str]] = {
    "logcumsumexp": (
        {"atol": 1e-2, "rtol": 2e-3},
        "inputs of 1e4: the backward formula subtracts numbers that large in float32 "
        "(ulp 1e-3); the CPU's float32 gradient is 2.8e-3 from its float64 one",
    ),
    "nn.functional.ctc_loss": (
        {"atol": 2e-4, "rtol": 2e-4},
        "the CPU's float32 alpha-beta gradient is 9.4e-5 from its float64 one; pjrt's "
        "(the vjp of its forward) is 8.9e-6 from it",
    ),
    "matrix_exp": (
        {"atol": 1e-5, "rtol": 2e-4},
        "sample 0 (5x5, gradients up to 542): measured 2026-12-02 on a machine where the "
        "default tolerance failed, pjrt's float32 gradient is 8.7e-3 from the float64 one "
        "(CPU's float32: 9.1e-4), at most 7.7e-5 relative to CPU's; forward equal",
    ),
}

# --- BEGIN GENERATED (scripts/op_coverage.py --write-expectations) ---
# fmt: off
XFAIL: dict[str, str] = {
    'sparse.sampled_addmm': "NotImplementedError: Could not run 'aten::sparse_sampled_addmm' with arguments from the 'SparseCs...",
    'sparse.mm.reduce': "NotImplementedError: Could not run 'aten::_sparse_mm_reduce_impl' with arguments from the 'Sparse...",
    'nn.functional.fractional_max_pool3d': 'AssertionError: output: Tensor-likes are not close!',
    'nn.functional.rrelu': 'AssertionError: output: Tensor-likes are not close!',
    'nn.functional.scaled_dot_product_attention': 'AssertionError: output: Tensor-likes are not close!',
    'tensor_split': "RuntimeError: tensor_split expected tensor_indices_or_sections to be on cpu, but it's on pjrt:0",
    'svd_lowrank': 'AssertionError: output[0]: Tensor-likes are not close!',
    'pca_lowrank': 'AssertionError: output[0]: Tensor-likes are not close!',
    'chalf': "TypeError: dtype torch.complex32 is not supported on pjrt devices (platform 'cpu'); supported: fl...",
    'to_sparse': 'no lowering: aten._to_sparse.default',
    'nn.functional.multi_head_attention_forward': 'AssertionError: output[0]: Tensor-likes are not close!',
    'hash_tensor': 'no lowering: aten.hash_tensor.out',
    'linalg.eigh': 'AssertionError: output[1]: Tensor-likes are not close!',
}

XFAIL_EXHAUSTIVE: dict[str, str] = {
    'nn.functional.fractional_max_pool2d': 'sample 7: AssertionError: output: Tensor-likes are not close!',
    'svd': 'sample 40: AssertionError: output[0]: Tensor-likes are not close!',
    'linalg.svd': 'sample 40: AssertionError: output[0]: Tensor-likes are not close!',
}

XFAIL_EAGER: dict[str, str] = {}

XFAIL_FUSED: dict[str, str] = {}

XFAIL_GRAD: dict[str, str] = {
    'sparse.sampled_addmm': "NotImplementedError: Could not run 'aten::sparse_sampled_addmm' with arguments from the 'SparseCs...",
    'sparse.mm.reduce': "NotImplementedError: Could not run 'aten::_sparse_mm_reduce_impl' with arguments from the 'Sparse...",
    'nn.functional.fractional_max_pool3d': 'AssertionError: gradient 0: Tensor-likes are not close!',
    'nn.functional.rrelu': 'AssertionError: gradient 0: Tensor-likes are not close!',
    'tensor_split': "RuntimeError: tensor_split expected tensor_indices_or_sections to be on cpu, but it's on pjrt:0",
    'chalf': "TypeError: dtype torch.complex32 is not supported on pjrt devices (platform 'cpu'); supported: fl...",
    'to_sparse': 'no lowering: aten._to_sparse.default',
    'nn.functional.multi_head_attention_forward': 'AssertionError: gradient 2: Tensor-likes are not close!',
}

XFAIL_GRAD_EXHAUSTIVE: dict[str, str] = {
    'addcdiv': 'sample 5: AssertionError: gradient 2: Tensor-likes are not close!',
    'nn.functional.fractional_max_pool2d': 'sample 7: AssertionError: gradient 0: Tensor-likes are not close!',
    'nn.functional.scaled_dot_product_attention': 'sample 2: AssertionError: gradient 0: Tensor-likes are not close!',
    'pow': 'sample 6: AssertionError: gradient 1: Tensor-likes are not close!',
    'triangular_solve': 'sample 5: AssertionError: gradient 1: Tensor-likes are not close!',
    'svd': 'sample 64: AssertionError: gradient 0: Tensor-likes are not close!',
    'svd_lowrank': 'sample 14: AssertionError: gradient 0: Tensor-likes are not close!',
    'logdet': 'sample 2: AssertionError: gradient 0: Tensor-likes are not close!',
    'nn.functional.grid_sample': 'sample 14: AssertionError: gradient 1: Tensor-likes are not close!',
    'grid_sampler_2d': 'sample 12: AssertionError: gradient 1: Tensor-likes are not close!',
    'linalg.det': 'sample 2: AssertionError: gradient 0: Tensor-likes are not close!',
    'linalg.eigh': 'sample 4: AssertionError: gradient 0: Tensor-likes are not close!',
    'linalg.householder_product': 'sample 2: AssertionError: gradient 0: Tensor-likes are not close!',
    'linalg.lstsq': 'sample 2: AssertionError: gradient 0: Tensor-likes are not close!',
    'linalg.lstsq.grad_oriented': 'sample 2: AssertionError: gradient 0: Tensor-likes are not close!',
    'linalg.slogdet': 'sample 2: AssertionError: gradient 0: Tensor-likes are not close!',
    'linalg.svd': 'sample 64: AssertionError: gradient 0: Tensor-likes are not close!',
}

XFAIL_GRAD_EAGER: dict[str, str] = {}

XFAIL_GRAD_FUSED: dict[str, str] = {}
# fmt: on
# --- END GENERATED ---

# complex64 runs of ops tested in another dtype (test_op_complex, the first 3 samples).
# Hand-kept.
XFAIL_COMPLEX: dict[str, str] = {
    "chalf": "complex32 is not a pjrt dtype (TypeError naming the supported ones)",
    "linalg.cond": "a condition number of 60 from complex64 singular values: relative "
    "difference 2.3e-6 against the float32 default tolerance of 1.3e-6",
    "linalg.eigh": "eigenvectors differ from the CPU's by a phase (as in XFAIL)",
    "pca_lowrank": "random projections (as in XFAIL)",
    "svd_lowrank": "random projections (as in XFAIL)",
    "sparse.sampled_addmm": "sparse CSR tensors have no pjrt kernels (as in XFAIL)",
    "to_sparse": "no lowering: aten._to_sparse.default (as in XFAIL)",
    "tensor_split": "the sample's index tensor is moved to pjrt, where PyTorch wants it on "
    "the CPU (as in XFAIL)",
}

_OP_TABLES = {
    # test: (both modes, {mode: that mode only}, later samples only)
    "test_op": (XFAIL, {"eager": XFAIL_EAGER, "fused": XFAIL_FUSED}, XFAIL_EXHAUSTIVE),
    "test_grad": (
        XFAIL_GRAD,
        {"eager": XFAIL_GRAD_EAGER, "fused": XFAIL_GRAD_FUSED},
        XFAIL_GRAD_EXHAUSTIVE,
    ),
    "test_variants": (
        XFAIL_VARIANTS,
        {"eager": XFAIL_VARIANTS_EAGER, "fused": XFAIL_VARIANTS_FUSED},
        {},
    ),
}


def op_failure(test: str, key: str, mode: str, exhaustive: bool = False) -> str | None:
    """Why ``test`` (``"test_op"``, ``"test_grad"`` or ``"test_variants"``) of op ``key``
    is expected to fail in execution mode ``mode``, on its first samples or, with
    ``exhaustive``, on all of them; None when it is expected to pass."""
    both, one_mode, later = _OP_TABLES[test]
    reason = both.get(key, one_mode[mode].get(key))
    if reason is None and exhaustive:
        reason = later.get(key)
    return reason


# --- OpInfo error inputs (tests/test_error_inputs.py) --------------------------------------

XFAIL_ERROR_INPUTS: dict[str, str] = {}

ERROR_MESSAGES: dict[str, str] = {}

# --- core ATen (tests/test_core_aten.py) --------------------------------------------------

# test_example_matches_cpu: ``str(overload)`` -> reason. (Its OpInfo test takes XFAIL and
# XFAIL_FUSED, through op_failure.)
XFAIL_CORE_EXAMPLES: dict[str, str] = {}

# --- Hugging Face (tests/test_hf_families.py, test_hf_generate.py, test_hf_integration.py)

# tests/test_hf_families.py: family -> reason
XFAIL_HF_FAMILIES: dict[str, str] = {}

# tests/test_hf_generate.py: greedy case id ("<family>-<cache>-<mode>") -> reason
XFAIL_HF_GENERATE: dict[str, str] = {}

# tests/test_hf_integration.py: test function name -> reason
XFAIL_HF_INTEGRATION: dict[str, str] = {}

# --- distributed (tests/test_distributed.py) ----------------------------------------------

# test function name -> reason
# tests/test_backend_contract.py: points of PyTorch's PrivateUse1 contract that do not
# hold yet, by the test that checks each (its CONTRACT table)
XFAIL_BACKEND_CONTRACT: dict[str, str] = {}

# tests/test_errors.py's numbers that must fit their dtype, compiled
XFAIL_COMPILED_NUMBERS: dict[str, str] = {
    "fill_diagonal_": (
        "Dynamo refuses the write through fill_diagonal_'s as_strided view before any "
        "backend runs (CPU inductor too): 'encountered a mutation on a view chain'"
    ),
    "foreach lerp_ weight": (
        "AOT autograd decomposes _foreach_lerp_ into arithmetic before the backend sees "
        "the weight: the graph multiplies by 1e40 and gives NaN, as CPU inductor does; "
        "CPU eager refuses the number"
    ),
}

XFAIL_DISTRIBUTED: dict[str, str] = {
    "test_fsdp2_x_tp_four_processes_compiled": (
        "PyTorch 2.13: FSDP2 x TP under torch.compile fails with 'Mixing fake modes NYI' in "
        "AOTAutograd's metadata pass (the embedding's DTensor); the same worker fails the "
        "same way on the CPU with gloo and backend='aot_eager', so it is not pjrt's"
    ),
}

XFAIL_TORCHTITAN: dict[str, str] = {
    "test_torch_compile_with_fsdp_x_tp_on_pjrt_equals_the_cpu": (
        "TorchTitan 0.2.2 compiling its blocks with FSDP 2 x TP 2: it trains, but the "
        "gradients differ from step 1 (grad norm 0.8673 against 0.8688; losses from step 2, "
        "8.01276 against 8.01154). The same with backend='aot_eager' (PyTorch's AOTAutograd, "
        "pjrt's compiler not involved) and with the loss uncompiled; exact with "
        "backend='eager' (Dynamo without AOTAutograd). PyTorch 2.13's: blocks with "
        "sequence-parallel DTensor inputs and outputs compiled one by one fail in AOTAutograd "
        "on the CPU with gloo too (TorchTitan's: 'expected all tensors_saved_with_vc_check "
        "to be Tensors'; a 2-process model of an embedding, two such blocks and a head, "
        "with aot_eager: the backward hands DTensor's redistribute a plain gradient, "
        "\"'Tensor' object has no attribute '_local_tensor'\", as on pjrt)"
    ),
}

# --- skips --------------------------------------------------------------------------------

# Besides SKIP (random ops), the tests skip only where there is nothing to compare or too
# few devices, with these reasons:

# an OpInfo op with none of the dtypes the tests compare in (tests/test_ops.py TEST_DTYPES):
# the float8-only _scaled_mm, and ops with no CPU kernel at all (flash attention)
SKIP_NO_DTYPE = "no CPU dtype to compare against"
# an OpInfo op whose samples all raise on the CPU (the CUDA-only jiterator ops): no reference
SKIP_CPU_REFUSES = "every one of the {total} samples raises on the CPU"
# an OpInfo op whose error inputs the CPU accepts (PyTorch's own test_errors expects them to
# fail there: a Python number where the op also takes one)
SKIP_CPU_ACCEPTS = "the CPU accepts every one of the {total} error inputs"
SKIP_NO_ERROR_INPUTS = "the OpInfo entry makes no error inputs for the CPU"
# likewise nothing to compare: no samples, no gradient or no variant the CPU computes
SKIP_NO_SAMPLES = "the OpInfo entry has no samples"
SKIP_NO_GRADIENT = "none of the {total} samples has a gradient the CPU computes"
SKIP_NO_VARIANT = "the CPU refuses every sample's in-place and out= forms"
# tests/conftest.py, ``devices(n)`` marker, the one hardware skip: a test platform
# (TORCH_PJRT_TEST_PLATFORM) with fewer devices than the test needs. Never on the CPU,
# which always has 2 (a CPU run with fewer fails instead)
SKIP_TOO_FEW_DEVICES = "needs {wanted} pjrt devices; the {platform} platform has {have}"
# tests/test_executor.py: the count of the process's memory mappings is read from Linux's
# /proc (the mappings limit it guards against is Linux's)
SKIP_NO_PROC_MAPS = "no /proc/self/maps: not Linux"
