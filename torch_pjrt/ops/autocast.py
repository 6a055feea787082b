"""``torch.autocast(device_type="pjrt")``: PyTorch's autocast op lists on the pjrt device.

PyTorch registers its autocast kernels for CUDA, the CPU, XPU and MPS in C++; a
PrivateUse1 backend gets none, so every op would run in the dtype it was given. These
kernels sit on the ``AutocastPrivateUse1`` key and follow the CUDA lists (the ones
``torch.amp``'s documentation gives), op by op:

- ``LOWER``: run in the autocast dtype (matrix products, convolutions, attention);
- ``FP32``: run in float32 (exp, log, pow, norms, losses, upsampling, ...);
- ``FP32_DTYPE``: reductions whose ``dtype=`` argument is set to float32 when not given;
- ``FP32_NORM``: ``norm`` overloads redispatched to their ``dtype=float32`` form;
- ``PROMOTE``: run in the widest floating dtype among the inputs;
- ``BANNED``: refused, with the safe alternative named.

As in PyTorch, only floating-point pjrt tensors are cast, float64 never is, and the
autocast keys are excluded while the op runs, so the ops it decomposes into are not
cast again. Unlike PyTorch's C++ kernels there is no cast cache for weights: each op
casts its inputs (one small device program per cast, or nothing in fused and compiled
programs, where XLA folds the casts into the graph).
"""

from __future__ import annotations

import torch

aten = torch.ops.aten

__all__ = ["LOWER", "FP32", "FP32_DTYPE", "PROMOTE", "BANNED", "install", "policy"]

LOWER = (
    "_convolution.deprecated _convolution conv1d conv2d conv3d conv_tbc conv_transpose1d "
    "conv_transpose2d.input conv_transpose3d.input convolution prelu addmm addmv addr matmul "
    "einsum mm mv linalg_vecdot linear addbmm baddbmm bmm chain_matmul linalg_multi_dot "
    "_thnn_fused_lstm_cell _thnn_fused_gru_cell lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell "
    "_scaled_dot_product_flash_attention scaled_dot_product_attention"
).split()
FP32 = (
    "acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan "
    "pow.Tensor_Scalar pow.Tensor_Tensor pow.Scalar softplus layer_norm native_layer_norm "
    "rms_norm group_norm frobenius_norm.dim nuclear_norm nuclear_norm.dim cosine_similarity "
    "poisson_nll_loss cosine_embedding_loss nll_loss nll_loss2d hinge_embedding_loss kl_div "
    "l1_loss smooth_l1_loss huber_loss mse_loss margin_ranking_loss multilabel_margin_loss "
    "soft_margin_loss triplet_margin_loss multi_margin_loss binary_cross_entropy_with_logits "
    "dist pdist cdist renorm logsumexp upsample_nearest1d _upsample_nearest_exact1d "
    "upsample_nearest2d _upsample_nearest_exact2d upsample_nearest3d _upsample_nearest_exact3d "
    "upsample_linear1d upsample_bilinear2d _upsample_bilinear2d_aa upsample_trilinear3d "
    "upsample_bicubic2d _upsample_bicubic2d_aa"
).split()
FP32_DTYPE = (
    "prod prod.dim_int softmax.int log_softmax.int cumprod cumsum linalg_vector_norm "
    "linalg_matrix_norm linalg_matrix_norm.str_ord sum sum.dim_IntList"
).split()
# norm overload -> its overload taking dtype=
FP32_NORM = {"norm.Scalar": "ScalarOpt_dtype", "norm.ScalarOpt_dim": "ScalarOpt_dim_dtype"}
PROMOTE = (
    "addcdiv addcmul atan2 bilinear cross dot vdot grid_sampler index_put tensordot scatter_add"
).split()
BANNED = ["binary_cross_entropy"]

_BANNED_MESSAGE = (
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast: "
    "the log of a probability rounded to {dtype} loses the small values that matter.\n"
    "Models usually apply a sigmoid right before this loss; fuse the two with "
    "torch.nn.functional.binary_cross_entropy_with_logits or torch.nn.BCEWithLogitsLoss, "
    "which autocast runs in float32. To keep binary_cross_entropy, run it outside the "
    "autocast region (or in a torch.autocast(..., enabled=False) block) on float32 inputs."
)

_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)


def _overload(name: str) -> torch._ops.OpOverload:
    base, _, overload = name.partition(".")
    return getattr(getattr(aten, base), overload or "default")


def _eligible(x) -> bool:
    """A tensor autocast may cast: floating point, on pjrt, not float64."""
    return (
        isinstance(x, torch.Tensor)
        and x.device.type == "pjrt"
        and x.is_floating_point()
        and x.dtype != torch.float64
    )


def _cast(x, dtype):
    if _eligible(x):
        return x if x.dtype == dtype else x.to(dtype)
    if isinstance(x, (list, tuple)):
        return type(x)(_cast(v, dtype) for v in x)
    return x


def _first_tensor(args, kwargs):
    for x in (*args, *kwargs.values()):
        if isinstance(x, torch.Tensor):
            return x
    return None


def _flat(args, kwargs):
    for x in (*args, *kwargs.values()):
        if isinstance(x, (list, tuple)):
            yield from x
        else:
            yield x


def _casting(op, target):
    """A kernel casting every eligible tensor argument to ``target(args, kwargs)``."""

    def kernel(*args, **kwargs):
        dtype = target(args, kwargs)
        with torch._C._ExcludeDispatchKeyGuard(_KEYS):
            args = [_cast(a, dtype) for a in args]
            kwargs = {k: _cast(v, dtype) for k, v in kwargs.items()}
            return op(*args, **kwargs)

    return kernel


def _lower(args, kwargs):
    return torch.get_autocast_dtype("pjrt")


def _fp32(args, kwargs):
    return torch.float32


def _widest(args, kwargs):
    """float32 when any eligible argument is float32 (or wider), else the autocast dtype."""
    low = torch.get_autocast_dtype("pjrt")
    for x in _flat(args, kwargs):
        if _eligible(x) and x.dtype != low:
            return torch.float32
    return low


def _with_fp32_dtype(op):
    """A reduction given ``dtype=float32`` when its input is eligible and no dtype is set."""
    position = [a.name for a in op._schema.arguments].index("dtype")

    def kernel(*args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(_KEYS):
            if _eligible(_first_tensor(args, kwargs)):
                if len(args) > position:
                    if args[position] is None:
                        args = (*args[:position], torch.float32, *args[position + 1 :])
                elif kwargs.get("dtype") is None:
                    kwargs = {**kwargs, "dtype": torch.float32}
            return op(*args, **kwargs)

    return kernel


def _norm_fp32(op, with_dtype):
    def kernel(*args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(_KEYS):
            if _eligible(_first_tensor(args, kwargs)):
                return with_dtype(*args, **kwargs, dtype=torch.float32)
            return op(*args, **kwargs)

    return kernel


def _banned(op):
    def kernel(*args, **kwargs):
        raise RuntimeError(_BANNED_MESSAGE.format(dtype=torch.get_autocast_dtype("pjrt")))

    return kernel


def policy() -> dict[torch._ops.OpOverload, str]:
    """Each autocast op and its policy name (``lower``, ``fp32``, ``fp32_dtype``,
    ``fp32_norm``, ``promote``, ``banned``)."""
    found = {}
    for names, kind in (
        (LOWER, "lower"),
        (FP32, "fp32"),
        (FP32_DTYPE, "fp32_dtype"),
        (list(FP32_NORM), "fp32_norm"),
        (PROMOTE, "promote"),
        (BANNED, "banned"),
    ):
        for name in names:
            found[_overload(name)] = kind
    return found


def _kernel(op, kind):
    if kind == "lower":
        return _casting(op, _lower)
    if kind == "fp32":
        return _casting(op, _fp32)
    if kind == "promote":
        return _casting(op, _widest)
    if kind == "fp32_dtype":
        return _with_fp32_dtype(op)
    if kind == "fp32_norm":
        return _norm_fp32(op, getattr(aten.norm, FP32_NORM[f"norm.{op._overloadname}"]))
    return _banned(op)


def install(lib: torch.library.Library, fallback: torch.library.Library) -> None:
    """Register the autocast kernels on ``AutocastPrivateUse1`` in ``lib`` (aten IMPL),
    and a fallthrough for every other op in ``fallback`` (the ``_`` IMPL library)."""
    fallback.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    for op, kind in policy().items():
        name = op._schema.name.split("::")[1]
        if op._overloadname != "default":
            name += "." + op._overloadname
        lib.impl(name, _kernel(op, kind), "AutocastPrivateUse1")
