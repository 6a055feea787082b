# ruff: noqa: E501  (a table of prose: its strings keep their own line lengths)
"""The entries of the error glossary (``glossary.py``), by where the errors are raised."""

from torch_pjrt.diagnostics.glossary import Entry

_BOOL_OPS = r"(?:clamp_min_scalar|hardtanh|div_\w+|remainder|fmod|abs)"
_BITWISE_OPS = r"(?:lshift|rshift|bitwise_not)"
_FLOAT_ONLY_OPS = r"(?:frac|round)"

ENTRIES = (
    # === ops/: the lowerings =================================================
    # --- dtype refusals in CPU PyTorch's words ("<op>_cpu" not implemented for '<dtype>')
    Entry(
        "ops-bool-input-not-implemented",
        rf"\"{_BOOL_OPS}_cpu\" not implemented for '\w+'",
        meaning="The op has no implementation for bool tensors: relu, hardtanh, abs, "
        "remainder, fmod, floor_divide and div with a rounding_mode refuse a bool input, "
        "as CPU PyTorch does.",
        cause="A mask or comparison result (dtype torch.bool) was passed to an arithmetic "
        "op, e.g. torch.relu(mask), mask.abs(), mask // 2 or torch.remainder(mask, 2).",
        fix="Convert the mask to a number type first (mask.to(torch.int64) or "
        "mask.float()), or use logical ops (&, |, ^, ~) if you meant boolean logic.",
        doc="docs/semantics.md#dtypes",
    ),
    Entry(
        "ops-bitwise-op-non-integer",
        rf"\"{_BITWISE_OPS}_cpu\" not implemented for '\w+'",
        meaning="A bitwise op was given a dtype it does not support: shifts (<<, >>, "
        "bitwise_left_shift, bitwise_right_shift) need integer tensors, and bitwise_not "
        "(~) refuses floating-point and complex tensors.",
        cause="A shift was applied to a float or bool tensor, or ~ was applied to a float "
        "tensor (often a mask that was turned into floats earlier).",
        fix="Cast to an integer dtype before shifting (x.to(torch.int32) << 2); for a float "
        "mask use 1 - m or (m == 0), or keep the mask as torch.bool and use ~.",
        doc="docs/semantics.md#dtypes",
    ),
    Entry(
        "ops-float-only-op-on-integer",
        rf"\"{_FLOAT_ONLY_OPS}_cpu\" not implemented for '\w+'",
        meaning="frac() only works on floating-point tensors, and round(decimals=n) with "
        "n != 0 is not implemented for integer or bool tensors, as in CPU PyTorch.",
        cause="torch.frac or torch.round(x, decimals=...) was called on an integer or bool tensor.",
        fix="Convert the tensor to a floating dtype first (x.float().frac(), "
        "x.double().round(decimals=2)); an integer tensor has no fractional part anyway.",
        doc="docs/semantics.md#dtypes",
    ),
    Entry(
        "ops-dtype-without-kernel",
        r"\"\w+\" not implemented for '\w+'",
        meaning="CPU PyTorch has no kernel of this op for this dtype, and pjrt refuses the "
        "call with the CPU's message rather than compute a value the CPU would not give: "
        "integer or bool tensors given to floating-point ops (softmax, log_softmax, hypot, "
        "logaddexp, logcumsumexp, histc, bincount's float input the other way round), bool "
        "tensors given to matrix products, trace, median, kthvalue, gcd, ceil, floor or round.",
        cause="A tensor of an integer or bool dtype (a mask, token ids, a count) reached an "
        "op that needs another dtype, often after a comparison or an .long() earlier on.",
        fix="Convert first: x.float() (or softmax(x, dim, dtype=torch.float32)) for "
        "floating-point ops, x.to(torch.int64) for a bool input to arithmetic or matrix "
        "products, x.long() for bincount's values.",
        doc="docs/semantics.md#dtypes",
    ),
    # --- bool arithmetic ----------------------------------------------------------------
    Entry(
        "ops-bool-subtraction",
        r"Subtraction, the `-` operator, with two bool tensors is not supported",
        meaning="Subtracting one bool tensor from another is not defined in PyTorch, and "
        "pjrt refuses it the same way.",
        cause="a - b where both a and b are bool tensors (masks), usually meant as "
        "'in a but not in b' or as an exclusive or.",
        fix="Use a ^ b (or torch.logical_xor) for exclusive or, a & ~b for set difference, "
        "or convert to integers first if you want numbers.",
        doc="docs/semantics.md#dtypes",
    ),
    Entry(
        "ops-bool-negation",
        r"Negation, the `-` operator, on a bool tensor is not supported",
        meaning="Unary minus (-x or torch.neg) is not defined for bool tensors.",
        cause="A mask was negated with -mask to invert it.",
        fix="Invert a mask with ~mask or torch.logical_not(mask); convert to a number "
        "type first if you really need -1/0 values.",
        doc="docs/semantics.md#dtypes",
    ),
    Entry(
        "ops-addcdiv-integer",
        r"Integer division with addcdiv is no longer supported",
        meaning="torch.addcdiv was called with integer (or bool) tensors; PyTorch no longer "
        "defines integer division for it, and pjrt refuses it too.",
        cause="input, tensor1 and tensor2 of addcdiv all have integer dtypes, so the "
        "promoted computation type is not floating point.",
        fix="Pass floating-point tensors (cast with .float()), or write the division "
        "explicitly: (input + value * torch.trunc(t1 / t2)).to(input.dtype) for the old "
        "integer behavior.",
        doc="docs/semantics.md#dtypes",
    ),
    # --- the NaN checker ----------------------------------------------------------------
    Entry(
        "ops-check-nan-produced",
        r"produced \S+ in its output .*?\(its inputs had none\)",
        meaning="With the NaN checker on, an op produced a NaN or an infinity that none of "
        "its inputs had; the error names the op, which output, and the line of your code "
        "that called it.",
        cause="TORCH_PJRT_CHECK_NAN=1 (or config(check_nan=True)) is set, and an op such as "
        "log, div, sqrt or exp got values outside its safe range (log of 0, 0/0, overflow "
        "in a low-precision dtype).",
        fix="Fix the numerics at the reported op (clamp its input, add an epsilon, compute "
        "in float32); unset TORCH_PJRT_CHECK_NAN once done, since it runs every op "
        "synchronously.",
        doc="docs/modes.md#debug-and-the-checkers",
    ),
    # --- clamp --------------------------------------------------------------------------
    Entry(
        "ops-clamp-no-bounds",
        r"torch\.clamp: At least one of 'min' or 'max' must not be None",
        meaning="torch.clamp was called with neither a lower nor an upper bound.",
        cause="Both min and max were None, often because both came from optional "
        "settings that were left unset.",
        fix="Pass at least one of min= or max=, or skip the clamp when both are None.",
        doc="docs/semantics.md#argument-checks",
    ),
    # --- arange -------------------------------------------------------------------------
    Entry(
        "ops-arange-zero-step",
        r"step must be nonzero",
        meaning="torch.arange (or range) was asked for a step of zero, which would never "
        "reach the end.",
        cause="step=0 was passed, or a fractional step smaller than 1 (e.g. 0.5) was "
        "given with dtype=torch.int64, where it truncates to 0.",
        fix="Pass a nonzero step; for fractional steps use a floating dtype (or "
        "torch.linspace) instead of an integer one.",
        doc="docs/semantics.md#argument-checks",
    ),
    Entry(
        "ops-arange-non-finite",
        r"unsupported range: .*? -> ",
        meaning="torch.arange got a start or end that is infinite or NaN, so its length "
        "cannot be computed.",
        cause="A bound computed from data (e.g. a max over an empty or NaN-filled tensor, "
        "or a float('inf') sentinel) was passed to arange.",
        fix="Make sure start and end are finite numbers before calling torch.arange.",
        doc="docs/semantics.md#argument-checks",
    ),
    Entry(
        "ops-arange-step-sign",
        r"upper bound and lower bound inconsistent with step sign",
        meaning="torch.arange's step points away from its end: a positive step with "
        "end < start, or a negative step with end > start.",
        cause="The start and end arguments are swapped, or the sign of step is wrong "
        "(e.g. counting down with a positive step).",
        fix="Swap start and end, or flip the sign of step (torch.arange(10, 0, -1) counts down).",
        doc="docs/semantics.md#argument-checks",
    ),
    Entry(
        "ops-arange-symbolic-step",
        r"over a symbolic dimension is lowered for a positive integer step only",
        meaning="In a program exported with symbolic (dynamic) dimensions, torch_pjrt can "
        "only build an arange whose bounds depend on a symbolic size when the step is a "
        "positive integer.",
        cause="An exported model (torch.export with torch.export.Dim) calls arange with a "
        "symbolic start or end and a float, negative or symbolic step.",
        fix="Rewrite the arange to use a positive integer step (e.g. arange(n).flip(0) "
        "instead of arange(n - 1, -1, -1), or arange(n) * 0.5 for a float step), or export "
        "that dimension as static.",
        doc="docs/export.md#stablehlo",
    ),
    # --- one_hot ------------------------------------------------------------------------
    Entry(
        "ops-one-hot-not-long",
        r"one_hot is only applicable to index tensor of type LongTensor",
        meaning="F.one_hot needs an int64 (torch.long) tensor of class indices.",
        cause="The labels tensor is int32, uint8, bool or floating point, e.g. loaded "
        "from numpy or produced by a comparison.",
        fix="Convert the labels first: F.one_hot(labels.long(), num_classes).",
        doc="docs/semantics.md#argument-checks",
    ),
    Entry(
        "ops-one-hot-empty",
        r"Can not infer total number of classes from empty tensor",
        meaning="F.one_hot was given an empty tensor without a positive num_classes, so "
        "it cannot tell how many classes there are.",
        cause="num_classes was left at its default (-1) and the batch of labels was empty "
        "(e.g. the last, empty batch of a filtered dataset).",
        fix="Pass num_classes explicitly, or skip empty batches.",
        doc="docs/semantics.md#argument-checks",
    ),
    # --- linear algebra -----------------------------------------------------------------
    Entry(
        "ops-lu-without-pivoting",
        r"linalg\.lu(?:_factor)?: LU without pivoting is not implemented",
        meaning="torch.linalg.lu and torch.linalg.lu_factor support only partial pivoting "
        "on pjrt, matching CPU PyTorch, which refuses pivot=False too.",
        cause="pivot=False was passed to linalg.lu, linalg.lu_factor or "
        "linalg.lu_factor_ex (code written for CUDA, where unpivoted LU exists).",
        fix="Call it with pivot=True (the default) and use the returned permutation (linalg.lu) "
        "or pivots (linalg.lu_factor, which torch.linalg.lu_solve accepts).",
        doc="docs/op_coverage.md",
    ),
    Entry(
        "ops-householder-product-shapes",
        r"householder_product: input\.shape\[-[12]\] must be greater than or equal to",
        meaning="torch.linalg.householder_product needs a tall matrix (rows >= columns) "
        "and no more Householder scalars in tau than the matrix has columns.",
        cause="The reflectors matrix is wide, or tau has more entries than input has "
        "columns, often because the output of geqrf was transposed or sliced.",
        fix="Pass the (m, n) matrix with m >= n and a tau of length <= n, as returned by "
        "torch.geqrf.",
        doc="docs/op_coverage.md",
    ),
    Entry(
        "ops-lstsq-bad-driver",
        r"linalg\.lstsq: parameter `driver` should be one of",
        meaning="torch.linalg.lstsq was given a driver name it does not know.",
        cause="A misspelt driver, or a driver name from another library (e.g. 'gelsx' or "
        "a SciPy/NumPy option).",
        fix="Pass driver= as one of 'gels', 'gelsy', 'gelsd', 'gelss', or leave it as None "
        "(gelsy).",
        doc="docs/semantics.md#argument-checks",
    ),
    Entry(
        "ops-matmul-dtype-mismatch",
        r", but got: (?:torch\.)?\w+ != (?:torch\.)?\w+",
        meaning="A matrix or vector product (mm, bmm, addmm, dot, vdot) got two operands "
        "of different dtypes; these ops do not promote types.",
        cause="One operand is float32 and the other float16/bfloat16/float64, e.g. a "
        "half-precision model fed float32 inputs outside autocast, or a float64 tensor "
        "made from numpy.",
        fix="Cast both operands to the same dtype (b.to(a.dtype)), or run the region under "
        "torch.autocast(device_type='pjrt').",
        doc="docs/precision.md",
    ),
    # --- bincount -----------------------------------------------------------------------
    Entry(
        "ops-bincount-bad-input",
        r"bincount only supports 1-d non-negative integral inputs",
        meaning="torch.bincount needs a 1-D tensor of non-negative integers; the input "
        "was multi-dimensional, floating point or complex, or contained a negative value.",
        cause="Labels with an extra dimension (e.g. shape [N, 1]), float labels, or a "
        "negative value such as an ignore index of -1 or -100.",
        fix="Flatten and convert the input (x.flatten().long()) and remove negative "
        "values (x[x >= 0]) before calling bincount.",
        doc="docs/semantics.md#values-checked-on-the-device",
    ),
    Entry(
        "ops-bincount-weights-shape",
        r"weights should be 1-d and have the same length as input",
        meaning="torch.bincount's weights must be a 1-D tensor with one weight per input element.",
        cause="The weights tensor has a different length from the input, or an extra dimension.",
        fix="Pass weights of shape [len(input)] (flatten them, and make sure they were "
        "filtered the same way as the input).",
        doc="docs/semantics.md#argument-checks",
    ),
    Entry(
        "ops-bincount-negative-minlength",
        r"minlength should be >= 0",
        meaning="torch.bincount's minlength, the minimum number of bins, was negative.",
        cause="minlength was computed from something that can be negative, or -1 was "
        "passed meaning 'no minimum'.",
        fix="Pass minlength=0 (the default) or a positive number of bins.",
        doc="docs/semantics.md#argument-checks",
    ),
    # --- out= tensors -------------------------------------------------------------------
    Entry(
        "ops-out-wrong-exact-dtype",
        r"nonzero: Expected out tensor to have scalar type Long but got scalar type"
        r"|masked_select\(\): self and result must have the same scalar type",
        meaning="The out= tensor has the wrong dtype for an op that needs an exact one: "
        "nonzero writes int64 indices, masked_select writes elements of the input's dtype.",
        cause="An out= buffer was preallocated with another dtype (e.g. int32 for "
        "nonzero, or float32 for masked_select of a float64 tensor).",
        fix="Allocate out with the right dtype (torch.long for nonzero, x.dtype for "
        "masked_select), or drop out= and use the returned tensor.",
        doc="docs/semantics.md#argument-checks",
    ),
    Entry(
        "ops-out-cannot-cast",
        r"can't be cast to the desired output type",
        meaning="The op's result type cannot be safely cast to the dtype of the out= "
        "tensor (or of the tensor an in-place op writes into), e.g. a float result into "
        "an integer tensor.",
        cause="An in-place op such as int_tensor.add_(0.5) or int_tensor.mul_(float_tensor), "
        "or torch.cat/an op with out= of a lower kind of dtype than its inputs.",
        fix="Make the destination's dtype able to hold the result (convert it to float "
        "first), or compute out of place and cast explicitly with .to(dtype).",
        doc="docs/semantics.md#argument-checks",
    ),
    Entry(
        "ops-inplace-broadcast-shape",
        r"output with shape .*? doesn't match the broadcast shape",
        meaning="An in-place op would need to grow its destination: the broadcast shape of "
        "the operands is larger than the tensor being written.",
        cause="x.add_(y) (or x += y, mul_, etc.) where y has more dimensions or larger "
        "sizes than x, so the result cannot fit into x.",
        fix="Make x the larger operand, or write x = x + y out of place; check that the "
        "shapes are the ones you expect.",
        doc="docs/semantics.md#views-and-in-place-ops",
    ),
    Entry(
        "ops-out-wrong-device",
        r"Expected out tensor to have device pjrt:.*?, but got .*? instead",
        meaning="An op's out= tensor is not on the pjrt device where the op computes its result.",
        cause="The out= buffer was allocated on the CPU or on another pjrt device index "
        "than the inputs.",
        fix="Allocate out on the inputs' device (torch.empty(..., device=x.device)), or "
        "drop out= and move the result explicitly.",
        doc="docs/device_api.md#devices",
    ),
    # --- indexing -----------------------------------------------------------------------
    Entry(
        "ops-bool-mask-shape-mismatch",
        r"The shape of the mask .*? at index .*? does not match the shape of the indexed tensor",
        meaning="A boolean mask used as an index does not have the same sizes as the "
        "dimensions of the tensor it indexes.",
        cause="x[mask] with a mask built for another shape, e.g. a mask of a padded or "
        "differently batched tensor, or a mask missing a dimension.",
        fix="Build the mask with the same shape as the dimensions it selects (check "
        "mask.shape against x.shape), or broadcast/expand it first.",
        doc="docs/semantics.md#argument-checks",
    ),
    # --- allocation, storage, asserts ---------------------------------------------------
    Entry(
        "ops-negative-dimension",
        r"Trying to create tensor with negative dimension|zeros: Dimension size must be "
        r"non-negative",
        meaning="A tensor was allocated or resized with a negative size.",
        cause="A size computed in Python came out negative (e.g. n - k with k > n), passed "
        "to torch.empty, torch.zeros, torch.full, new_empty or Tensor.resize_.",
        fix="Check the computed sizes before allocating; every dimension must be >= 0.",
        doc="docs/semantics.md#argument-checks",
    ),
    Entry(
        "ops-assert-async-failed",
        r"Expected Tensor with single nonzero value, but got zero",
        meaning="torch._assert_async was given a tensor whose value is zero/False: the "
        "asserted condition failed.",
        cause="Code (yours, or a library's runtime check) asserts a condition on a tensor "
        "with torch._assert_async, and the condition is false for this data.",
        fix="Find the assertion in the traceback and fix the data or logic that makes "
        "the condition false; on pjrt it is checked at once (a host sync), as on the CPU.",
        doc="docs/semantics.md#values-checked-on-the-device",
    ),
    Entry(
        "ops-storage-resize-size",
        r"a storage can be resized to 0 bytes \(freeing its device memory\) or back to its size",
        meaning="UntypedStorage.resize_ on a pjrt storage only supports two sizes: 0 bytes "
        "(free the device buffer) and the storage's own size (get it back).",
        cause="Code calls tensor.untyped_storage().resize_(n) with some other size, e.g. "
        "to grow a buffer; FSDP2's free/reallocate pattern is what is supported.",
        fix="Resize the tensor instead (Tensor.resize_ allocates a new storage when it "
        "grows), or allocate a new tensor of the size you need.",
        doc="docs/distributed.md#fsdp2-tensor-parallel-and-fsdp2--tp",
    ),
    # --- fused optimizers ---------------------------------------------------------------
    Entry(
        "ops-fused-adam-list-length",
        r"expected .*? to have .*? tensors \(one per parameter\)",
        meaning="A fused Adam/AdamW step (_fused_adam_ or _fused_adamw_) got a state list "
        "(grads, exp_avgs, exp_avg_sqs, state_steps, max_exp_avg_sqs) whose length differs "
        "from the number of parameters.",
        cause="The optimizer state does not match the parameter list, e.g. a state dict "
        "from another model was loaded, or the fused op is called directly with "
        "mismatched lists.",
        fix="Make the optimizer's state match its params (rebuild the optimizer or load "
        "a matching state dict); or use fused=False to get the foreach implementation.",
        doc="docs/huggingface.md#the-optimizer",
    ),
    Entry(
        "ops-fused-adam-device",
        r"expected every tensor on .*?, got one on ",
        meaning="A fused Adam/AdamW step on pjrt needs every parameter on the same pjrt "
        "device; one was on the CPU or on another device.",
        cause="Part of the model was not moved to pjrt (or was moved to another device "
        "index) before the optimizer with fused=True was created or stepped.",
        fix="Move the whole model with model.to('pjrt') before building the optimizer, or "
        "create separate optimizers per device.",
        doc="docs/huggingface.md#the-optimizer",
    ),
    # --- random samplers ----------------------------------------------------------------
    Entry(
        "ops-uniform-bad-range",
        r"uniform_ expects to return a \[from, to\) range, but found from=",
        meaning="Tensor.uniform_ (e.g. nn.init.uniform_) was given a lower bound greater "
        "than its upper bound.",
        cause="The from/to (a/b) arguments are swapped, or a bound computed from the layer "
        "size has the wrong sign.",
        fix="Pass from <= to, e.g. x.uniform_(-bound, bound) with bound >= 0.",
        doc="docs/device_api.md#random-numbers",
    ),
    Entry(
        "ops-normal-negative-std",
        r"normal expects std >= 0\.0, but found std",
        meaning="Tensor.normal_ (e.g. nn.init.normal_) was given a negative standard deviation.",
        cause="std was computed with the wrong sign, or a variance/std argument was mixed "
        "up with the mean.",
        fix="Pass std >= 0 (use abs() if it is computed).",
        doc="docs/device_api.md#random-numbers",
    ),
    Entry(
        "ops-bernoulli-bad-p",
        r"bernoulli_ expects p to be in \[0, 1\], but got p=",
        meaning="Tensor.bernoulli_ was given a probability outside [0, 1].",
        cause="A keep probability was passed as a percentage, or computed as 1 - p with p > 1.",
        fix="Pass p between 0 and 1 (clamp it if it is computed).",
        doc="docs/device_api.md#random-numbers",
    ),
    Entry(
        "ops-exponential-bad-lambda",
        r"exponential_ expects lambda > 0\.0, but found lambda=",
        meaning="Tensor.exponential_ was given a rate lambda that is zero, negative or NaN.",
        cause="The rate was computed from data that can be zero, or the mean (1/lambda) "
        "was confused with the rate.",
        fix="Pass lambd > 0 (the rate, the inverse of the mean).",
        doc="docs/device_api.md#random-numbers",
    ),
    Entry(
        "ops-random-bad-range",
        r"random_ expects 'from' to be less than 'to', but got from=",
        meaning="Tensor.random_(from, to) was given an empty range: from >= to.",
        cause="from and to are swapped, or to is inclusive in your head (random_ draws "
        "from [from, to), so from == to is empty).",
        fix="Pass from < to; to draw values 0..n-1 use x.random_(0, n).",
        doc="docs/device_api.md#random-numbers",
    ),
    # --- reductions ---------------------------------------------------------------------
    Entry(
        "ops-reduction-empty-dim",
        r"\(\): Expected reduction dim .*? to have non-zero size",
        meaning="max, min or median along a dimension was called on a tensor whose size in "
        "that dimension is 0, so there is no value to return.",
        cause="An empty batch or an empty selection (e.g. x[mask] with no True entries) was "
        "reduced with x.max(dim), x.min(dim) or x.median(dim).",
        fix="Check x.shape[dim] > 0 before reducing, and handle the empty case separately "
        "(e.g. skip the batch or return a default value).",
        doc="docs/semantics.md#argument-checks",
    ),
    Entry(
        "ops-argmax-empty-no-dim",
        r"Expected reduction dim to be specified for input\.numel\(\) == 0",
        meaning="argmax or argmin over the whole tensor was called on an empty tensor.",
        cause="torch.argmax(x) or torch.argmin(x) without dim= on a tensor with no "
        "elements (an empty batch or selection).",
        fix="Check x.numel() > 0 first, or pass dim= for a tensor whose reduced dimension "
        "is not empty.",
        doc="docs/semantics.md#argument-checks",
    ),
    Entry(
        "ops-reduction-needs-float",
        r"std and var only support floating point and complex dtypes"
        r"|linalg\.vector_norm: Expected a floating point or complex tensor as input",
        meaning="std, var and vector norms (torch.std, torch.var, torch.norm, "
        "torch.linalg.vector_norm) are defined only for floating-point and complex "
        "tensors.",
        cause="The statistic was taken of an integer or bool tensor, such as token ids, "
        "counts or a mask.",
        fix="Convert the tensor first: x.float().std(), torch.linalg.vector_norm(x.float()).",
        doc="docs/semantics.md#dtypes",
    ),
    Entry(
        "ops-renorm-invalid",
        r"renorm: invalid arguments",
        meaning="torch.renorm was called with arguments it does not accept: it needs a "
        "floating tensor with at least 2 dimensions and a positive p.",
        cause="A 1-D or integer tensor was passed, or p <= 0.",
        fix="Pass a floating tensor with 2 or more dimensions and p > 0 (e.g. "
        "torch.renorm(w.float(), p=2, dim=0, maxnorm=1.0)).",
        doc="docs/semantics.md#argument-checks",
    ),
    Entry(
        "ops-topk-kthvalue-k-range",
        r"selected (?:index|number) k out of range",
        meaning="topk or kthvalue was asked for a k that does not fit the dimension: topk "
        "needs 0 <= k <= size, kthvalue needs 1 <= k <= size.",
        cause="k is larger than the dimension (e.g. top-5 over a dimension of 3 classes, or "
        "a short last batch), or k is 0 for kthvalue.",
        fix="Clamp k to the dimension's size (k = min(k, x.shape[dim])), and make sure "
        "kthvalue's k starts at 1.",
        doc="docs/semantics.md#argument-checks",
    ),
    # --- special functions --------------------------------------------------------------
    Entry(
        "ops-polygamma-negative-n",
        r"polygamma\(n, x\) does not support negative n",
        meaning="torch.polygamma's order n must be 0 or more.",
        cause="A negative order was passed to torch.polygamma or torch.special.polygamma.",
        fix="Pass n >= 0 (n=0 is digamma, n=1 trigamma).",
        doc="docs/semantics.md#argument-checks",
    ),
    Entry(
        "ops-angle-conversion-complex",
        r"is not supported for complex tensors\.",
        meaning="torch.rad2deg and torch.deg2rad do not accept complex tensors.",
        cause="An angle conversion was applied directly to a complex tensor instead of to "
        "its angle.",
        fix="Convert the angle, not the complex number: torch.rad2deg(torch.angle(z)), or "
        "apply it to z.real / z.imag separately.",
        doc="docs/semantics.md#dtypes",
    ),
    # --- numbers that must fit the dtype ------------------------------------------------
    Entry(
        "ops-scalar-overflow",
        r"value cannot be converted to type .*? without overflow",
        meaning="A Python number passed to an op (a fill value, a clamp bound, a lerp "
        "weight, a threshold) does not fit the tensor's dtype, and pjrt refuses it as CPU "
        "PyTorch does instead of wrapping or saturating it.",
        cause="E.g. torch.full((2,), 300, dtype=torch.int8), x_half.fill_(1e6), "
        "x_int8.clamp(min=300) or x_int32.fill_(float('nan')); commonly a -1e9 mask fill "
        "on a float16 tensor, or -inf/NaN on an integer one.",
        fix="Use a value in the dtype's range (torch.finfo(x.dtype).min instead of -1e9), "
        "or change the tensor's dtype.",
        doc="docs/semantics.md#argument-checks",
    ),
    # --- segment_reduce -----------------------------------------------------------------
    Entry(
        "ops-segment-reduce-unknown",
        r"segment_reduce: unknown reduction",
        meaning="torch.segment_reduce was given a reduction name it does not know.",
        cause="A misspelt or unsupported reduce= string (e.g. 'add' or 'avg').",
        fix="Pass reduce= as one of 'sum', 'mean', 'prod', 'max', 'min'.",
        doc="docs/semantics.md#argument-checks",
    ),
    # --- shape ops ----------------------------------------------------------------------
    Entry(
        "ops-repeat-too-few",
        r"repeat: fewer repeats than dims",
        meaning="Tensor.repeat needs at least one repeat count per dimension of the tensor.",
        cause="x.repeat(n) was called on a tensor with more than one dimension, perhaps "
        "meaning repeat_interleave or a repeat along one dimension only.",
        fix="Give a count for every dimension, e.g. x.repeat(1, n) for a 2-D x, or use "
        "x.repeat_interleave(n, dim=...).",
        doc="docs/semantics.md#argument-checks",
    ),
    Entry(
        "ops-pad-invalid-length",
        r"invalid padding .*? for a .*?-d tensor",
        meaning="A constant padding (F.pad with mode='constant') got a pad list of odd "
        "length, or with more pairs than the tensor has dimensions.",
        cause="The pad list is missing one side of a pair, or it pads more dimensions than "
        "the tensor has (pairs run from the last dimension backwards).",
        fix="Pass an even-length pad list with at most 2 * x.ndim entries: (left, right) "
        "for the last dim, then (top, bottom) for the one before, and so on.",
        doc="docs/semantics.md#argument-checks",
    ),
    Entry(
        "ops-pad-crops-too-much",
        r"padding .*? crops more than dim .*? holds",
        meaning="Negative padding crops a dimension, and the amounts given would crop "
        "more elements than the dimension has.",
        cause="F.pad with negative values whose sum exceeds the size of that dimension, "
        "e.g. cropping a sequence shorter than expected.",
        fix="Make the negative pad amounts of each dimension add up to at most its size, "
        "or slice the tensor instead of cropping with F.pad.",
        doc="docs/semantics.md#argument-checks",
    ),
    Entry(
        "ops-as-strided-scatter-src-shape",
        r"expected src of shape .*?, got ",
        meaning="torch.as_strided_scatter needs src to have exactly the size passed for "
        "the strided view.",
        cause="The src tensor's shape differs from the size argument (often a missing or "
        "extra dimension of 1).",
        fix="Reshape src to the given size, or pass the size that matches src.",
        doc="docs/semantics.md#views-and-in-place-ops",
    ),
    # --- the lowering registry (extending torch_pjrt) -----------------------------------
    Entry(
        "ops-lowers-bad-argument",
        r"lowers\(\) takes OpOverload or OpOverloadPacket objects, got",
        meaning="The @lowers decorator was given something other than an ATen op "
        "(torch.ops.aten.<name> or torch.ops.aten.<name>.<overload>).",
        cause="Code adding a lowering passed a Python function, a string op name, or "
        "torch.<name> instead of the torch.ops.aten object.",
        fix="Pass torch.ops.aten.<name>.<overload> (or the packet torch.ops.aten.<name>) "
        "to @lowers.",
        doc="docs/internals.md#the-lowering-registry-torch_pjrtopsregistrypy",
    ),
    Entry(
        "ops-lowering-registered-twice",
        r"is registered twice|has two lowerings",
        meaning="A second lowering or raw kernel was registered for an ATen op that "
        "already has one; torch_pjrt treats a duplicate registration as an error.",
        cause="Code adding lowerings (@lowers, @lowers_in_graphs, @implements) targets an "
        "op torch_pjrt already covers, or a module of lowerings was imported twice under "
        "different names.",
        fix="Remove the duplicate registration, or change the existing lowering in its "
        "file under torch_pjrt/ops/ instead of registering a new one.",
        doc="docs/internals.md#the-lowering-registry-torch_pjrtopsregistrypy",
    ),
    # --- the fallback policy ------------------------------------------------------------
    Entry(
        "ops-lowering-missing",
        r"has (?:no pjrt lowering|a pjrt lowering that does not support these arguments)"
        r".*?TORCH_PJRT_FALLBACK=error forbids|the lowering declines these arguments",
        meaning="An ATen op reached the pjrt device and torch_pjrt cannot run it there: "
        "it has no lowering, or its lowering does not support these arguments; with "
        "fallback set to 'error' it is not run on the CPU either.",
        cause="TORCH_PJRT_FALLBACK=error (or torch_pjrt.config(fallback='error')) is set, "
        "and the program calls an op not covered by torch_pjrt for these inputs.",
        fix="Unset TORCH_PJRT_FALLBACK (or set it to 'cpu') to let the op run on the CPU, "
        "avoid the op, and report it with its name and schema to the torch_pjrt tracker.",
        doc="docs/fallback.md#making-it-an-error",
        classes=("LoweringMissing",),
    ),
    # === kernels/, modes/, runtime/ ==========================================
    Entry(
        "kernels-sdpa-overrideable-dropout",
        r"_scaled_dot_product_fused_attention_overrideable on pjrt runs without dropout",
        meaning="pjrt's kernel of SDPA's overrideable backend computes attention without "
        "dropout; F.scaled_dot_product_attention never sends it a call with dropout (those "
        "take PyTorch's math backend, which pjrt runs).",
        cause="torch.ops.aten._scaled_dot_product_fused_attention_overrideable was called "
        "directly with dropout_p > 0.",
        fix="Call F.scaled_dot_product_attention(..., dropout_p=p) instead: it chooses the "
        "backend for the call.",
        doc="docs/kernels.md#fscaled_dot_product_attention-on-pjrt",
    ),
    # --- torch_pjrt.kernels: the package and the decorator ------------------------------
    Entry(
        "kernels-unknown-attribute",
        r"module 'torch_pjrt\.kernels' has no attribute",
        meaning="The name you looked up in torch_pjrt.kernels is not one of its kernels or helpers.",
        cause="A misspelled kernel name, or a kernel the library does not have (it has flash_attention, "
        "paged_attention, rms_norm, layer_norm, rotary_embedding, linear_cross_entropy, "
        "linear_cross_entropy_bias and grouped_matmul).",
        fix="Use one of the listed names (plus kernel, definition, infer_schema, KernelError, KernelOp, "
        "load_library), or write the missing one yourself with @torch_pjrt.kernel.",
        doc="docs/kernels.md#the-library-torch_pjrtkernels",
    ),
    Entry(
        "kernels-static-argument-type",
        r"keyword-only argument .*?(: unsupported type|needs a type annotation)",
        meaning="A keyword-only (static) parameter of a kernel function has no type the schema can "
        "express: it needs int, float, bool, str, their Optional forms or list[int].",
        cause="The parameter has no annotation and no default (or a default of None), or its "
        "annotation is another type such as a tensor, a tuple of floats or a dict.",
        fix="Annotate it, e.g. `*, scale: float = 1.0` or `block: int | None = None`; pass tensors as "
        "positional parameters, and split composite settings into several static arguments.",
        doc="docs/kernels.md#the-signature-is-the-schema",
    ),
    Entry(
        "kernels-positional-default",
        r"positional parameter .*? has a default: a kernel's positional parameters are its tensors",
        meaning="A positional parameter of the kernel function has a default value, but positional "
        "parameters become the op's Tensor arguments, which take no defaults.",
        cause="A setting such as `alpha=1.0` was written before the `*` in the function's signature.",
        fix="Move settings after a bare `*` so they are keyword-only: `def f(x, y, *, alpha: float = 1.0)`.",
        doc="docs/kernels.md#the-signature-is-the-schema",
    ),
    Entry(
        "kernels-varargs",
        r"a kernel takes no \*args or \*\*kwargs",
        meaning="The kernel function's signature uses *args or **kwargs, which cannot be turned into "
        "a fixed operator schema.",
        cause="A generic wrapper or a function that forwards arbitrary arguments was decorated with "
        "@torch_pjrt.kernel.",
        fix="Spell out every tensor as a positional parameter and every setting as a keyword-only one, "
        "or pass an explicit schema= and a function with matching named parameters.",
        doc="docs/kernels.md#the-signature-is-the-schema",
    ),
    Entry(
        "kernels-mutates-args-unknown",
        r"mutates_args names no tensor parameter",
        meaning="mutates_args lists names that are not positional (tensor) parameters of the kernel "
        "function.",
        cause="A misspelled name, or the name of a keyword-only static argument, which cannot be "
        "mutated.",
        fix="List only the names of positional tensor parameters the kernel updates, exactly as "
        "spelled in the function's signature.",
        doc="docs/kernels.md#in-place-and-aliasing",
    ),
    Entry(
        "kernels-mutates-args-schema-mismatch",
        r"mutates_args=.*? but the schema mutates",
        meaning="The explicit schema= marks a different set of arguments as mutated (Tensor(a!)) than "
        "mutates_args does.",
        cause="Both schema= and mutates_args= were given and disagree, often after one was edited and "
        "the other was not.",
        fix="Make mutates_args name exactly the Tensor(a!) arguments of the schema, or drop "
        "mutates_args and let the schema declare the mutation.",
        doc="docs/kernels.md#in-place-and-aliasing",
    ),
    Entry(
        "kernels-view-argument",
        r"is a view \(.*?\): a kernel's outputs are new tensors",
        meaning="The schema declares an argument as aliased without a write (Tensor(a)), i.e. a result "
        "that is a view of an input, which a pjrt kernel cannot return.",
        cause="A schema= copied from a view op (like `Tensor(a) self -> Tensor(a)`) was given to "
        "@torch_pjrt.kernel.",
        fix="Return a new tensor (plain `Tensor`), or if the kernel updates the argument in place, "
        "declare it `Tensor(a!)` and return its new value from the function.",
        doc="docs/kernels.md#in-place-and-aliasing",
    ),
    Entry(
        "kernels-non-tensor-result",
        r": results must be Tensors, got",
        meaning="The kernel's schema returns something other than Tensors (an int, a float, a "
        "Tensor[] list or an optional Tensor).",
        cause="An explicit schema= whose return type is not a Tensor or a tuple of Tensors.",
        fix="Declare the results as `-> Tensor` or `-> (Tensor, Tensor)`; return scalars as 0-d "
        "JAX arrays.",
        doc="docs/kernels.md#the-signature-is-the-schema",
    ),
    Entry(
        "kernels-bad-name",
        r"a kernel's name is 'namespace::name'",
        meaning="The name given to @torch_pjrt.kernel has no `::`, so it names no operator namespace.",
        cause='Writing @torch_pjrt.kernel("my_op") instead of a qualified name.',
        fix='Give a qualified name such as @torch_pjrt.kernel("mylib::my_op"); the op is then '
        "torch.ops.mylib.my_op.",
        doc="docs/kernels.md#a-worked-example-a-pallas-kernel",
    ),
    Entry(
        "kernels-already-defined",
        r"is already defined \(by ",
        meaning="Another function has already been registered as a kernel under this namespace::name "
        "in this process.",
        cause="The decorated definition ran twice (a re-run notebook cell, a module imported under "
        "two names), or two kernels were given the same name.",
        fix="Give each kernel a unique name, or reuse the operator defined the first time "
        "(torch.ops.<namespace>.<name>); restart the process to redefine it.",
        doc="docs/kernels.md#the-signature-is-the-schema",
    ),
    Entry(
        "kernels-not-on-pjrt",
        r"is a pjrt kernel: it runs on pjrt tensors",
        meaning="A torch_pjrt kernel was called with tensors that are not on the pjrt device, and it "
        "has no PyTorch reference to run for them.",
        cause="Inputs left on the CPU (or another device), e.g. a model or batch not moved with "
        ".to('pjrt'), or a test calling the op on CPU tensors.",
        fix="Move the inputs with .to('pjrt'), or pass @torch_pjrt.kernel(..., reference=fn) with a "
        "PyTorch function of the same signature to run on other devices.",
        doc="docs/kernels.md#cpu-tensors-and-references",
    ),
    Entry(
        "kernels-not-a-kernel-op",
        r"is not an operator made by torch_pjrt\.kernel",
        meaning="torch_pjrt.kernels.definition() was given an operator that @torch_pjrt.kernel did "
        "not define in this process.",
        cause="An ATen or torch.library operator was passed (pjrt::flash_attention is one: it calls "
        "the kernels pjrt::flash_attention_dense/_varlen), the name is misspelled, or the module "
        "defining the kernel has not been imported yet.",
        fix="Pass the op returned by @torch_pjrt.kernel (or its 'namespace::name'); for library "
        "kernels call torch_pjrt.kernels.load_library() first.",
        doc="docs/kernels.md#the-signature-is-the-schema",
    ),
    Entry(
        "kernels-failed-to-trace",
        r"KernelError|pjrt kernel \S+ failed to trace",
        meaning="torch_pjrt.kernels.KernelError: a kernel's JAX function (or its backward) failed "
        "inside JAX while tracing, or returned values its schema does not allow.",
        cause="A JAX error in the function (mismatched shapes, Python control flow on traced values, "
        "an unsupported dtype), or jax.vjp of a pallas_call, which has no reverse-mode rule.",
        fix="Read the JAX error and the line it names in the message and fix the function; for "
        "gradients of a Pallas kernel give @torch_pjrt.kernel(..., backward=fn) or use jax.custom_vjp.",
        doc="docs/kernels.md#when-the-function-fails",
        classes=("KernelError",),
    ),
    Entry(
        "kernels-wrong-results",
        r"pjrt kernel \S+ returned .*?(its schema expects \d+ JAX array|as the new value of)",
        meaning="A kernel's function returned a different number or kind of results than its schema "
        "declares, or a new value for a mutated argument whose shape or dtype differs.",
        cause="The function returns a tuple when the schema has one result (or the reverse), forgets "
        "the new values of mutates_args tensors, or returns them with another shape or dtype.",
        fix="Return exactly the schema's results as JAX arrays, followed by one new value per mutated "
        "argument with that argument's shape and dtype (cast with .astype).",
        doc="docs/kernels.md#in-place-and-aliasing",
    ),
    # --- the kernel library: arguments -------------------------------------------------
    Entry(
        "kernels-impl-unknown",
        r"\bimpl must be one of\b",
        meaning="A library kernel was given an impl= value it does not know.",
        cause="A misspelled value, or a value of another kernel (grouped_matmul takes auto, "
        "ragged_dot or megablox; the others take auto, pallas or reference).",
        fix="Pass one of the values listed in the message; impl='auto' chooses per platform.",
        doc="docs/kernels.md#chosen-per-chip",
    ),
    Entry(
        "kernels-hf-softcap-with-mask",
        r"runs a logit soft-cap only without an attention mask",
        meaning="A model using attn_implementation='pjrt' has a logit soft-cap, but this call must go "
        "to transformers' SDPA attention, which cannot apply one.",
        cause="The batch is padded (transformers passes an attention mask); dropout in training, "
        "tensors not on pjrt, or a sliding window without causal attention also force that path.",
        fix="Load the model with attn_implementation='eager' for padded batches, or feed batches "
        "without padding (no attention mask) and no attention dropout.",
        doc="docs/huggingface.md#attention",
    ),
    Entry(
        "kernels-flash-attention-not-4d",
        r"to be 4-D \[batch, heads, seq, head_dim\]",
        meaning="flash_attention takes q, k and v as 4-D tensors in the layout of "
        "scaled_dot_product_attention, [batch, heads, seq, head_dim].",
        cause="A 3-D tensor without a batch (or heads) dimension, or heads still fused into the "
        "hidden dimension as [batch, seq, hidden].",
        fix="Reshape to [B, S, H, D] with view and then transpose(1, 2) to [B, H, S, D]; add a batch "
        "dimension with unsqueeze(0).",
        doc="docs/kernels.md#the-library-torch_pjrtkernels",
    ),
    Entry(
        "kernels-flash-attention-shape-mismatch",
        r"expected (k and v of the same shape|q and k to agree in batch and head_dim)",
        meaning="flash_attention needs k and v of one shape, and q with the same batch size and head "
        "dimension as k.",
        cause="Keys and values taken from different caches or lengths, tensors in the [B, S, H, D] "
        "layout instead of [B, H, S, D], or a batch dimension broadcast on only some inputs.",
        fix="Make k and v the same [B, Hkv, Sk, D] shape and q [B, Hq, Sq, D] with the same B and D "
        "(transpose(1, 2) from [B, S, H, D]; expand a size-1 batch explicitly).",
        doc="docs/kernels.md#the-library-torch_pjrtkernels",
    ),
    Entry(
        "kernels-gqa-heads",
        r"query heads \(.*?\) must be a multiple of the (number of key/value|KV) heads",
        meaning="For grouped-query attention the number of query heads must be a whole multiple of "
        "the number of key/value heads.",
        cause="Head counts from the wrong config (num_attention_heads vs num_key_value_heads), or the "
        "head and sequence dimensions swapped.",
        fix="Check the head dimension of each input (dim 1 for flash_attention, dim 1 of q and dim 2 "
        "of the KV pages for paged_attention) and pass head counts where Hq % Hkv == 0.",
        doc="docs/kernels.md#the-library-torch_pjrtkernels",
    ),
    Entry(
        "kernels-flash-attention-dtype",
        r"expected q, k and v of one floating dtype",
        meaning="flash_attention needs q, k and v to share one floating-point dtype.",
        cause="Mixed dtypes, e.g. bfloat16 queries with a float32 KV cache, or integer tensors passed "
        "by mistake.",
        fix="Cast the inputs to one dtype first, e.g. k = k.to(q.dtype) and v = v.to(q.dtype).",
        doc="docs/kernels.md#the-library-torch_pjrtkernels",
    ),
    Entry(
        "kernels-flash-attention-kv-lengths",
        r"expected kv_lengths to be an integer tensor of shape \[batch\]",
        meaning="kv_lengths must be a 1-D integer tensor with one key count per batch row: row b "
        "sees keys j < kv_lengths[b].",
        cause="A padding mask ([batch, seq], bool or float) passed as kv_lengths, or a length tensor "
        "of the wrong size or a float dtype.",
        fix="Pass integer lengths of shape [B], e.g. mask.sum(-1).to(torch.int32) for a right-padded "
        "batch mask.",
        doc="docs/kernels.md#the-library-torch_pjrtkernels",
    ),
    Entry(
        "kernels-flash-attention-window",
        r"needs causal=True and window >= 1",
        meaning="flash_attention's sliding window works only with causal attention and a window of "
        "at least one key (query i sees keys in (i - window, i]).",
        cause="window= given with causal=False, or a window of 0 or a negative value.",
        fix="Pass causal=True with a positive window, or window=None for no sliding window.",
        doc="docs/kernels.md#the-library-torch_pjrtkernels",
    ),
    Entry(
        "kernels-flash-attention-softcap",
        r"softcap must be positive",
        meaning="flash_attention's logit soft-cap must be a positive number.",
        cause="softcap=0 or a negative value, often a config field that uses 0 to mean no soft-cap.",
        fix="Pass softcap=None to disable the soft-cap, or a positive value such as 50.0.",
        doc="docs/kernels.md#the-library-torch_pjrtkernels",
    ),
    Entry(
        "kernels-paged-attention-shapes",
        r"expected (q of shape \[B, Hq, D\]|k_pages of shape \[num_blocks|v_pages of k_pages' shape"
        r"|kv_pages of shape \[num_blocks, Hkv|block_tables of shape \[B, max_blocks\]"
        r"|context_lens of shape)|q has head size .*? but k_pages has",
        meaning="paged_attention's inputs do not have the shapes it needs: q [B, Hq, D], k_pages and "
        "v_pages [num_blocks, block_size, Hkv, D] (paged_attention_kv: kv_pages [num_blocks, Hkv, "
        "block_size, D + Dv]), block_tables [B, max_blocks], context_lens [B].",
        cause="A q with a sequence dimension ([B, Hq, 1, D]), a KV cache in another layout (e.g. "
        "head-major), or tables and lengths whose batch differs from q's.",
        fix="Squeeze the single query token (q[:, :, 0]), keep the cache in vLLM's [num_blocks, "
        "block_size, Hkv, D] layout, and pass one block-table row and one length per sequence.",
        doc="docs/kernels.md#the-library-torch_pjrtkernels",
    ),
    Entry(
        "kernels-paged-attention-integer-indices",
        r"paged_attention: expected integer \S+, got",
        meaning="paged_attention's block_tables and context_lens must be integer tensors.",
        cause="The block tables or context lengths were built as float or bool tensors.",
        fix="Convert them with .to(torch.int32) (or keep them int64) before the call.",
        doc="docs/kernels.md#the-library-torch_pjrtkernels",
    ),
    Entry(
        "kernels-paged-attention-no-backward",
        r"pjrt::paged_attention is forward only",
        meaning="paged_attention has no gradient: the backward pass reached it and raised.",
        cause="Its inputs require grad during training or in a graph with autograd enabled, e.g. a "
        "decode step run without torch.no_grad().",
        fix="Run decoding under torch.no_grad() / inference_mode or detach the inputs; to train, use "
        "F.scaled_dot_product_attention on contiguous keys and values.",
        doc="docs/kernels.md#the-library-torch_pjrtkernels",
    ),
    Entry(
        "kernels-paged-attention-no-pallas",
        r"\w+: impl='pallas' has no kernel for the",
        meaning="impl='pallas' was forced on a platform for which paged_attention has no Pallas "
        "kernel (it has them for TPU, GPU and, interpreted, the CPU; paged_attention_kv for GPU "
        "and the CPU).",
        cause="Running with impl='pallas' on another platform such as Neuron or Metal.",
        fix="Use impl='auto' (which picks the XLA reference there) or impl='reference'.",
        doc="docs/kernels.md#chosen-per-chip",
    ),
    Entry(
        "kernels-norm-weight-shape",
        r"(layer_norm|rms_norm): expected \S+ of shape \[.*?\] \(the size of the last dimension of x",
        meaning="The weight (or bias) of rms_norm / layer_norm must be 1-D with as many elements as "
        "the last dimension of x: these kernels normalize over the last dimension only.",
        cause="A weight from a layer of another width, or an input whose normalized dimension is "
        "not last (e.g. channels-first activations).",
        fix="Pass a weight of x.shape[-1] elements (or None), or move the normalized dimension last "
        "with movedim/transpose before the call.",
        doc="docs/kernels.md#the-library-torch_pjrtkernels",
    ),
    Entry(
        "kernels-rotary-x-shape",
        r"rotary_embedding: expected x of shape \[batch, heads, seq, head_dim\] with an even head_dim",
        meaning="rotary_embedding takes x as a 4-D [batch, heads, seq, head_dim] tensor whose head "
        "dimension is even (it rotates pairs).",
        cause="Queries or keys still in [batch, seq, heads, head_dim] or 3-D layout, or an odd "
        "head dimension.",
        fix="Transpose [B, S, H, D] inputs to [B, H, S, D] with x.transpose(1, 2) before the call.",
        doc="docs/kernels.md#the-library-torch_pjrtkernels",
    ),
    Entry(
        "kernels-rotary-cos-sin-shape",
        r"rotary_embedding: expected (cos and sin of the same shape|\S+ of shape \[.*?\] or \[)",
        meaning="cos and sin must have one shape, [seq, head_dim] or [batch, seq, head_dim] (batch "
        "may be 1), matching x's seq and head_dim.",
        cause="Tables cached for another sequence length or head size, an extra heads dimension "
        "(e.g. [B, 1, S, D]), or cos and sin sliced differently.",
        fix="Slice the tables to x's sequence length and head_dim, and squeeze any heads dimension "
        "(cos.squeeze(1)) so they are [S, D] or [B, S, D].",
        doc="docs/kernels.md#the-library-torch_pjrtkernels",
    ),
    Entry(
        "kernels-lce-reduction",
        r"is not a valid value for reduction",
        meaning="The loss was given a reduction it does not support: it takes 'mean', 'sum' or 'none'.",
        cause="A misspelled reduction or one from another API (such as 'batchmean' or 'avg').",
        fix="Pass reduction='mean', 'sum' or 'none'.",
        doc="docs/kernels.md#the-library-torch_pjrtkernels",
    ),
    Entry(
        "kernels-lce-rank",
        r"linear_cross_entropy: expected hidden of shape \[N, D\] and weight of shape \[V, D\]",
        meaning="linear_cross_entropy takes hidden states as a 2-D [N, D] matrix and the output "
        "projection's weight as [V, D].",
        cause="Hidden states passed as [batch, seq, D] without flattening, or a weight that is not a "
        "matrix.",
        fix="Flatten the tokens first: hidden.reshape(-1, D) and target.reshape(-1), and pass the "
        "lm_head's weight as nn.Linear stores it.",
        doc="docs/kernels.md#the-library-torch_pjrtkernels",
    ),
    Entry(
        "kernels-lce-transposed-weight",
        r"linear_cross_entropy: hidden .*? have different sizes D",
        meaning="The hidden size of hidden ([N, D]) and of weight ([V, D]) differ.",
        cause="The weight was passed transposed ([D, V], e.g. weight.T), or it belongs to another "
        "model width.",
        fix="Pass the weight as nn.Linear stores it, [V, D] (lm_head.weight, not lm_head.weight.T).",
        doc="docs/kernels.md#the-library-torch_pjrtkernels",
    ),
    Entry(
        "kernels-lce-target-batch",
        r"Expected input batch_size \(.*?\) to match target batch_size \(.*?\): target is \[N\] class indices",
        meaning="linear_cross_entropy needs one class index per row of hidden: target must be 1-D "
        "with N entries.",
        cause="Targets not flattened like the hidden states, targets not shifted the same way for "
        "language modelling, or one-hot / probability targets.",
        fix="Pass target as a 1-D [N] tensor of class indices, e.g. labels[:, 1:].reshape(-1) next to "
        "hidden[:, :-1].reshape(-1, D).",
        doc="docs/kernels.md#the-library-torch_pjrtkernels",
    ),
    Entry(
        "kernels-lce-target-dtype",
        r"linear_cross_entropy: target must hold integer class indices",
        meaning="linear_cross_entropy's target must be an integer tensor of class indices.",
        cause="Float targets, such as class probabilities or labels converted to float.",
        fix="Pass target.long() (class indices); class probabilities are not supported by this kernel.",
        doc="docs/kernels.md#the-library-torch_pjrtkernels",
    ),
    Entry(
        "kernels-lce-bias-shape",
        r"linear_cross_entropy: bias must have shape \[V\]",
        meaning="The bias of linear_cross_entropy_bias must be 1-D with one entry per class (V, "
        "weight's first dimension).",
        cause="A bias from another layer, or one with an extra dimension.",
        fix="Pass the lm_head's bias of shape [V], or call linear_cross_entropy without a bias.",
        doc="docs/kernels.md#the-library-torch_pjrtkernels",
    ),
    Entry(
        "kernels-lce-dtype",
        r"linear_cross_entropy: hidden, weight and bias must have the same dtype",
        meaning="hidden, weight and bias of linear_cross_entropy must share one dtype.",
        cause="bfloat16 hidden states with a float32 weight (or the reverse), e.g. outside autocast or "
        "with a partially cast model.",
        fix="Cast them to one dtype, e.g. hidden.to(weight.dtype), before the call.",
        doc="docs/kernels.md#the-library-torch_pjrtkernels",
    ),
    Entry(
        "kernels-lce-chunk-size",
        r"linear_cross_entropy: chunk_size is a number of rows and must be positive",
        meaning="chunk_size, the number of rows per chunk of logits, must be at least 1.",
        cause="chunk_size=0 or a negative value, often computed from a budget that rounded down to 0.",
        fix="Pass a positive chunk_size, or chunk_size=None to let the kernel choose one that keeps a "
        "chunk's logits in budget.",
        doc="docs/kernels.md#memory-measured",
    ),
    Entry(
        "kernels-grouped-matmul-rank",
        r"grouped_matmul: expected lhs \[M, K\], rhs \[G, K, N\] and group_sizes \[G\]",
        meaning="grouped_matmul takes a 2-D lhs [M, K], a 3-D rhs [G, K, N] (one matrix per group) "
        "and a 1-D group_sizes [G].",
        cause="Tokens not flattened to [M, K], expert weights not stacked into one [G, K, N] tensor, "
        "or group sizes with an extra dimension.",
        fix="Flatten the tokens (x.reshape(-1, K)), stack the experts' weights with torch.stack, and "
        "pass group_sizes as a 1-D tensor.",
        doc="docs/kernels.md#the-library-torch_pjrtkernels",
    ),
    Entry(
        "kernels-grouped-matmul-k-mismatch",
        r"grouped_matmul: lhs .*? cannot be multiplied",
        meaning="lhs's number of columns K does not equal the number of rows of each rhs[g] matrix.",
        cause="Expert weights stored as [G, N, K] (nn.Linear's [out, in] order) instead of [G, K, N].",
        fix="Transpose the stacked weights to [G, K, N], e.g. w.transpose(1, 2).",
        doc="docs/kernels.md#the-library-torch_pjrtkernels",
    ),
    Entry(
        "kernels-grouped-matmul-group-count",
        r"grouped_matmul: group_sizes has .*? groups but rhs has",
        meaning="group_sizes must have one entry per matrix in rhs (G of them).",
        cause="Group sizes counted for a different number of experts, e.g. computed with bincount "
        "without minlength, which drops trailing empty groups.",
        fix="Give one size per expert, e.g. torch.bincount(expert_ids, minlength=G).",
        doc="docs/kernels.md#the-library-torch_pjrtkernels",
    ),
    Entry(
        "kernels-grouped-matmul-dtype",
        r"grouped_matmul: expected lhs and rhs to have the same dtype",
        meaning="grouped_matmul needs lhs and rhs of one dtype.",
        cause="bfloat16 activations with float32 expert weights (or the reverse).",
        fix="Cast one to the other's dtype before the call, e.g. rhs.to(lhs.dtype).",
        doc="docs/kernels.md#the-library-torch_pjrtkernels",
    ),
    Entry(
        "kernels-grouped-matmul-megablox-rows",
        r"grouped_matmul: impl='megablox' needs M \(lhs rows\) a multiple of 8",
        meaning="The megablox TPU kernel needs the number of lhs rows to be a multiple of 8.",
        cause="impl='megablox' forced with a token count that is not a multiple of 8.",
        fix="Pad lhs with zero rows up to a multiple of 8 (counting them in a group), or use "
        "impl='ragged_dot' or impl='auto'.",
        doc="docs/kernels.md#chosen-per-chip",
    ),
    Entry(
        "kernels-grouped-matmul-megablox-dtype",
        r"grouped_matmul: impl='megablox' takes bfloat16 or float32",
        meaning="The megablox kernel runs on bfloat16 or float32 inputs only.",
        cause="impl='megablox' forced with float16, float64 or another dtype.",
        fix="Cast the inputs to bfloat16 or float32, or use impl='ragged_dot' (impl='auto' picks it "
        "for other dtypes).",
        doc="docs/kernels.md#chosen-per-chip",
    ),
    Entry(
        "kernels-grouped-matmul-group-sizes-values",
        r"grouped_matmul: group_sizes (must be non-negative|sum to)",
        meaning="The group sizes are invalid: each must be non-negative and together they must sum "
        "to the number of lhs rows. On pjrt this is checked on the device and raised at the next "
        "host wait.",
        cause="Group sizes computed from routing that dropped or duplicated tokens, a capacity "
        "limit applied to lhs but not to the sizes, or an underflowed integer.",
        fix="Make group_sizes count exactly the rows of lhs, sorted by group (e.g. bincount of the "
        "sorted expert ids); run in TORCH_PJRT_MODE=debug to raise at the call.",
        doc="docs/semantics.md#values-checked-on-the-device",
    ),
    Entry(
        "kernels-grouped-matmul-group-sizes-dtype",
        r"grouped_matmul: group_sizes must be integers",
        meaning="grouped_matmul's group_sizes must be an integer tensor.",
        cause="Sizes computed with a float operation (a mean, a division or a float sum) and not "
        "converted back.",
        fix="Pass group_sizes.to(torch.int32) (or int64).",
        doc="docs/kernels.md#the-library-torch_pjrtkernels",
    ),
    # --- modes: fused recordings, capture and replay -----------------------------------
    Entry(
        "modes-capture-already-active",
        r"pjrt graph capture: a capture is already under way",
        meaning="A graph capture was begun while another capture is still recording; only one may be "
        "under way at a time in the process.",
        cause="Nested `with torch.pjrt.graph(...)` blocks, a capture_begin() without its "
        "capture_end(), or two threads capturing at once.",
        fix="End the first capture (capture_end(), or leave its with block) before starting another; "
        "capture the graphs one after the other.",
        doc="docs/graphs.md#the-api",
    ),
    Entry(
        "modes-capture-error",
        r"CaptureError|which a captured graph cannot do",
        meaning="torch_pjrt.modes.capture.CaptureError: the code inside a graph capture asked for "
        "something a replayed graph cannot do, and the capture was abandoned (tensors keep the "
        "values they had before it).",
        cause="A host read (.item(), .cpu(), print, an if on a tensor, nonzero), a CPU-to-device copy, "
        "a CPU fallback op, synchronize(), or an optimizer with capturable=False inside the region.",
        fix="Move that code before capture_begin or after replay(); copy_ new inputs into static "
        "tensors, and build optimizers with capturable=True or fused=True.",
        doc="docs/graphs.md#what-cannot-be-captured",
        classes=("CaptureError",),
    ),
    Entry(
        "modes-replay-shape-changed",
        r"pjrt graph replay: a tensor the graph captured at .*? reads holds",
        meaning="A tensor a captured graph reads now holds a different shape or dtype than at capture "
        "time; a graph replays on the shapes it was captured with.",
        cause="A static input was rebound or resized (e.g. `static_x = new_batch` or a last, smaller "
        "batch) instead of filled in place.",
        fix="Copy new values into the captured tensors with static_x.copy_(x) (pad a short last "
        "batch), or capture another graph for the new shape.",
        doc="docs/graphs.md#what-a-capture-records",
    ),
    Entry(
        "modes-fused-program-failed",
        r"the fused program that computes this value failed",
        meaning="In fused mode the recorded program this tensor belongs to failed earlier, so its "
        "value was never computed; the original error follows in the message.",
        cause="An op in the same recording raised when the program was built or run (the first "
        "error was reported then), or the tensor came from an abandoned graph capture.",
        fix="Fix the original error named after 'failed:', and recompute the tensor; run with "
        "TORCH_PJRT_MODE=debug to raise at the failing op.",
        doc="docs/modes.md#fused",
    ),
    Entry(
        "modes-fused-pending-value-dropped",
        r"a pending value was dropped before it was computed",
        meaning="A fused-mode tensor's recorded value was discarded without being computed and "
        "without an error to report: an internal torch_pjrt bug.",
        cause="A flaw in fused mode's bookkeeping, not in your program.",
        fix="Report it with a small reproducer, and run with torch_pjrt.set_mode('eager') (or "
        "TORCH_PJRT_MODE=eager) meanwhile.",
        doc="docs/modes.md#fused",
    ),
    # --- runtime ------------------------------------------------------------------------
    Entry(
        "runtime-asserts-row-not-found",
        r"a failed row was not found",
        meaning="An internal consistency check of on-device value checking failed: a check was "
        "flagged as failed but no failing row was found. This is a torch_pjrt bug.",
        cause="A flaw in torch_pjrt's device value checks, not in your program.",
        fix="Report it as a torch_pjrt bug with a small reproducer, including the op and the line "
        "named in the traceback.",
        doc="docs/semantics.md#values-checked-on-the-device",
    ),
    Entry(
        "runtime-asserts-check-values",
        r"asserts\.check: values are integers",
        meaning="asserts.check, which states a value check inside a lowering or kernel, was given a "
        "non-integer value to format into its message.",
        cause="A lowering or a kernel function passed a float or bool array (e.g. the offending "
        "value itself) as a message argument to asserts.check.",
        fix="Pass integer scalars only, such as asserts.first_bad(...) or an index cast with "
        ".astype(jnp.int32); report it if it comes from torch_pjrt's own ops.",
        doc="docs/internals.md#the-executor-torch_pjrtruntimeexecutorpy",
    ),
    Entry(
        "runtime-no-free-port-pair",
        r"free consecutive ports on .* between",
        meaning="torch_pjrt looked for adjacent free local ports below the ephemeral range "
        "(torch's store on p, JAX's coordinator on p + 1) and found none in 200 random tries.",
        cause="Ports are scarce on the host (other jobs or leftover worker processes hold them) when "
        "a launcher without torchrun's environment, or the test helpers, start JAX's coordinator.",
        fix="Stop stale processes holding ports, or launch with torchrun, whose MASTER_PORT and "
        "MASTER_PORT + 1 are then used without a search.",
        doc="docs/distributed.md#launching",
    ),
    Entry(
        "runtime-invalid-device-index",
        r"Invalid device pjrt:.*?valid indices are",
        meaning="The device index is outside the devices this process sees on the chosen platform.",
        cause="Code written for several GPUs run where fewer devices exist (the CPU platform has one "
        "by default), or, under torchrun, an index other than this process's own LOCAL_RANK.",
        fix="Use an index below torch.pjrt.device_count(); on the CPU platform set "
        "TORCH_PJRT_CPU_DEVICES=N before start-up to get N devices.",
        doc="docs/device_api.md#devices",
    ),
    Entry(
        "runtime-platform-already-chosen",
        r"torch_pjrt is already running on platform",
        meaning="A different PJRT platform was requested after the platform was fixed: it is chosen "
        "once, before the first pjrt tensor.",
        cause="torch_pjrt.init(platform=...) called after pjrt tensors were made (or after an "
        "earlier init with another platform), e.g. late in a script or in a library.",
        fix="Set PJRT_DEVICE before the program starts, or call torch_pjrt.init(platform=...) first "
        "thing, before any pjrt tensor exists.",
        doc="docs/choosing_the_chip.md",
    ),
    Entry(
        "runtime-platform-not-found",
        r"PJRT platform '.*?' was requested \(PJRT_DEVICE or torch_pjrt\.init\) but JAX found no such devices",
        meaning="The platform named by PJRT_DEVICE (or torch_pjrt.init) has no devices that JAX can "
        "see; torch_pjrt does not fall back to the CPU silently.",
        cause="Its JAX PJRT plugin is missing or does not match jaxlib, the hardware or driver is "
        "absent, or JAX_PLATFORMS excludes it.",
        fix="Install the plugin named in the message at jaxlib's version, check with `torch-pjrt "
        "doctor --platform <name>`, or use PJRT_DEVICE=CPU.",
        doc="docs/choosing_the_chip.md#plugin-packages",
    ),
    Entry(
        "runtime-platform-error",
        r"PlatformError",
        meaning="torch_pjrt.PlatformError: the PJRT platform that was asked for cannot be used: it "
        "has no devices, or another platform is already in use.",
        cause="A missing or mismatched JAX plugin for the requested chip, or a platform change "
        "requested after the first pjrt tensor was made.",
        fix="Install the chip's JAX plugin (see `torch-pjrt doctor`), and choose the platform once, "
        "with PJRT_DEVICE or torch_pjrt.init() at the start.",
        doc="docs/choosing_the_chip.md#the-default-order",
        classes=("PlatformError",),
    ),
    Entry(
        "runtime-unsupported-dtype",
        r"dtype .*? is not supported on pjrt devices",
        meaning="The tensor's dtype has no equivalent on pjrt devices; the message lists the dtypes "
        "that are supported.",
        cause="Moving or creating a tensor of a dtype such as quantized types, bits types, "
        "float8 variants other than e4m3fn/e5m2, or complex32 on pjrt.",
        fix="Convert to a supported dtype before moving it (e.g. .to(torch.float32) or a supported "
        "integer type), or keep that tensor on the CPU.",
        doc="docs/semantics.md#dtypes",
    ),
    Entry(
        "runtime-x64-thread-local-hook",
        r"the x64 state has a thread-local hook",
        meaning="An internal signal: the installed JAX's 64-bit mode state has a thread-local hook, "
        "so torch_pjrt does not use its fast per-call switch.",
        cause="A JAX version whose x64 state differs from the one the fast path was written for; "
        "torch_pjrt catches this and falls back to jax.enable_x64.",
        fix="Nothing to do when it is caught; if it ever reaches you, report it with your jax and "
        "jaxlib versions, or install the versions in requirements-lock.txt.",
        doc="docs/internals.md#runtime-torch_pjrtruntime",
    ),
    # === distributed/, serving/, config, diagnostics, the command ============
    # --- cli ------------------------------------------------------------------------
    Entry(
        "cli-export-no-hook",
        r"defines no \S*\(\); define it to return \(model, example_args\)",
        meaning="`torch-pjrt export` loaded your script or module but found no callable "
        "with the hook's name in it (export_example() unless you named another with :FUNCTION).",
        cause="The file has no export_example function, the :FUNCTION suffix is misspelled, "
        "or the name is bound to something that is not callable.",
        fix="Define `def export_example(): return model, (x,)` (optionally a third item, "
        "dynamic_shapes) in the file, or pass `MODULE_OR_SCRIPT:your_function`.",
        doc="docs/export.md#torch-pjrt-export",
    ),
    Entry(
        "cli-export-no-such-script",
        r"no such script(?: or module)?: ",
        meaning="`torch-pjrt export` could not find the target: a path ending in .py (or "
        "containing a path separator) that is not a file, or a dotted module name that "
        "cannot be imported.",
        cause="A typo in the path or module name, running the command from another "
        "directory, or a module that is not on sys.path (not installed, or its parent "
        "directory missing from PYTHONPATH).",
        fix="Pass an existing .py file, or a module importable from the current "
        "environment (check with `python -c 'import pkg.mod'`); add its directory to "
        "PYTHONPATH if needed.",
        doc="docs/export.md#torch-pjrt-export",
    ),
    # --- config ---------------------------------------------------------------------
    Entry(
        "config-bad-value",
        r"torch_pjrt \S+ must be .*?, but got ",
        meaning="A torch_pjrt setting was given a value it does not accept; the message "
        "names the setting and what it allows.",
        cause="A wrong value passed to torch_pjrt.config(...), assigned to "
        "torch_pjrt.settings.<field>, or given to set_mode/strict (e.g. a mode name that "
        "does not exist, or 0 for a count that must be at least 1).",
        fix="Use one of the values the message lists; docs/config.md has the table of "
        "every setting with its allowed values and default.",
        doc="docs/config.md#values-are-checked",
    ),
    Entry(
        "config-bad-env-variable",
        r"must be .*?, but got .*?Fix the variable, or unset it to use the default",
        meaning="A TORCH_PJRT_* environment variable holds a value that cannot be parsed "
        "for its setting; this is checked at `import torch_pjrt` (so also at `import torch` "
        "with the device autoloaded) or when the setting is read.",
        cause="A typo in the variable's value, e.g. TORCH_PJRT_MODE=lazy, a non-number "
        "where a count is expected, or a boolean written other than 1/true/yes/on or "
        "0/false/no/off.",
        fix="Set the variable to one of the values the message lists, or unset it (an "
        "empty variable also counts as unset) to get the default.",
        doc="docs/config.md#values-are-checked",
    ),
    Entry(
        "config-unknown-setting",
        r"torch_pjrt\.config\(\) got unknown settings",
        meaning="torch_pjrt.config(...) was called with keyword names that are not "
        "settings; nothing was overridden.",
        cause="A misspelled keyword (e.g. `moed=` for `mode=`) or a setting from another "
        "version or another library.",
        fix="Use the names the message lists after 'the settings are:'; they are the "
        "fields of torch_pjrt.settings documented in docs/config.md.",
        doc="docs/config.md#values-are-checked",
    ),
    # --- diagnostics: strict mode ---------------------------------------------------
    Entry(
        "diagnostics-strict-fallback",
        r"torch_pjrt strict mode: '.*?' has no pjrt lowering and would run on the CPU",
        meaning="Strict mode is on and an op without a pjrt lowering was about to run on "
        "the CPU (copying its inputs to the host and back), which strict mode forbids "
        "everywhere, inside or outside steps.",
        cause="The model uses an operator torch_pjrt does not lower yet (the message names "
        "it and your source line) while torch_pjrt.strict() or TORCH_PJRT_STRICT=1 is active.",
        fix="Run without strict mode to see how often the fallback happens, replace the op "
        "with ops that have lowerings, or report the missing op; leave strict mode off "
        "around that code if the fallback is acceptable.",
        doc="docs/fallback.md#making-it-an-error",
    ),
    Entry(
        "diagnostics-strict-host-sync",
        r"torch_pjrt strict mode: host sync inside step",
        meaning="Strict mode saw the host wait for the device inside a torch_pjrt.step() "
        "block after the warm-up steps, at the line the message names.",
        cause="A .item(), .cpu(), .tolist(), print of a tensor, bool(tensor) (e.g. an `if` "
        "on a tensor), an explicit synchronize, or an op whose output shape depends on "
        "tensor values (nonzero, masked indexing) inside the training step.",
        fix="Move the read out of the step block, e.g. log the loss every N steps outside "
        "torch_pjrt.step(), and replace data-dependent shapes with fixed-shape ops such as "
        "torch.where.",
        doc="docs/modes.md#strict-mode-no-silent-slowdowns",
    ),
    Entry(
        "diagnostics-strict-new-compilation",
        r"torch_pjrt strict mode: new XLA compilation inside step",
        meaning="Strict mode saw a new XLA program being compiled inside a "
        "torch_pjrt.step() block after the warm-up steps, so this step is not reusing the "
        "programs compiled before.",
        cause="Something changed between steps: input shapes (variable batch or sequence "
        "length), dtypes, or non-tensor arguments such as Python scalars that are baked "
        "into the program; or the step needs more warm-up steps than "
        "settings.strict_warmup allows.",
        fix="Keep shapes and dtypes fixed (pad inputs to a few bucket sizes) and pass "
        "changing scalars as tensors; if later steps legitimately compile, raise "
        "settings.strict_warmup (TORCH_PJRT_STRICT_WARMUP).",
        doc="docs/modes.md#strict-mode-no-silent-slowdowns",
    ),
    Entry(
        "diagnostics-strict-mode-error",
        r"\bStrictModeError\b",
        meaning="torch_pjrt.StrictModeError (a RuntimeError) is raised by strict mode for "
        "a slowdown that would otherwise pass silently: a CPU fallback anywhere, or a host "
        "sync or new compilation inside a torch_pjrt.step() after the warm-up steps.",
        cause="torch_pjrt.strict() or TORCH_PJRT_STRICT=1 is on and the program hit one of "
        "those events; the message says which, and at which source line.",
        fix="Fix the line the message names (see the specific entry for fallback, host "
        "sync or compilation), or turn strict mode off for that code with "
        "torch_pjrt.strict(False).",
        doc="docs/modes.md#strict-mode-no-silent-slowdowns",
        classes=("StrictModeError",),
    ),
    # --- distributed: module --------------------------------------------------------
    Entry(
        "distributed-no-such-attribute",
        r"module 'torch_pjrt\.distributed' has no attribute",
        meaning="The name asked of torch_pjrt.distributed is not one it provides; it only "
        "exports register() and the single-process SPMD API (Mesh, Sharding, device_mesh, "
        "distribute_tensor, mark_sharding, sharding_of, distribute_module).",
        cause="Code expects torch.distributed or DTensor names (init_process_group, "
        "DTensor, Shard, init_device_mesh) in torch_pjrt.distributed, or a name is "
        "misspelled.",
        fix="Import process-group and placement APIs from torch.distributed (e.g. "
        "`from torch.distributed.tensor import Shard, Replicate`) and use "
        "torch_pjrt.distributed only for its SPMD functions.",
        doc="docs/spmd.md#the-api-torch_pjrtdistributed",
    ),
    # --- distributed: process group -------------------------------------------------
    Entry(
        "distributed-reduce-op-unsupported",
        r"(?:pjrt process group: \S+ does not support ReduceOp\.|pjrt: functional "
        r"collectives do not support reduce_op)",
        meaning="The reduction op asked of a pjrt collective is not one the pjrt group implements.",
        cause="A ReduceOp outside SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR and "
        "PREMUL_SUM was passed to a collective; for functional collectives (the ones "
        "DTensor calls) the reduce_op string must name one of SUM, AVG, PRODUCT, MIN, MAX, "
        "BAND, BOR, BXOR.",
        fix="Use one of the supported reduce ops, e.g. dist.ReduceOp.SUM and divide "
        "afterwards instead of an unsupported op.",
        doc="docs/distributed.md#what-works-measured",
    ),
    Entry(
        "distributed-mixed-device-tensors",
        r"a collective's tensors must all be pjrt tensors or all CPU tensors",
        meaning="One collective call received a mix of pjrt tensors and tensors on another "
        "device; the pjrt group runs all-pjrt calls itself and all-CPU calls through its "
        "gloo group, but cannot mix them.",
        cause="An output or input list where some tensors were left on the CPU (or are on "
        "another device) while others were moved to pjrt, e.g. outputs made with "
        "torch.empty_like on a CPU tensor.",
        fix="Put every tensor of the call on the same side: move them all to 'pjrt' (or "
        "all to the CPU) before calling the collective.",
        doc="docs/distributed.md#what-works-measured",
    ),
    Entry(
        "distributed-bitwise-reduce-needs-integer",
        r"with a bitwise ReduceOp needs an integer or bool tensor",
        meaning="A BAND, BOR or BXOR reduction was asked of a floating-point tensor; "
        "bitwise reductions are only defined for integer and bool tensors.",
        cause="A bitwise ReduceOp used on a float tensor, for example to combine flags "
        "that were stored as floats.",
        fix="Convert the tensor to an integer or bool dtype before the collective (e.g. "
        "`flags.to(torch.int32)`), or use MAX/MIN for float flags.",
        doc="docs/distributed.md#what-works-measured",
    ),
    Entry(
        "distributed-bool-reduce-op",
        r"of bool tensors supports MIN, MAX, BAND, BOR and BXOR",
        meaning="A SUM or PRODUCT reduction was asked of a bool tensor, which the pjrt "
        "group does not do.",
        cause="Summing a boolean mask across ranks (e.g. to count ranks where something is "
        "true) or multiplying bools with PRODUCT.",
        fix="Use MAX/BOR (any rank) or MIN/BAND (all ranks) on bool tensors, or convert to "
        "an integer dtype first (`mask.to(torch.int32)`) to count with SUM.",
        doc="docs/distributed.md#what-works-measured",
    ),
    Entry(
        "distributed-avg-needs-float",
        r"with ReduceOp\.\S+ needs a floating point tensor",
        meaning="ReduceOp.AVG or ReduceOp.PREMUL_SUM was asked of a tensor that is not "
        "floating point; the pjrt group only averages or premultiplies float16, bfloat16, "
        "float32 and float64 tensors.",
        cause="Averaging integer counters or step counts across ranks, or a PREMUL_SUM "
        "gradient reduction on an integer tensor.",
        fix="Convert the tensor to a floating dtype before the collective, or use SUM and "
        "divide by the world size yourself.",
        doc="docs/distributed.md#not-done-yet",
    ),
    Entry(
        "distributed-dtype-unsupported",
        r"pjrt process group: \S+ does not support dtype",
        meaning="A collective on the pjrt group got a tensor whose dtype it does not "
        "handle; it supports float32/64, float16, bfloat16, int8, uint8, int16, int32, "
        "int64 and bool.",
        cause="A tensor of another dtype (a complex, float8, uint16/32/64 or quantized "
        "tensor) passed to a collective.",
        fix="Cast the tensor to a supported dtype before the collective (e.g. view "
        "complex as real with torch.view_as_real, or float8 as uint8) and cast back after.",
        doc="docs/distributed.md#what-works-measured",
    ),
    Entry(
        "distributed-one-tensor-per-process",
        r"pjrt process group: \S+ takes one tensor per process",
        meaning="A collective got a list with other than one tensor (or tensor list) per "
        "process; the pjrt group drives one device per process, so the old multi-device "
        "list forms of the C++ API take exactly one entry.",
        cause="Calling the ProcessGroup methods directly with several tensors per call, or "
        "code written for one process driving several GPUs.",
        fix="Pass one tensor per call through the torch.distributed functions "
        "(dist.all_reduce(t), dist.broadcast(t, src)), or use "
        "all_reduce_coalesced for several tensors.",
        doc="docs/distributed.md#what-works-measured",
    ),
    Entry(
        "distributed-collective-list-mismatch",
        r"pjrt process group: (?:all_gather|gather|scatter|reduce_scatter|all_to_all) "
        r"(?:needs|supports) .{0,60}? of (?:the (?:input|output)'s|one) shape and dtype",
        meaning="A list-form collective (all_gather, gather, scatter, reduce_scatter, "
        "all_to_all) got a tensor list of the wrong length, or tensors whose shape or dtype "
        "differ from the other side of the call.",
        cause="The list does not hold one tensor per rank of the group, or it was "
        "preallocated with another shape or dtype than the tensor being sent (for gather "
        "and scatter, on the destination or source rank); all_to_all with tensors of "
        "different shapes is also refused.",
        fix="Pass world_size tensors each shaped and typed like the single tensor, e.g. "
        "`outs = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]`; for "
        "uneven pieces pad them to one shape.",
        doc="docs/distributed.md#what-works-measured",
    ),
    Entry(
        "distributed-collective-size-mismatch",
        r"pjrt process group: (?:all_gather_into_tensor needs an output of world size|"
        r"reduce_scatter_tensor needs an input of world size|all_to_all_single needs an "
        r"output of the input's shape)",
        meaning="A single-tensor collective got an output and input whose sizes or dtypes "
        "do not fit: all_gather_into_tensor's output must hold world_size times the "
        "input's elements, reduce_scatter_tensor's input world_size times the output's, "
        "and all_to_all_single's output must have the input's shape; dtypes must be equal.",
        cause="The output (or input) buffer was allocated for another world size or group, "
        "with the wrong dtype, or sized by the per-rank count instead of the total.",
        fix="Allocate the buffer from the other tensor, e.g. "
        "`out = inp.new_empty((world * inp.shape[0], *inp.shape[1:]))` for "
        "all_gather_into_tensor, with world = dist.get_world_size(group).",
        doc="docs/distributed.md#what-works-measured",
    ),
    Entry(
        "distributed-all-to-all-uneven",
        r"all_to_all_single (?:supports only equal splits of dim 0|with uneven split sizes "
        r"in a compiled graph|needs dim 0 divisible by ranks)",
        meaning="all_to_all_single on pjrt, eager or inside a torch.compile graph, only "
        "exchanges equal blocks: dim 0 must divide by the group size and every split size "
        "must be the same.",
        cause="Uneven input_split_sizes/output_split_sizes (as in mixture-of-experts token "
        "routing), a dim 0 that does not divide by the number of ranks, or a 0-d tensor.",
        fix="Pad each rank's chunk to a common size so the splits are equal (and dim 0 is "
        "a multiple of the world size), then drop the padding after the exchange; or omit "
        "the split sizes.",
        doc="docs/distributed.md#not-done-yet",
    ),
    Entry(
        "distributed-jax-single-process",
        r"pjrt process group: JAX has no devices for rank",
        meaning="The pjrt process group spans several processes, but JAX in this process "
        "only knows its own devices: JAX's distributed runtime was never started, so the "
        "other ranks' devices are missing.",
        cause="The process made a pjrt tensor (or otherwise started the pjrt runtime) "
        "before init_process_group, outside torchrun's environment, so JAX started as a "
        "single process; or TORCH_PJRT_DISTRIBUTED=0 turned the start-up off.",
        fix="Call dist.init_process_group('pjrt') before the first pjrt tensor, or launch "
        "with torchrun so RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are set when "
        "torch_pjrt starts.",
        doc="docs/distributed.md#launching",
    ),
    Entry(
        "distributed-rank-device-mismatch",
        r"pjrt process group: rank \S+ pjrt:\S+ is .*?, but JAX places rank",
        meaning="The group builds its mesh by taking, for each rank, the JAX device at the "
        "same local index among that rank's devices, and for this rank that is not the "
        "device behind the tensor's pjrt index.",
        cause="Processes see their devices differently, e.g. a custom "
        "jax.distributed.initialize with other local_device_ids, device visibility "
        "settings that differ between ranks, or collectives on a pjrt index other than "
        "the one every rank uses.",
        fix="Give every process the same view (one device per process, as torchrun with "
        "torch_pjrt's own start-up does) and run each rank's collectives on the same "
        "local device index.",
        doc="docs/distributed.md#launching",
    ),
    Entry(
        "distributed-collective-mismatch",
        r"pjrt process group: the ranks called different collectives",
        meaning="Before a collective, the ranks exchanged what they were about to call and "
        "found differences: another collective, another order, or other shapes, dtypes or "
        "options; every rank raises this before any device work, so the group stays usable.",
        cause="Rank-dependent control flow (an `if rank == 0:` around a collective, "
        "different numbers of batches per rank, skipped steps) or inputs whose shapes "
        "differ between ranks, e.g. an uneven last batch.",
        fix="Make every rank call the same collectives in the same order with the same "
        "shapes and dtypes: drop or pad uneven batches (DistributedSampler with "
        "drop_last=True) and keep collectives out of rank-specific branches.",
        doc="docs/distributed.md#faults-and-timeouts",
    ),
    # --- distributed: functional collectives ---------------------------------------
    Entry(
        "distributed-functional-needs-pjrt-group",
        r"pjrt: a functional collective on pjrt tensors needs a pjrt process group",
        meaning="A functional collective (torch.distributed._functional_collectives, what "
        "DTensor calls) ran on pjrt tensors with a group that is not a pjrt process group.",
        cause="A DeviceMesh or group created with another backend (e.g. gloo or nccl, or "
        "init_device_mesh('cpu', ...)) used with tensors on pjrt.",
        fix="Create the group with the pjrt backend: init_process_group('pjrt') (or a plain "
        "init_process_group()), new_group(backend='pjrt'), or "
        "init_device_mesh('pjrt', shape).",
        doc="docs/distributed.md#functional-collectives-eager",
    ),
    Entry(
        "distributed-functional-group-size",
        r"pjrt: \S+ got group_size=\S+ for a group of",
        meaning="A functional all_gather_into_tensor or reduce_scatter_tensor was told a "
        "group_size that differs from the number of ranks in the group it names.",
        cause="A hard-coded or stale group size passed to the functional collective, or the "
        "size of one mesh dimension passed with the group of another.",
        fix="Pass the group's own size, e.g. `group_size=dist.get_world_size(group)` or "
        "`mesh.size(dim)` for the same mesh dimension as the group.",
        doc="docs/distributed.md#functional-collectives-eager",
    ),
    Entry(
        "distributed-functional-reduce-scatter-dim0",
        r"pjrt: reduce_scatter_tensor needs dim 0 of the input \(.*?\) divisible by the "
        r"group size",
        meaning="A functional reduce_scatter_tensor must split the input's dim 0 into one "
        "equal block per rank, and this input's dim 0 does not divide by the group size "
        "(or the input is 0-d).",
        cause="An input whose first dimension is not a multiple of the number of ranks, "
        "e.g. a parameter or batch size that does not split evenly.",
        fix="Pad dim 0 to a multiple of the group size before the call (and trim the "
        "result), or choose a group size that divides it.",
        doc="docs/distributed.md#functional-collectives-eager",
    ),
    # --- distributed: SPMD in one process ------------------------------------------
    Entry(
        "distributed-mesh-shape-invalid",
        r"device_mesh: mesh_shape must be positive ints",
        meaning="device_mesh() got a mesh shape that is empty or has a size that is not a "
        "positive int.",
        cause="A zero, negative, float or None size in mesh_shape (e.g. a size computed "
        "with `/` instead of `//`), or an empty tuple.",
        fix="Pass a tuple of positive ints whose product is the device count, e.g. "
        "`device_mesh((2, torch.pjrt.device_count() // 2))`.",
        doc="docs/spmd.md#the-api-torch_pjrtdistributed",
    ),
    Entry(
        "distributed-mesh-device-count",
        r"device_mesh: a mesh of shape .*? needs .*? devices, but the .*? platform has",
        meaning="A mesh must cover all of this process's pjrt devices, and the product of "
        "the requested shape differs from the number of devices the platform has.",
        cause="A mesh shape written for another machine, or running on the CPU platform, "
        "which has one device unless told otherwise.",
        fix="Choose a shape whose product is torch.pjrt.device_count(); on the CPU platform "
        "set TORCH_PJRT_CPU_DEVICES=N (or XLA_FLAGS=--xla_force_host_platform_device_count=N) "
        "before the program starts.",
        doc="docs/spmd.md#the-api-torch_pjrtdistributed",
    ),
    Entry(
        "distributed-mesh-dim-names",
        r"device_mesh: expected \S+ distinct mesh_dim_names",
        meaning="device_mesh() needs one name per mesh dimension, all different, and the "
        "names given do not fit.",
        cause="mesh_dim_names has a different length than mesh_shape, or repeats a name; "
        "a single string passed as names is split into its characters.",
        fix="Pass a tuple with one distinct name per dimension, e.g. "
        "`device_mesh((2, 4), ('data', 'model'))`, or leave the names out.",
        doc="docs/spmd.md#the-api-torch_pjrtdistributed",
    ),
    Entry(
        "distributed-spmd-not-a-mesh",
        r"expected a torch_pjrt Mesh \(device_mesh\(\.\.\.\)\), got",
        meaning="mark_sharding or distribute_tensor was given a mesh object that is not a "
        "torch_pjrt Mesh.",
        cause="Passing a PyTorch DeviceMesh (init_device_mesh) or a jax.sharding.Mesh to "
        "the single-process SPMD functions.",
        fix="Build the mesh with torch_pjrt.distributed.device_mesh(shape, names) and pass "
        "that; PyTorch DeviceMeshes are for the multi-process pjrt backend.",
        doc="docs/spmd.md#the-api-torch_pjrtdistributed",
    ),
    Entry(
        "distributed-spmd-placements-length",
        r"`placements` must have the same length as `device_mesh\.ndim`",
        meaning="Placements are one per mesh dimension, and the number given differs from "
        "the mesh's number of dimensions.",
        cause="Giving one placement per tensor dimension instead of per mesh dimension, or "
        "reusing placements written for a mesh of another rank.",
        fix="Pass exactly mesh.ndim placements, e.g. `[Shard(0), Replicate()]` for a 2-D mesh.",
        doc="docs/spmd.md#the-api-torch_pjrtdistributed",
    ),
    Entry(
        "distributed-spmd-not-a-tensor",
        r"(?:mark_sharding|sharding_of|distribute_tensor): expected a torch\.Tensor, but got",
        meaning="An SPMD function (mark_sharding, sharding_of, distribute_tensor) was "
        "called with something that is not a torch.Tensor.",
        cause="Passing a module, a numpy array, a list or None where a tensor is expected, "
        "e.g. a layer instead of its weight.",
        fix="Pass a tensor, e.g. `mark_sharding(model.fc1.weight, mesh, ...)`; convert "
        "arrays with torch.as_tensor first; for whole modules use distribute_module.",
        doc="docs/spmd.md#the-api-torch_pjrtdistributed",
    ),
    Entry(
        "distributed-spmd-not-on-pjrt",
        r"(?:mark_sharding|sharding_of): expected a tensor on a pjrt device, but got one on",
        meaning="mark_sharding and sharding_of work on pjrt tensors only, and the tensor "
        "given is on another device.",
        cause="Calling mark_sharding on a CPU tensor, e.g. a model's parameter before "
        "model.to('pjrt').",
        fix="Move the tensor or model to 'pjrt' first, or use distribute_tensor, which "
        "copies a CPU tensor to pjrt and lays it out in one call.",
        doc="docs/spmd.md#the-api-torch_pjrtdistributed",
    ),
    Entry(
        "distributed-mark-sharding-view",
        r"mark_sharding: the tensor must be its whole storage",
        meaning="mark_sharding lays out a tensor's storage in place, so the tensor must be "
        "its entire storage, contiguous, with no offset and the same dtype; this one is a "
        "view of something larger or differently typed.",
        cause="Calling it on a slice, transpose, view or non-contiguous tensor, or on a "
        "parameter that shares a flattened buffer with others.",
        fix="Use distribute_tensor(view, mesh, placements) to get a new sharded copy, or "
        ".clone() the tensor first and mark the clone.",
        doc="docs/spmd.md#the-api-torch_pjrtdistributed",
    ),
    Entry(
        "distributed-sharding-of-no-mesh",
        r"sharding_of: a layout with no mesh",
        meaning="sharding_of found a tensor spread over several devices with a layout XLA "
        "chose that is neither a mesh layout nor fully replicated, so it cannot be "
        "described as placements.",
        cause="A result of a computation on sharded tensors whose layout the partitioner "
        "expressed in its own form rather than as a mesh sharding.",
        fix="Give the tensor an explicit layout with mark_sharding or distribute_tensor "
        "before asking for its sharding, or avoid calling sharding_of on that result.",
        doc="docs/spmd.md#how-it-maps-to-jax-and-gspmd",
    ),
    Entry(
        "distributed-spmd-placement-unsupported",
        r"placement \S+ is not supported on pjrt SPMD",
        meaning="The single-process SPMD path understands only Shard(dim) and Replicate() "
        "placements.",
        cause="A Partial() placement, or another placement type (such as a strided or "
        "custom shard), passed to mark_sharding, distribute_tensor or distribute_module.",
        fix="Use Shard(dim) or Replicate() for every mesh dimension; reduce partial values "
        "yourself before laying them out.",
        doc="docs/spmd.md#supported-and-not-yet",
    ),
    Entry(
        "distributed-spmd-shard-dim-out-of-range",
        r"Dimension out of range \(expected to be in range of .*?\): .*? on a \S+-d tensor",
        meaning="A Shard(dim) placement names a dimension the tensor does not have.",
        cause="Placements written for tensors of another rank, e.g. Shard(1) applied to a "
        "1-D bias while sharding a weight the same way.",
        fix="Pick a dim between -t.dim() and t.dim()-1 for each tensor, e.g. Shard(0) for "
        "biases when the weight uses Shard(0).",
        doc="docs/spmd.md#the-api-torch_pjrtdistributed",
    ),
    Entry(
        "distributed-spmd-uneven-shards",
        r"pjrt SPMD needs even shards",
        meaning="A sharded tensor dimension must split into equal pieces, and its size does "
        "not divide by the number of devices along the mesh dimensions that shard it.",
        cause="A batch, vocabulary or hidden size that is not a multiple of the mesh "
        "dimension size (or of the product, when several mesh dimensions shard one "
        "tensor dimension).",
        fix="Pad that dimension to a multiple of the mesh size, shard another dimension, or "
        "replicate the tensor on that mesh dimension.",
        doc="docs/spmd.md#supported-and-not-yet",
    ),
    # --- serving (vLLM plugin) -----------------------------------------------------
    Entry(
        "serving-attention-feature-unsupported",
        r"pjrt attention: \S+ not supported",
        meaning="The model asks the pjrt attention backend for something it does not "
        "implement: ALiBi position biases, attention sinks, or an attention type other "
        "than decoder self-attention (encoder, encoder-only, cross attention).",
        cause="Serving a model that uses ALiBi (e.g. BLOOM, MPT), attention sinks, or an "
        "encoder or encoder-decoder architecture with vLLM on pjrt.",
        fix="Serve a decoder-only model with rotary or learned positions and no sinks on "
        "pjrt, or run this model on a platform whose attention backend supports the feature.",
        doc="docs/serving.md#not-supported-yet",
    ),
    Entry(
        "serving-attention-output-quantization",
        r"pjrt attention: fused output quantization",
        meaning="vLLM asked the pjrt attention backend to quantize its output inside the "
        "attention call (an output scale was passed), which the backend does not do.",
        cause="A vLLM compilation pass that fuses attention with the quantization of its "
        "output (pass_config fuse_attn_quant) was turned on.",
        fix="Turn that fusion off: leave fuse_attn_quant unset or set it to False in "
        "the compilation config's pass_config.",
        doc="docs/serving.md#not-supported-yet",
    ),
    Entry(
        "serving-attention-padding-mismatch",
        r"pjrt attention: the batch has \S+ token rows and \S+ slots, but its metadata",
        meaning="An internal consistency check failed: the attention layer got fewer token "
        "rows or cache slots than the batch's attention metadata describes.",
        cause="The plugin's model runner and its attention metadata builder padded the "
        "batch to different sizes; this is a torch_pjrt bug, not a problem in your "
        "program.",
        fix="Report it to the torch_pjrt issue tracker with the model, the vLLM version "
        "and the engine arguments that reproduce it.",
        doc="docs/serving.md#what-the-plugin-does",
    ),
    Entry(
        "serving-kv-cache-spec-unsupported",
        r"pjrt: KV cache spec \S+ not supported",
        meaning="The model needs a KV cache kind that vLLM does not split into per-layer "
        "views, and the pjrt model runner only allocates caches that it does.",
        cause="A model whose layers use a special cache layout (e.g. some sparse-attention "
        "or hybrid architectures) served with vLLM on pjrt.",
        fix="Serve a model with standard per-layer attention KV caches on pjrt, or run this "
        "one on another vLLM platform.",
        doc="docs/serving.md#not-supported-yet",
    ),
    Entry(
        "serving-mla-sparse-attention",
        r"pjrt: multi-head latent attention and sparse attention are not supported",
        meaning="The model uses multi-head latent attention (MLA) or sparse attention, which "
        "the pjrt attention backend does not implement.",
        cause="Serving a DeepSeek-style model (MLA) or a model with sparse attention with "
        "vLLM on pjrt.",
        fix="Serve a model with standard multi-head or grouped-query attention on pjrt, or "
        "run this one on a platform with an MLA backend.",
        doc="docs/serving.md#not-supported-yet",
    ),
    Entry(
        "serving-attention-backend-unavailable",
        r"pjrt: attention backend \S+ is not available on pjrt",
        meaning="An attention backend other than pjrt's own was requested; on pjrt only the "
        "plugin's attention backend can run.",
        cause="--attention-backend (or the attention backend setting) names a backend such "
        "as FLASH_ATTN or FLASHINFER, often copied from a CUDA launch command.",
        fix="Remove --attention-backend (and any attention-backend setting or "
        "environment variable) so the pjrt backend is chosen.",
        doc="docs/serving.md#not-supported-yet",
    ),
    Entry(
        "serving-feature-unsupported",
        r"pjrt: .*? is not supported by vLLM on pjrt yet",
        meaning="The vLLM engine was configured with features the pjrt plugin does not "
        "support yet; the message lists them.",
        cause="LoRA (--enable-lora), speculative decoding (--speculative-config), a "
        "quantized checkpoint, or tensor/pipeline parallelism (world size above 1) in the "
        "engine arguments.",
        fix="Run without the listed features: drop the flag, serve an unquantized "
        "checkpoint, and use tensor_parallel_size=1 and pipeline_parallel_size=1.",
        doc="docs/serving.md#not-supported-yet",
    ),
    Entry(
        "serving-no-kv-cache-memory",
        r"pjrt: no memory left for the KV cache",
        meaning="After loading the model and running a profiling step, the share of device "
        "memory vLLM may use (gpu_memory_utilization) leaves no bytes for the KV cache.",
        cause="The model's weights and activations take more than gpu_memory_utilization "
        "times the device's memory, e.g. a model too large for the chip or a low "
        "utilization setting.",
        fix="Raise --gpu-memory-utilization, give the cache an explicit size with "
        "--kv-cache-memory-bytes, or lower max_num_batched_tokens / use a smaller model "
        "or lower precision.",
        doc="docs/serving.md#what-the-plugin-does",
    ),
    # === compile/, device/, export, migrate ==================================
    # --- torch.compile ---------------------------------------------------------------
    Entry(
        "compile-unknown-mode",
        r"torch\.compile mode must be one of .*?, got",
        meaning="torch.compile was given a mode= value that the pjrt backend does not know.",
        cause="A typo in mode=, or a mode name from another backend; the pjrt backend accepts "
        "'default', 'reduce-overhead', 'max-autotune' and 'max-autotune-no-cudagraphs'.",
        fix="Pass one of those names (or leave mode= out); only 'reduce-overhead' changes what "
        "the pjrt backend does, the others compile as the default.",
        doc="docs/compile.md",
    ),
    Entry(
        "compile-backend-options",
        r"the pjrt backend takes no options, got",
        meaning="torch.compile(..., backend='pjrt') was called with options=, and the pjrt "
        "backend has no options to set.",
        cause="An options={...} dict carried over from inductor (e.g. triton or "
        "max_autotune settings) while switching the backend to 'pjrt'.",
        fix="Remove the options= argument; choose the behaviour with mode= "
        "(e.g. mode='reduce-overhead') instead.",
        doc="docs/compile.md",
    ),
    Entry(
        "compile-graph-op-without-lowering",
        r"\S+ \(from .*?\) has no pjrt lowering",
        meaning="A node of a traced graph calls an ATen op that has no lowering torch_pjrt can "
        "put inside one XLA program; the message names the op and the user's source line.",
        cause="With torch.compile such ops are normally split out and run eagerly between the "
        "compiled parts, so this mostly appears wrapped in a torch_pjrt.export error, for a "
        "model that uses an op with no lowering and no decomposition.",
        fix="Replace the named call at the named line with ops that have lowerings; if it came "
        "from torch.compile rather than export, report it as a torch_pjrt bug with the op name.",
        doc="docs/compile.md#what-is-compiled-and-what-is-not",
    ),
    Entry(
        "compile-collectives-several-groups",
        r"collectives of several process groups in one graph",
        meaning="A graph that torch_pjrt tried to build as one SPMD program holds functional "
        "collectives over more than one process group, which one program cannot run.",
        cause="torch.compile normally splits such graphs and runs their collectives as programs "
        "of their own, so this is mostly seen through torch_pjrt.export of a model with "
        "collectives over different groups (e.g. tensor and data parallel groups).",
        fix="Export or compile a model whose collectives name a single pjrt group, or keep the "
        "multi-group part in eager PyTorch; report it if plain torch.compile raised it.",
        doc="docs/distributed.md#functional-collectives-inside-torchcompile",
    ),
    Entry(
        "compile-unsupported-node",
        r"compile\.nodes\.Unsupported",
        meaning="torch_pjrt.compile.nodes.Unsupported: a node of an FX graph cannot be put into "
        "a traced XLA program (an op with no lowering, or collectives of several groups).",
        cause="torch.compile partitions such nodes out before building programs, so it usually "
        "surfaces from torch_pjrt.export, which turns it into a NotImplementedError naming "
        "the op and line.",
        fix="Read the message for the op and source line, and replace that call or keep that "
        "step in eager PyTorch; if torch.compile raised it directly, report it as a bug.",
        doc="docs/compile.md#what-is-compiled-and-what-is-not",
        classes=("Unsupported",),
    ),
    # --- devices ---------------------------------------------------------------------
    Entry(
        "device-tensors-on-two-devices",
        r"Expected all tensors to be on the same device, but found at least two devices",
        meaning="One op (or a compiled graph, or a loaded exported program) received tensors "
        "that live on different devices, e.g. pjrt:0 and cpu, or pjrt:0 and pjrt:1.",
        cause="A tensor that was not moved with the model: a CPU tensor with dimensions in an "
        "eager op (0-dim CPU scalars are accepted), a tensor on another pjrt index, or mixed "
        "CPU and pjrt inputs to a loaded export.",
        fix="Move every input to the same device before the call, e.g. x.to('pjrt') or "
        "x.to(model_param.device); for an exported program pass all inputs on the CPU or all "
        "on one pjrt device.",
        doc="docs/device_api.md#devices",
    ),
    Entry(
        "device-graph-capture-error-mode",
        r"capture_error_mode must be 'global', 'thread_local', 'relaxed' or 'default'",
        meaning="Graph.capture_begin() or torch.pjrt.graph() got a capture_error_mode value "
        "outside the accepted names.",
        cause="A typo, or a value that is not one of CUDA's capture error modes.",
        fix="Pass capture_error_mode='global' (the default), 'thread_local' or 'relaxed', or "
        "leave it out; pjrt accepts these for compatibility and checks every thread anyway.",
        doc="docs/graphs.md#the-api",
    ),
    Entry(
        "device-graphed-callables-autocast-cache",
        r"make_graphed_callables does not support the autocast caching",
        meaning="make_graphed_callables was called inside an autocast region whose weight-cast "
        "cache is on, which it refuses (as torch.cuda does).",
        cause="Calling torch.pjrt.make_graphed_callables under torch.autocast(...) with the "
        "default cache_enabled=True.",
        fix="Use torch.autocast(device_type, ..., cache_enabled=False) around the graphing "
        "call, or graph the callables outside autocast.",
        doc="docs/graphs.md#the-api",
    ),
    Entry(
        "device-graphed-callables-count",
        r"make_graphed_callables got \S+ callables and \S+ tuples of sample arguments",
        meaning="make_graphed_callables received a tuple of callables and a sample_args "
        "sequence of a different length; each callable needs its own tuple of samples.",
        cause="Passing one flat tuple of tensors for several callables, or forgetting a "
        "callable's sample tuple.",
        fix="Pass sample_args as a tuple with one tuple of tensors per callable, in the same "
        "order; for a single callable pass it alone with one tuple of tensors.",
        doc="docs/graphs.md#the-api",
    ),
    Entry(
        "device-graphed-callables-module-hooks",
        r"make_graphed_callables: a module with registered hooks cannot be graphed",
        meaning="The module given to make_graphed_callables has forward, forward-pre or "
        "backward hooks, which would run only during the capture and never on replay.",
        cause="Hooks added by the program or a library (profiling, activation checkpointing, "
        "logging) on the module being graphed.",
        fix="Remove the hooks before graphing (keep the handle from register_*_hook and call "
        ".remove()), or move their work into the module's forward.",
        doc="docs/graphs.md#the-api",
    ),
    Entry(
        "device-graph-already-captured",
        r"This Graph instance already holds a captured graph",
        meaning="capture_begin() (or a torch.pjrt.graph block) was started on a Graph that "
        "already holds a finished capture.",
        cause="Reusing one torch.pjrt.Graph object for a second capture, e.g. capturing inside "
        "a loop.",
        fix="Call g.reset() before capturing again, or make a new torch.pjrt.Graph() for the "
        "second capture.",
        doc="docs/graphs.md#the-api",
    ),
    Entry(
        "device-graph-end-without-begin",
        r"Graph\.capture_end\(\) called without a capture_begin\(\)",
        meaning="capture_end() was called on a Graph that has no capture under way.",
        cause="Manual capture_begin()/capture_end() calls that are unbalanced, e.g. "
        "capture_end() called twice or after reset().",
        fix="Pair each capture_begin() with one capture_end(), or use the "
        "`with torch.pjrt.graph(g):` block, which does both.",
        doc="docs/graphs.md#the-api",
    ),
    Entry(
        "device-graph-capture-abandoned",
        r"the graph capture was abandoned by an error during it",
        meaning="capture_end() found that the capture had already been dropped because an op "
        "inside it raised; nothing was captured.",
        cause="Something the capture cannot record (a host read such as .item(), a CPU-to-"
        "device copy, a CPU fallback op) raised a CaptureError, and the code caught it and "
        "went on to capture_end().",
        fix="Find the earlier error (raised at the offending line) and move that work out of "
        "the captured region; do not swallow exceptions inside a capture.",
        doc="docs/graphs.md#what-cannot-be-captured",
    ),
    Entry(
        "device-graph-replay-during-capture",
        r"Graph\.replay\(\) during another graph's capture",
        meaning="A torch.pjrt.Graph was replayed while another graph was being captured; a "
        "replay cannot be recorded into a capture.",
        cause="Calling g1.replay() (directly, or through a graphed callable) inside a "
        "`with torch.pjrt.graph(g2):` block.",
        fix="Replay the other graph before or after the capture, or capture the original code "
        "instead of its replay inside the new region.",
        doc="docs/graphs.md#what-cannot-be-captured",
    ),
    Entry(
        "device-graph-not-captured",
        r"Called Graph\.replay\(\) without a preceding successful capture",
        meaning="replay(), instantiate() or debug_dump() was called on a torch.pjrt.Graph "
        "that holds no captured graph.",
        cause="The capture never ran, failed with an exception, or the graph was reset() since.",
        fix="Capture first with `with torch.pjrt.graph(g): ...` and make sure it finishes "
        "without an error before calling g.replay().",
        doc="docs/graphs.md#the-api",
    ),
    Entry(
        "device-graph-wrong-graph-type",
        r"torch\.pjrt\.graph takes a torch\.pjrt\.Graph, got",
        meaning="torch.pjrt.graph(...) was given something other than a torch.pjrt.Graph "
        "to capture into.",
        cause="Passing a torch.cuda.CUDAGraph, None, or a callable instead of a graph object.",
        fix="Create the graph with g = torch.pjrt.Graph() and write `with torch.pjrt.graph(g):`.",
        doc="docs/graphs.md#the-api",
    ),
    Entry(
        "device-graph-optimizer-not-capturable",
        r"\.step\(\) with capturable=False keeps its step count on the CPU",
        meaning="An optimizer step was captured while the optimizer keeps its step counter on "
        "the CPU, so every replay would reuse the same bias correction.",
        cause="An optimizer (e.g. Adam or AdamW) created with capturable=False, the default, "
        "and without fused=True, stepped inside a capture.",
        fix="Create the optimizer with capturable=True (or fused=True), and run one step "
        "before the capture so its state exists.",
        doc="docs/graphs.md#what-a-capture-records",
    ),
    Entry(
        "device-graphed-callables-sample-not-pjrt",
        r"make_graphed_callables: sample arguments must be pjrt tensors",
        meaning="A sample argument given to make_graphed_callables is not a tensor on a pjrt "
        "device.",
        cause="A CPU tensor, a Python number or another object among sample_args.",
        fix="Pass only pjrt tensors as sample_args (x.to('pjrt')); bind non-tensor settings "
        "with functools.partial or a closure before graphing.",
        doc="docs/graphs.md#the-api",
    ),
    Entry(
        "device-graphed-callable-keywords",
        r"a graphed callable takes positional tensor arguments only",
        meaning="A callable returned by make_graphed_callables was called with keyword arguments.",
        cause="Calling the graphed module as model(input_ids=x) while it was graphed from "
        "positional sample arguments.",
        fix="Call it with the same positional tensors, in the same order, as the sample_args "
        "it was graphed with.",
        doc="docs/graphs.md#the-api",
    ),
    Entry(
        "device-graphed-callable-structure",
        r"a graphed callable was captured with arguments .*?, got",
        meaning="The arguments passed to a graphed callable have a different number or nesting "
        "than the sample_args it was captured with.",
        cause="Passing more or fewer tensors, or a list where a tuple (or a nested structure) "
        "was sampled.",
        fix="Call it with exactly the structure of sample_args, or graph another callable for "
        "the new argument structure.",
        doc="docs/graphs.md#the-api",
    ),
    Entry(
        "device-graphed-callable-shape",
        r"a graphed callable's argument \S+ is .*?but it was captured with",
        meaning="An argument of a graphed callable differs in shape, dtype or device from the "
        "sample it was captured with; a replay only runs on the captured shapes.",
        cause="A last batch of a different size, a different sequence length, or an input cast "
        "to another dtype.",
        fix="Pad or cast inputs to the captured shape and dtype (e.g. drop_last=True in the "
        "DataLoader), or graph a separate callable for each shape.",
        doc="docs/graphs.md#what-cannot-be-captured",
    ),
    Entry(
        "device-guard-build-failed",
        r"device guard could not be built or loaded|building the C\+\+ device guard",
        meaning="Building torch_pjrt's C++ device guard with the C++ compiler failed; "
        "torch_pjrt keeps the Python guard, which knows one device and no events.",
        cause="No working C++ compiler, a $CXX that points to a wrong program, or PyTorch "
        "headers/libc10 missing from the torch install.",
        fix="Install a C++17 compiler (e.g. g++) or set CXX to one, then import torch_pjrt "
        "again; torch_pjrt.device.guard.native() and `torch-pjrt doctor` show the reason.",
        doc="docs/ecosystem.md#device-agnostic-code",
    ),
    Entry(
        "device-guard-build-timeout",
        r"(?:device guard could not be built or loaded: )?\S+ took more than \S+ s\b",
        meaning="Compiling torch_pjrt's C++ device guard ran past its time limit (300 s) and "
        "was abandoned; the Python guard stays in place.",
        cause="A very slow or heavily loaded machine, or a compiler wrapper that hangs (e.g. "
        "waiting on a network license or a remote cache).",
        fix="Set CXX to a plain local compiler and import torch_pjrt again once the machine is "
        "less loaded; check the result with torch_pjrt.device.guard.native().",
        doc="docs/ecosystem.md#device-agnostic-code",
    ),
    Entry(
        "device-memory-history-unavailable",
        r"torch\.pjrt\.memory\.(?:_record_memory_history|_snapshot)\(\) "
        r"(?:cannot record|is not available) on the pjrt device",
        meaning="PyTorch's allocator history and snapshot tools do not work on pjrt: XLA owns "
        "the device memory and there is no caching allocator to record or list.",
        cause="Memory-debugging code (or a library) calling torch.cuda.memory._record_memory_"
        "history(enabled=...) or _snapshot()/_dump_snapshot() on the pjrt device.",
        fix="Use torch.pjrt.memory_stats() or torch.pjrt.memory_summary() for figures, and "
        "jax.profiler.save_device_memory_profile(path) for a profile of the live buffers.",
        doc="docs/device_api.md#memory",
    ),
    Entry(
        "device-expected-pjrt-device",
        r"Expected a pjrt device, got",
        meaning="A torch.pjrt function that takes a device argument (set_device, "
        "synchronize, memory figures, RNG state, streams) was given a device of another type.",
        cause="Passing 'cpu' or 'cuda' (without --cuda-compat) where torch.pjrt expects a pjrt "
        "device.",
        fix="Pass a pjrt index, 'pjrt:N', torch.device('pjrt', N), or None for the current "
        "pjrt device.",
        doc="docs/device_api.md#random-numbers",
    ),
    Entry(
        "device-rng-state-size",
        r"pjrt RNG state must be a uint8 tensor of 16 bytes",
        meaning="set_rng_state got a state tensor that is not the 16-byte (seed, offset) state "
        "of a pjrt device.",
        cause="Restoring a state from another generator, e.g. torch.get_rng_state() of the "
        "CPU, or a checkpoint entry saved for a different device.",
        fix="Save and restore pjrt states with torch.pjrt.get_rng_state() / "
        "torch.pjrt.set_rng_state() (or the *_all variants), and keep CPU states separate.",
        doc="docs/device_api.md#random-numbers",
    ),
    Entry(
        "device-event-timing-disabled",
        r"Both events must be created with argument 'enable_timing=True'",
        meaning="elapsed_time() was asked of events that were not created for timing.",
        cause="Creating torch.pjrt.Event() (or torch.Event) with the default "
        "enable_timing=False and then calling start.elapsed_time(end).",
        fix="Create both events with enable_timing=True, record them, then call "
        "start.elapsed_time(end).",
        doc="docs/device_api.md#streams-and-events",
    ),
    Entry(
        "device-event-not-recorded",
        r"Both events must be recorded before calculating elapsed time",
        meaning="elapsed_time() was called while at least one of the two events has not been "
        "recorded.",
        cause="Forgetting start.record() or end.record(), or calling elapsed_time before the "
        "end event was recorded.",
        fix="Call start.record() before and end.record() after the timed work, then "
        "start.elapsed_time(end).",
        doc="docs/device_api.md#streams-and-events",
    ),
    Entry(
        "device-host-oom-tensor-handle",
        r"pjrt: out of host memory for a tensor handle",
        meaning="torch_pjrt could not allocate the small host-side block that describes a new "
        "pjrt tensor: the process is out of host memory.",
        cause="Host RAM exhausted, e.g. by large CPU-side data, many live tensors, or, on the "
        "CPU platform, device data that itself lives in host memory.",
        fix="Free host memory (drop references to unused tensors, load data lazily, use a "
        "smaller batch) or run on a machine with more RAM.",
        doc="docs/internals.md#tensors-and-storage-cells-torch_pjrtdevicetensorpy",
    ),
    Entry(
        "device-tensor-without-pjrt-data",
        r"tensor on \S+ has no pjrt data",
        meaning="torch_pjrt was handed a tensor whose storage it did not create, so there is "
        "no device array behind it.",
        cause="A CPU or other-device tensor reaching a pjrt-only path, or a pjrt-typed tensor "
        "built by other means (a foreign DLPack capsule, a hand-made storage).",
        fix="Create tensors with torch ops on device='pjrt' or move them with .to('pjrt'); if "
        "ordinary PyTorch code triggers it, report it as a bug.",
        doc="docs/internals.md#tensors-and-storage-cells-torch_pjrtdevicetensorpy",
    ),
    Entry(
        "device-write-to-overlapping-tensor",
        r"some elements of the input tensor and the written-to tensor refer to a single "
        r"memory location",
        meaning="An in-place write targets a tensor in which several elements share one memory "
        "location, so the result would be ill-defined; PyTorch refuses this on every device.",
        cause="Writing in place into an expanded view (stride 0), e.g. x.expand(4, 3).add_(1) "
        "or an out= tensor made by expand().",
        fix="Clone the tensor first (x = x.expand(4, 3).clone()) or use the out-of-place op.",
        doc="docs/semantics.md#views-and-in-place-ops",
    ),
    # --- export ----------------------------------------------------------------------
    Entry(
        "export-save-path-is-file",
        r"torch_pjrt\.export\.save\(\): .*? exists and is not a directory",
        meaning="torch_pjrt.export.save() writes a directory, and the given path is an "
        "existing file.",
        cause="Passing a file name (e.g. model.pt or model.tflite) that already exists as the "
        "save path.",
        fix="Give a directory path that does not exist yet (or an existing directory to "
        "replace), e.g. save(ep, 'model_dir').",
        doc="docs/export.md#stablehlo",
    ),
    Entry(
        "export-parent-not-directory",
        r"cannot write .*?: .*? is not a directory",
        meaning="The export cannot create its output because a component of the path's folder "
        "is an existing file, not a directory.",
        cause="An output path such as 'weights.npz/model' whose parent is a file.",
        fix="Choose an output path whose parent folders are directories (or do not exist "
        "yet); nothing was written.",
        doc="docs/export.md",
    ),
    Entry(
        "export-parent-not-writable",
        r"cannot write .*?: .*? is not writable",
        meaning="The export refused before any work because the folder that would hold the "
        "output cannot be written by this process.",
        cause="Writing into a read-only or another user's folder (a system directory, a "
        "read-only mount).",
        fix="Write to a folder you own (e.g. under your home or working directory), or fix "
        "the folder's permissions.",
        doc="docs/export.md",
    ),
    Entry(
        "export-litert-not-module",
        r"torch_pjrt\.export\.to_litert\(\): expected a torch\.nn\.Module",
        meaning="to_litert() converts an nn.Module, and its first argument is something else.",
        cause="Passing a function, an ExportedProgram or a compiled wrapper instead of the module.",
        fix="Pass the nn.Module itself, e.g. to_litert(model, (x,), 'model.tflite'); for an "
        "ExportedProgram use torch_pjrt.export.save.",
        doc="docs/export.md#litert",
    ),
    Entry(
        "export-litert-example-args",
        r"torch_pjrt\.export\.to_litert\(\): example_args must be a tuple of tensors",
        meaning="to_litert() needs example inputs as a tensor or a tuple of tensors, and got "
        "another type.",
        cause="Passing a dict of keyword inputs, a BatchEncoding or another object as "
        "example_args.",
        fix="Pass a tuple of positional tensors, e.g. (input_ids,) or a single tensor.",
        doc="docs/export.md#litert",
    ),
    Entry(
        "export-litert-quantize",
        r"torch_pjrt\.export\.to_litert\(\): quantize must be None or one of",
        meaning="to_litert() got a quantize= value it does not support.",
        cause="A misspelt or unsupported recipe name; only 'dynamic_int8' is available.",
        fix="Use quantize=None for float32 or quantize='dynamic_int8' for int8 weights.",
        doc="docs/export.md#litert",
    ),
    Entry(
        "export-litert-path-is-directory",
        r"torch_pjrt\.export\.to_litert\(\): .*? is a directory; give a file path",
        meaning="to_litert() writes one .tflite file, and the given path is an existing directory.",
        cause="Passing an output folder instead of a file name.",
        fix="Give a file path such as 'out/model.tflite'.",
        doc="docs/export.md#litert",
    ),
    Entry(
        "export-litert-op-without-lowering",
        r"torch_pjrt\.export\.to_litert: .*? has no LiteRT lowering in litert-torch",
        meaning="litert-torch cannot convert an op of the model; the message names the op and "
        "the model line it comes from. No file was written.",
        cause="The model uses an ATen op that litert-torch has no LiteRT lowering for.",
        fix="Replace that call with ops litert-torch supports, or export to StableHLO with "
        "torch_pjrt.export.save instead.",
        doc="docs/export.md#litert",
    ),
    Entry(
        "export-save-not-exported-program",
        r"torch_pjrt\.export\.save\(\): expected the ExportedProgram",
        meaning="torch_pjrt.export.save() takes the result of torch.export.export(), and got "
        "something else.",
        cause="Passing the nn.Module (or a compiled model) directly to save().",
        fix="Export first: ep = torch.export.export(model, (x,)); then "
        "torch_pjrt.export.save(ep, 'model_dir').",
        doc="docs/export.md#stablehlo",
    ),
    Entry(
        "export-load-format-version",
        r"torch_pjrt\.export\.load\(\): .*? is format .*?; this torch_pjrt reads format",
        meaning="The saved directory was written in a different export format version than "
        "this torch_pjrt reads.",
        cause="The directory was saved by another torch_pjrt version.",
        fix="Export the model again with this torch_pjrt version, or load it with the version "
        "that wrote it.",
        doc="docs/export.md#the-directory-and-running-it-without-pytorch",
    ),
    Entry(
        "export-loaded-input-count",
        r"the (?:exported program|LiteRT model) takes \S+ tensor inputs, got",
        meaning="A loaded exported program (or LiteRT model) was called with a different "
        "number of tensors than it was exported with.",
        cause="Leaving an input out, passing an extra one, or wrapping the inputs in one "
        "list or tuple instead of passing them as separate arguments.",
        fix="Call it with the same positional tensors as the example inputs of the export, "
        "e.g. run(x) for a model exported with (x,).",
        doc="docs/export.md",
    ),
    Entry(
        "export-litert-file-missing",
        r"torch_pjrt\.export\.load_litert\(\): no file",
        meaning="load_litert() was given a path that is not an existing file.",
        cause="A wrong path, a directory, or a .tflite file that was never written (the "
        "conversion failed).",
        fix="Pass the path of a .tflite file written by torch_pjrt.export.to_litert().",
        doc="docs/export.md#litert",
    ),
    Entry(
        "export-data-dependent-size",
        r"torch_pjrt\.export: the output of .*? has a size that depends on the tensor's values",
        meaning="The model has an op whose output size depends on tensor values, which a "
        "StableHLO program or LiteRT file cannot hold; the op and line are named.",
        cause="Boolean-mask indexing (x[x > 0]), nonzero, masked_select, unique and similar "
        "ops in the exported forward.",
        fix="Use a fixed-size form (torch.where with the mask, or a padded result), or do that "
        "step in PyTorch outside the exported model.",
        doc="docs/export.md#what-is-in-the-program-and-what-is-not",
    ),
    Entry(
        "export-op-without-lowering",
        r"torch_pjrt\.export: in the exported program, .*? and no decomposition",
        meaning="An op of the exported program has neither a pjrt lowering nor a decomposition, "
        "so it cannot be saved as one StableHLO program; nothing was written.",
        cause="The model calls an op torch_pjrt cannot lower (named with the model line it "
        "comes from).",
        fix="Replace that call with supported ops, or keep the model in PyTorch; "
        "`torch-pjrt export` reports the same op and line.",
        doc="docs/export.md#what-is-in-the-program-and-what-is-not",
    ),
    Entry(
        "export-load-missing-file",
        r"torch_pjrt\.export\.load\(\): .*? has no .*?; expected a directory written by",
        meaning="load() expects a directory with program.jaxexport, weights.npz and meta.json, "
        "and one of them is missing.",
        cause="Pointing load() at the wrong path, a .tflite file, or a directory that was "
        "copied incompletely.",
        fix="Pass the directory written by torch_pjrt.export.save(), with all three files in it.",
        doc="docs/export.md#the-directory-and-running-it-without-pytorch",
    ),
    Entry(
        "export-input-kind-unsupported",
        r"torch_pjrt\.export: the exported program's input .*? cannot be saved",
        meaning="The exported program has an input that is neither a user tensor nor a weight "
        "(an effect token or a custom script object), which an array program cannot take.",
        cause="The model uses side-effecting ops or TorchScript/torchbind objects that "
        "torch.export lifts as extra inputs.",
        fix="Remove those ops or objects from the exported forward, or keep the model in PyTorch.",
        doc="docs/export.md#what-is-in-the-program-and-what-is-not",
    ),
    # --- migrate ---------------------------------------------------------------------
    Entry(
        "migrate-no-such-path",
        r"no such file or folder: ",
        meaning="torch-pjrt migrate was given a PATH that does not exist.",
        cause="A typo in the path, or running the command from another working directory.",
        fix="Pass an existing Python file or folder (relative to the current directory, or "
        "absolute).",
        doc="docs/migrating.md#torch-pjrt-migrate",
    ),
    Entry(
        "migrate-dangling-symlink",
        r"a symbolic link that leads nowhere",
        meaning="The PATH given to torch-pjrt migrate is a symbolic link whose target is "
        "missing or which loops back on itself.",
        cause="A link left after its target was moved or deleted, or a link cycle.",
        fix="Pass the real file or folder, or fix the link (ls -l shows where it points).",
        doc="docs/migrating.md#torch-pjrt-migrate",
    ),
    Entry(
        "migrate-not-file-or-folder",
        r": neither a file nor a folder",
        meaning="The PATH given to torch-pjrt migrate is neither a regular file nor a folder.",
        cause="Passing a device, socket or named pipe (e.g. /dev/stdin).",
        fix="Pass a Python source file or a folder containing .py files.",
        doc="docs/migrating.md#torch-pjrt-migrate",
    ),
    Entry(
        "migrate-syntax-error",
        r"not valid Python.*?; not analyzed, not rewritten",
        meaning="A file could not be parsed as Python, so migrate neither analyzed nor "
        "rewrote it; the other files are still processed.",
        cause="A syntax error in the file, or code for another Python version than the one "
        "running torch-pjrt.",
        fix="Fix the syntax error at the reported line (check with `python -m py_compile "
        "FILE`) and run migrate again.",
        doc="docs/migrating.md#torch-pjrt-migrate",
    ),
    Entry(
        "migrate-rewrite-does-not-compile",
        r"the rewrite does not compile .*?; the file is unchanged",
        meaning="The rewritten text migrate produced for a file did not compile, so the file "
        "was left as it was.",
        cause="A bug in torch-pjrt migrate's rewriter for some construct in the file.",
        fix="Report it as a torch-pjrt bug with the file (or a small excerpt); meanwhile make "
        "the changes the report lists by hand.",
        doc="docs/migrating.md#torch-pjrt-migrate",
    ),
    Entry(
        "migrate-cuda-compat-expected-cuda",
        r"Expected a cuda device, got",
        meaning="Under --cuda-compat, a torch.cuda function that takes a device was given one "
        "that is not a CUDA (mapped to pjrt) device.",
        cause="Passing 'cpu' or another device type to a torch.cuda call (RNG state, "
        "Tensor.cuda(), a Stream) in a program run with --cuda-compat.",
        fix="Pass a CUDA device ('cuda', 'cuda:N', an index or None), as on a real CUDA "
        "machine, or call the CPU function for CPU state.",
        doc="docs/migrating.md#--cuda-compat",
    ),
    Entry(
        "migrate-binary-file",
        r"a binary file \(it contains NUL bytes\), not Python source",
        meaning="A file given to migrate contains NUL bytes, so it is not Python source and "
        "was skipped.",
        cause="A binary or wrongly encoded (e.g. UTF-16) file ending in .py, or a corrupted file.",
        fix="Remove or rename the file if it is not Python; re-save it as UTF-8 if it is.",
        doc="docs/migrating.md#torch-pjrt-migrate",
    ),
    Entry(
        "migrate-read-only-file",
        r": read-only; not rewritten",
        meaning="torch-pjrt migrate --apply would change this file, but it is read-only, so it "
        "was left unchanged.",
        cause="The file has no write permission (a checked-out read-only file, or another "
        "user's file).",
        fix="Make it writable (chmod u+w FILE) and run `torch-pjrt migrate --apply` again.",
        doc="docs/migrating.md#torch-pjrt-migrate",
    ),
    Entry(
        "migrate-write-failed",
        r"not rewritten, the file is unchanged: cannot write in",
        meaning="migrate --apply could not write the new text next to the file, so the file "
        "was left unchanged; the OS reason follows.",
        cause="The folder is not writable (a temporary file is made in it), the disk is full, "
        "or the file system is read-only.",
        fix="Fix the reason given (permissions on the folder, free space) and run "
        "`torch-pjrt migrate --apply` again.",
        doc="docs/migrating.md#torch-pjrt-migrate",
    ),
    Entry(
        "migrate-error",
        r"\bMigrateError\b",
        meaning="torch_pjrt.migrate.MigrateError: a file or path that torch-pjrt migrate could "
        "not read, analyze or write; the message names it, says why and what to do.",
        cause="A missing path, a syntax error, a binary or read-only file, or a failed write; "
        "files that fail are reported and the others are still processed.",
        fix="Follow the fix in the message for that file and run the command again; files "
        "that failed were left unchanged.",
        doc="docs/migrating.md#torch-pjrt-migrate",
        classes=("MigrateError",),
    ),
    # --- JAX interop and DLPack ----------------------------------------------------------
    Entry(
        "pjrt-tensor-expected",
        r": expected a (?:torch\.Tensor, but got|tensor on a pjrt device, but got one on)",
        meaning="A torch_pjrt function that works on pjrt tensors (to_jax, mark_sharding, "
        "sharding_of, ...) was given something else: a tensor on another device, or not a "
        "tensor.",
        cause="Calling it before moving the tensor or model to pjrt (a CPU tensor), or "
        "passing a module, list or NumPy array.",
        fix="Move the tensor first (t.to('pjrt'), a copy), or pass the tensor itself (a "
        "layer's .weight, not the layer); the message's last part names the usual fix.",
        doc="docs/device_api.md#jax-and-dlpack",
    ),
    Entry(
        "interop-requires-grad",
        r"(?:to_jax\(\): can't hand a tensor that requires grad"
        r"|Can't export tensors that require gradient)",
        meaning="A tensor that is part of an autograd graph was handed to JAX (to_jax or "
        "DLPack); JAX would see its values but not its graph, so gradients would stop "
        "there without a word.",
        cause="Passing a parameter, or an activation computed from one, to to_jax or "
        "jnp.from_dlpack.",
        fix="Hand over tensor.detach() when no gradient should flow; to call JAX code inside "
        "a model with gradients, wrap it in a torch.autograd.Function whose backward "
        "uses jax.vjp, or make it an op with torch_pjrt.kernel.",
        doc="docs/device_api.md#jax-and-dlpack",
    ),
    Entry(
        "interop-from-jax-bad-array",
        r"from_jax\(\): (?:expected a jax\.Array|got a JAX tracer|JAX dtype .* has no "
        r"PyTorch dtype|the array has been deleted)",
        meaning="torch_pjrt.from_jax() wraps a concrete, live JAX array as a pjrt tensor; the "
        "argument was not one (a NumPy array, a tracer inside jax.jit, a deleted or "
        "donated array, or a dtype PyTorch has no twin of).",
        cause="Calling from_jax inside a jitted function, after donating the array to "
        "another jit, or on NumPy data.",
        fix="Call it outside JAX transformations on a live array (jnp.asarray(...) for "
        "NumPy data); keep an array you hand over out of donate_argnums; cast exotic "
        "dtypes first (array.astype(jnp.float32)).",
        doc="docs/device_api.md#jax-and-dlpack",
    ),
    Entry(
        "interop-from-jax-wrong-device",
        r"from_jax\(\): the array is on .* which is not a pjrt device",
        meaning="The JAX array lives on a device torch_pjrt does not run on (another "
        "platform's device, e.g. a CPU array while pjrt runs on a GPU).",
        cause="JAX arrays made with jax.devices('cpu') or before choosing the platform, "
        "when pjrt uses an accelerator.",
        fix="jax.device_put(array, torch_pjrt.runtime.devices()[i]) first (a copy), or make "
        "the array on that device to begin with.",
        doc="docs/device_api.md#jax-and-dlpack",
    ),
    Entry(
        "interop-dlpack-offset-view",
        r"to_dlpack\(\): a pjrt view that starts inside its storage",
        meaning="PyTorch's DLPack round trip shares a pjrt tensor's whole storage; a view "
        "that starts at a storage offset cannot be shared that way.",
        cause="Exporting a slice such as t[1:] or t[:, 2] with torch.utils.dlpack.to_dlpack.",
        fix="Export the whole tensor and slice on the other side, or .clone() the view "
        "(a copy) and export that.",
        doc="docs/device_api.md#jax-and-dlpack",
    ),
    Entry(
        "rng-set-offset",
        r"set_offset\(\): offset must be a non-negative int",
        meaning="torch.pjrt.set_offset() positions a device's random generator at its n-th "
        "random op after seeding; n must be 0 or more.",
        cause="A negative number, a float or a tensor passed as the offset.",
        fix="Pass a non-negative Python int, such as a value torch.pjrt.get_offset() "
        "returned earlier.",
        doc="docs/device_api.md#random-numbers",
    ),
    Entry(
        "quantized-tensors",
        r"quantized tensors \(qint8, quint8, qint32, \.\.\.\) are not supported on pjrt",
        meaning="PyTorch's quantized tensors (torch.quantize_per_tensor and friends, qint8 "
        "and quint8 dtypes) have no pjrt representation; the op named would have made or "
        "read one on pjrt.",
        cause="Quantizing a pjrt tensor, moving a quantized CPU tensor to pjrt, or a "
        "torch.ao quantized model on pjrt.",
        fix="Quantize on the CPU (and run the quantized model there), or keep pjrt tensors "
        "in a floating dtype: bfloat16, or float8 where the chip has it.",
        doc="docs/device_api.md#pytorchs-backend-contract",
    ),
    Entry(
        "graph-capture-generator",
        r"draws from a torch\.Generator, which cannot be captured in a torch\.pjrt graph",
        meaning="Inside torch.pjrt.graph capture, a random op was given generator=; a "
        "replay draws from the device's RNG state, so the generator's stream could not "
        "be followed.",
        cause="Dropout or sampling code that passes its own torch.Generator, captured with "
        "torch.pjrt.graph or make_graphed_callables.",
        fix="Leave generator= out inside the capture (seed the device with "
        "torch.manual_seed), or run that op outside the captured region.",
        doc="docs/device_api.md#random-numbers",
    ),
    # --- report ---------------------------------------------------------------------
    Entry(
        "diagnostics-no-such-attribute",
        r"module 'torch_pjrt\.diagnostics' has no attribute",
        meaning="The name asked of torch_pjrt.diagnostics is neither one of its modules "
        "(metrics, strict, doctor, onboard, glossary, profiler, html_report, mcp_server) "
        "nor report, the function that writes a run's HTML report.",
        cause="A misspelled name, or a name of torch_pjrt's top level (metrics, strict, "
        "profiler) asked of the subpackage before its module was imported.",
        fix="Import the module by its name (`from torch_pjrt.diagnostics import onboard`) "
        "or use the top-level names (torch_pjrt.metrics, torch_pjrt.strict).",
        doc="docs/diagnostics.md",
    ),
    Entry(
        "report-steps",
        r"torch-pjrt report: steps must be a positive int",
        meaning="torch_pjrt.diagnostics.report() was given a number of optimizer steps to run "
        "that is not a positive integer.",
        cause="steps=0, a negative number, or a float or string where an int was meant.",
        fix="Pass steps=N with N >= 1 to stop after N optimizer steps, or leave it out "
        "(None) to run the script to its end.",
        doc="docs/diagnostics.md#the-report",
    ),
    Entry(
        "report-out-folder",
        r"torch-pjrt report: (?:no such folder for --out:|--out is a folder, not a file:"
        r"|cannot write in )",
        meaning="The report's page cannot be written where --out (out=) points, so the "
        "script was not run.",
        cause="A folder in the path that does not exist, an --out that names an existing "
        "folder, or a folder this process may not write in.",
        fix="Give a file path in an existing folder you can write, e.g. --out "
        "runs/report.html after mkdir -p runs.",
        doc="docs/diagnostics.md#the-report",
    ),
)
