"""The public names of `mlx.core` (functions, classes, submodules such as `random` and `metal`),
and of those submodules.

An `mx.<name>` that MLX does not have is no MLX work: it is a guarded optional call
(`if hasattr(mx, "time"): start = mx.time()`) that never runs, or a project's own
attribute. Issue 23's blind review of fourteen MLX servers graded two findings false on
embed-rerank's `mx.time()`, a name mlx.core has never had, and one set d finding false on
mlx-serving's `mx.metal.sync()`, which mlx.core.metal has never had. The list is read from MLX
0.32.4 (`dir(mlx.core)`); tests/invariants/test_mlx_api.py fails when the MLX
installed beside the tests has a name it lacks, so a newer release is added, never missed.
The checker itself never imports MLX (the base install is libcst only).
"""

from __future__ import annotations

CORE_NAMES = frozenset({
    "ArrayAt", "ArrayIterator", "ArrayLike", "Device", "DeviceType", "Dtype", "DtypeCategory",
    "FunctionExporter", "PrintOptions", "Stream", "StreamContext", "ThreadLocalStream", "abs", "acos", "acosh",
    "add", "addmm", "all", "allclose", "any", "arange", "arccos", "arccosh", "arcsin", "arcsinh", "arctan",
    "arctan2", "arctanh", "argmax", "argmin", "argpartition", "argsort", "array", "array_equal", "as_strided",
    "asarray", "asin", "asinh", "astype", "async_eval", "atan", "atan2", "atanh", "atleast_1d", "atleast_2d",
    "atleast_3d", "bartlett", "bfloat16", "bitwise_and", "bitwise_invert", "bitwise_left_shift", "bitwise_or",
    "bitwise_right_shift", "bitwise_xor", "blackman", "block_masked_mm", "bool_", "broadcast_arrays",
    "broadcast_shapes", "broadcast_to", "can_cast", "ceil", "checkpoint", "clear_cache", "clear_streams",
    "clip", "compile", "complex64", "complexfloating", "concat", "concatenate", "conj", "conjugate",
    "contiguous", "conv1d", "conv2d", "conv3d", "conv_general", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d", "convolve", "cos", "cosh", "count_nonzero", "cpu", "cuda", "cummax", "cummin",
    "cumprod", "cumsum", "cumulative_prod", "cumulative_sum", "custom_function", "default_device",
    "default_stream", "degrees", "depends", "dequantize", "device_count", "device_info", "diag", "diagonal",
    "diff", "disable_compile", "distributed", "divide", "divmod", "e", "einsum", "einsum_path", "empty",
    "empty_like", "enable_compile", "equal", "erf", "erfinv", "euler_gamma", "eval", "exp", "expand_dims",
    "expm1", "export_function", "export_to_dot", "exporter", "eye", "fast", "fft", "finfo", "flatten", "flip",
    "float16", "float32", "float64", "floating", "floor", "floor_divide", "from_dlpack", "from_fp8", "full",
    "full_like", "gather_mm", "gather_qmm", "gather_qqmm", "generic", "get_active_memory",
    "get_array_buffer_size", "get_cache_memory", "get_memory_limit", "get_peak_memory", "get_printoptions",
    "gpu", "grad", "greater", "greater_equal", "hadamard_transform", "hamming", "hanning", "identity", "iinfo",
    "imag", "import_function", "inexact", "inf", "inner", "int16", "int32", "int64", "int8", "integer",
    "is_available", "isclose", "isdtype", "isfinite", "isinf", "isnan", "isneginf", "isposinf", "issubdtype",
    "jvp", "kron", "left_shift", "less", "less_equal", "linalg", "linspace", "load", "log", "log10", "log1p",
    "log2", "logaddexp", "logcumsumexp", "logical_and", "logical_not", "logical_or", "logical_xor", "logsumexp",
    "matmul", "matrix_norm", "matrix_transpose", "max", "maximum", "mean", "median", "meshgrid", "metal", "min",
    "minimum", "minmax", "moveaxis", "multiply", "nan", "nan_to_num", "negative", "new_stream",
    "new_thread_local_stream", "new_thread_unsafe_stream", "newaxis", "not_equal", "number", "ones",
    "ones_like", "outer", "pad", "partition", "permute_dims", "pi", "positive", "pow", "power", "printoptions",
    "prod", "put_along_axis", "qqmm", "quantize", "quantized_matmul", "radians", "random", "real", "reciprocal",
    "remainder", "repeat", "reset_peak_memory", "reshape", "result_type", "right_shift", "roll", "round",
    "rsqrt", "save", "save_gguf", "save_safetensors", "savez", "savez_compressed", "searchsorted",
    "segmented_mm", "set_cache_limit", "set_default_device", "set_default_stream", "set_memory_limit",
    "set_printoptions", "set_wired_limit", "sigmoid", "sign", "signedinteger", "sin", "sinh", "slice",
    "slice_update", "softmax", "sort", "split", "sqrt", "square", "squeeze", "stack", "std", "stop_gradient",
    "stream", "subtract", "sum", "swapaxes", "synchronize", "take", "take_along_axis", "tan", "tanh",
    "tensordot", "tile", "to_fp8", "topk", "trace", "transpose", "tri", "tril", "triu", "trunc", "uint16",
    "uint32", "uint64", "uint8", "unflatten", "unique", "unsignedinteger", "unstack", "value_and_grad", "var",
    "vecdot", "view", "vjp", "vmap", "where", "zeros", "zeros_like"
})
# The submodules' own names, read from the same release; `mx.metal.sync` is no call MLX has.
SUBMODULE_NAMES = {
    "metal": frozenset({
        "clear_cache", "device_info", "get_active_memory", "get_cache_memory", "get_peak_memory", "is_available",
        "reset_peak_memory", "set_cache_limit", "set_memory_limit", "set_wired_limit", "start_capture",
        "stop_capture",
    }),
    "random": frozenset({
        "bernoulli", "categorical", "gumbel", "key", "laplace", "multivariate_normal", "normal", "permutation",
        "randint", "seed", "split", "truncated_normal", "uniform",
    }),
    "fast": frozenset({
        "cross_entropy", "cuda_kernel", "gated_delta_update", "layer_norm", "metal_kernel",
        "precompiled_cuda_kernel", "rms_norm", "rope", "scaled_dot_product_attention",
    }),
    "linalg": frozenset({
        "cholesky", "cholesky_inv", "cross", "det", "eig", "eigh", "eigvals", "eigvalsh", "inv", "lu", "lu_factor",
        "norm", "pinv", "qr", "slogdet", "solve", "solve_triangular", "svd", "tri_inv",
    }),
    "distributed": frozenset({
        "Group", "all_gather", "all_max", "all_min", "all_sum", "init", "is_available", "recv", "recv_like", "send",
        "sum_scatter",
    }),
    "cuda": frozenset({"is_available"}),
    "fft": frozenset({
        "fft", "fft2", "fftfreq", "fftn", "fftshift", "ifft", "ifft2", "ifftn", "ifftshift", "irfft", "irfft2",
        "irfftn", "istft", "rfft", "rfft2", "rfftfreq", "rfftn", "stft",
    }),
}
