"""The native kernels (csrc/) against the pure-JAX reference, on the CPU and, marked ``gpu``, on a GPU.

* MXFP4 casts: bit-exact (data and scale bytes) for every dtype, every option and layout, every finite bf16 and
  fp16 pattern under several block scales, NaN/Inf/zero/subnormal blocks, shapes that leave partial kernel tiles,
  and hypothesis-drawn shapes and values.
* RMSNorm (plain and with the fused add) and SiLU-and-mul, forward and gradients: within about one unit in the
  last place of the output dtype (the kernels sum in another order than XLA).
* Error paths: a call the handler rejects raises a Python exception naming the problem, never crashes.
"""

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import _oracle
import jax_aiter
from jax_aiter import _backend, _native, native
from jax_aiter.activation import silu_and_mul
from jax_aiter.gemm_fp4 import cast_mxfp4, cast_mxfp4_dual
from jax_aiter.rmsnorm import rms_norm, rms_norm_with_add

try:
    import hypothesis
    from hypothesis import strategies as st
    from hypothesis.extra import numpy as hnp
except ModuleNotFoundError:  # a GPU image may lack it; every other test still runs there
    hypothesis = None

DTYPES = (jnp.bfloat16, jnp.float16, jnp.float32)


@pytest.fixture(params=["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def device(request):
    """The device to run on; its platform's native library must have loaded (on a GPU that is a failure)."""
    if request.param == "cpu":
        dev = jax.devices("cpu")[0]
    else:
        dev = jax.devices("gpu")[0]
    platform = "rocm" if "rocm" in dev.client.platform_version.lower() else dev.platform
    platform = "cuda" if platform == "gpu" else platform
    problem = _native.load(native.LIBRARY[platform]).problem
    if problem is not None:
        if request.param == "cpu":
            pytest.skip(problem)
        pytest.fail(problem)
    return dev


def both(fn, *args, **kwargs):
    """fn(*args) with the native kernels and with the xla reference, as numpy pytrees."""
    results = []
    for impl in ("native", "xla"):
        with jax_aiter.use_backend(impl):
            results.append(jax.tree.map(np.asarray, fn(*args, **kwargs)))
    return results


# --- MXFP4 casts: bit-exact ------------------------------------------------------------------------------


def assert_same_bytes(native, reference, what=""):
    for i, (a, b) in enumerate(zip(jax.tree.leaves(native), jax.tree.leaves(reference), strict=True)):
        assert a.dtype == b.dtype == np.uint8 and a.shape == b.shape, (what, i, a.shape, b.shape)
        if not np.array_equal(a, b):
            bad = np.argwhere(a != b)
            raise AssertionError(f"{what} output {i}: {len(bad)} bytes differ, first at {bad[:4].tolist()}: "
                                 f"native {a[tuple(bad[0])]:#04x}, reference {b[tuple(bad[0])]:#04x}")


def tricky_matrix(m, k, dtype, seed=0):
    """Rows of very different magnitudes, plus NaN, +-Inf, zero, subnormal and exact-tie blocks."""
    rng = np.random.default_rng(seed)
    top = min(40, int(ml_dtypes.finfo(dtype).maxexp) - 4)
    x = rng.standard_normal((m, k)) * np.exp2(rng.integers(-top, top, (m, 1)))
    x[0, :12] = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -0.1, -5.0, 7.0, -7.5]  # ties and saturation
    x[1, 3] = np.nan
    x[2, k - 1] = np.inf
    x[3, 5] = -np.inf
    x[4, :32] = 0.0
    x[5, :] = -0.0
    tiny = float(ml_dtypes.finfo(dtype).smallest_subnormal)
    x[6, :] = rng.integers(-300, 300, k) * tiny
    x[7, : k // 2] *= 2.0 ** -120
    # Blocks with amax 2^-122 (e = -124) holding subnormals in [2^-130, 2^-126): nearest rounding makes them 0,
    # stochastic rounding rounds them up with probability 1/32..1/2. A CPU that flushes subnormal inputs must
    # not lose them.
    x[8, :] = rng.choice([-1, 1], k) * rng.integers(2 ** 19, 2 ** 23, k) * 2.0 ** -149
    x[8, ::32] = 2.0 ** -122
    return jnp.asarray(x.astype(np.float32)).astype(dtype)


def dual_cast(x, **options):
    return cast_mxfp4_dual(x, **options)


# One case per line; together they take every value of every option, on every dtype.
OPTION_CASES = [
    (jnp.bfloat16, dict()),
    (jnp.bfloat16, dict(scale_rule="floor", sr_key=7, hadamard_rowwise=16, hadamard_columnwise=32, hadamard_key=3,
                        layout_rowwise="gemm_a", layout_columnwise="gemm_b", index_offset=(64, 96))),
    (jnp.bfloat16, dict(scale_rule="ceil", hadamard_rowwise=32, layout_rowwise="gemm_b")),
    (jnp.float16, dict(scale_rule="even", sr_key=123456789012, hadamard_columnwise=16, hadamard_key=5,
                       layout_columnwise="gemm_a", index_offset=(32, 0))),
    (jnp.float16, dict(scale_rule="floor", hadamard_rowwise=32, hadamard_columnwise=16)),
    (jnp.float32, dict(scale_rule="ceil", sr_key=11, layout_rowwise="gemm_a", layout_columnwise="gemm_a",
                       index_offset=(0, 64))),
    (jnp.float32, dict(hadamard_rowwise=16, hadamard_columnwise=32, hadamard_key=9, sr_key=1,
                       layout_rowwise="gemm_b", layout_columnwise="gemm_b")),
]


@pytest.mark.parametrize("dtype, options", OPTION_CASES,
                         ids=[f"{np.dtype(d).name}-{i}" for i, (d, _) in enumerate(OPTION_CASES)])
def test_dual_cast_options_bit_exact(device, dtype, options):
    options = dict(options)
    if "index_offset" in options:
        options["index_offset"] = jnp.asarray(options["index_offset"], jnp.uint32)
    # 320 columns: a partial 256-column tile for 16-bit types; 96 rows: a partial 64-row tile, except where the
    # columnwise copy is shuffled (its quantization axis, M, must then be a multiple of 64).
    m = 192 if options.get("layout_columnwise") == "gemm_b" else 96
    x = jax.device_put(tricky_matrix(m, 320, dtype), device)
    native, reference = both(dual_cast, x, **options)
    assert_same_bytes(native, reference, str(options))


@pytest.mark.parametrize("columnwise, layout", [(False, "gemm_b"), (True, "plain"), (True, "gemm_b")])
def test_single_cast_bit_exact(device, columnwise, layout):
    x = jax.device_put(tricky_matrix(128, 192, jnp.bfloat16, seed=1), device)
    options = dict(columnwise=columnwise, layout=layout, sr_key=5, hadamard=16, hadamard_key=2)
    assert_same_bytes(*both(cast_mxfp4, x, **options), str(options))


@pytest.mark.parametrize("dtype", DTYPES)
def test_columnwise_cast_of_unaligned_rows(device, dtype):
    # K = 37: rows are not whole 16-byte chunks, so the kernel loads element by element.
    x = jax.device_put(tricky_matrix(64, 37, dtype, seed=2), device)
    assert_same_bytes(*both(cast_mxfp4, x, columnwise=True), np.dtype(dtype).name)


def every_finite_pattern(dtype):
    """Every finite value of a 16-bit dtype, each block led by an anchor that sets (or leaves) its scale."""
    patterns = np.arange(2 ** 16, dtype=np.uint16).view(dtype)
    finite = patterns[np.isfinite(patterns.astype(np.float32))]
    finite = np.concatenate([finite, np.zeros(-len(finite) % 31, dtype)]).reshape(-1, 31)
    biggest = float(ml_dtypes.finfo(dtype).max)
    anchors = [float(ml_dtypes.finfo(dtype).smallest_subnormal), 1.0, -1.75, 5.0, biggest]
    blocks = [np.concatenate([np.full((len(finite), 1), a, dtype), finite], axis=1) for a in anchors]
    x = np.concatenate(blocks)
    return np.concatenate([x, np.zeros((-len(x) % 32, 32), dtype)])  # whole blocks for the columnwise copy


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("rule", ["even", "floor", "ceil"])
def test_every_finite_16bit_pattern(device, dtype, rule):
    x = jax.device_put(jnp.asarray(every_finite_pattern(dtype)), device)
    assert_same_bytes(*both(dual_cast, x, scale_rule=rule), f"{np.dtype(dtype).name} {rule}")


WORKED_BLOCK = [  # docs/mxfp4.md, "Kernel contract": x[i] = float32((i - 16) * 0.37), one rowwise block
    (dict(scale_rule="even"), 127, "ffefeededdccab991021435455666677"),
    (dict(scale_rule="floor"), 127, "ffefeededdccab991021435455666677"),
    (dict(scale_rule="even", sr_key=(1, 2)), 127, "ffefeeeeddccab990021434555656767"),
    (dict(scale_rule="even", hadamard=16, hadamard_key=(1, 2)), 128, "bd0ab10cae4ca14941ccc6429a212c9a"),
]


@pytest.mark.parametrize("options, scale, data", WORKED_BLOCK)
def test_documented_worked_block(device, options, scale, data):
    options = {k: jnp.asarray(v, jnp.uint32) if k.endswith("key") else v for k, v in options.items()}
    x = jax.device_put((jnp.arange(32, dtype=jnp.float32) - 16) * jnp.float32(0.37), device)[None]
    with jax_aiter.use_backend("native"):
        got_data, got_scales = cast_mxfp4(x, **options)
    assert int(got_scales[0, 0]) == scale
    assert np.asarray(got_data)[0].tobytes().hex() == data


if hypothesis is not None:

    @hypothesis.settings(max_examples=10, deadline=None,
                         suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture])
    @hypothesis.given(data=st.data())
    def test_cast_hypothesis(device, data):
        dtype = data.draw(st.sampled_from(DTYPES))
        m = 32 * data.draw(st.integers(1, 3))
        k = 32 * data.draw(st.integers(1, 10))
        width = 32 if dtype == jnp.float32 else 16
        values = data.draw(hnp.arrays(np.float32, (m, k), elements=st.floats(width=width)))
        options = dict(scale_rule=data.draw(st.sampled_from(["even", "floor", "ceil"])),
                       sr_key=data.draw(st.sampled_from([None, 0, 2 ** 40 + 17])),
                       hadamard_rowwise=data.draw(st.sampled_from([0, 16, 32])),
                       hadamard_columnwise=data.draw(st.sampled_from([0, 16, 32])))
        x = jax.device_put(jnp.asarray(values).astype(dtype), device)
        assert_same_bytes(*both(dual_cast, x, **options), f"{np.dtype(dtype).name} {options}")
else:

    @pytest.mark.skip(reason="hypothesis is not installed")
    def test_cast_hypothesis():
        pass


# --- norms and activation: ~1 ulp ------------------------------------------------------------------------


def norm_inputs(shape, dtype, seed=0):
    kx, kg, kr, kd, ks = jax.random.split(jax.random.key(seed), 5)
    x = (2.0 * jax.random.normal(kx, shape)).astype(dtype)
    gamma = (1.0 + 0.5 * jax.random.normal(kg, shape[-1:])).astype(dtype)
    residual = jax.random.normal(kr, shape).astype(dtype)
    dy = jax.random.normal(kd, shape).astype(dtype)
    d_sum = jax.random.normal(ks, shape).astype(dtype)
    return x, gamma, residual, dy, d_sum


def assert_close_tree(native, reference, dtype, factor=1.0):
    for a, b in zip(jax.tree.leaves(native), jax.tree.leaves(reference), strict=True):
        _oracle.assert_close(a, b, dtype, factor=factor)


# (7, 33): columns that allow no 16-byte access; (2, 40000): rows longer than the GPU kernel keeps in registers.
NORM_SHAPES = [(64, 1024), (3, 5, 96), (7, 33), (2, 40000), (1, 8)]


@pytest.mark.parametrize("shape", NORM_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_forward_and_grads(device, dtype, shape):
    x, gamma, _, dy, _ = jax.device_put(norm_inputs(shape, dtype), device)

    def run(x, gamma, dy):
        y, vjp = jax.vjp(functools.partial(rms_norm, epsilon=1e-6), x, gamma)
        return y, *vjp(dy)

    native, reference = both(run, x, gamma, dy)
    assert_close_tree(native[0], reference[0], dtype)
    # Gradients sum over a row (dx) or over all rows (dgamma) in another order: a little more slack.
    assert_close_tree(native[1:], reference[1:], dtype, factor=2)


@pytest.mark.parametrize("shape", [(32, 4096), (5, 33), (3, 20000)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_with_add_forward_and_grads(device, dtype, shape):
    x, gamma, residual, dy, d_sum = jax.device_put(norm_inputs(shape, dtype, seed=1), device)

    def run(x, residual, gamma, dy, d_sum):
        (y, total), vjp = jax.vjp(functools.partial(rms_norm_with_add, epsilon=1e-5), x, residual, gamma)
        return y, total, *vjp((dy, d_sum))

    native, reference = both(run, x, residual, gamma, dy, d_sum)
    np.testing.assert_array_equal(native[1], reference[1])  # the sum is rounded once, identically
    assert_close_tree(native[0], reference[0], dtype)
    assert_close_tree(native[2:], reference[2:], dtype, factor=2)


@pytest.mark.parametrize("shape", [(64, 2 * 1024), (3, 2 * 33), (2, 5, 2 * 40)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_forward_and_grad(device, dtype, shape):
    x, _, _, _, _ = jax.device_put(norm_inputs(shape, dtype, seed=2), device)
    dout = jax.device_put(jax.random.normal(jax.random.key(3), (*shape[:-1], shape[-1] // 2)).astype(dtype), device)

    def run(x, dout):
        out, vjp = jax.vjp(silu_and_mul, x)
        return out, *vjp(dout)

    native, reference = both(run, x, dout)
    assert_close_tree(native[0], reference[0], dtype)
    assert_close_tree(native[1], reference[1], dtype, factor=2)


def test_native_is_what_runs(device):
    """The forced native implementation lowers to the FFI targets (not silently to the reference)."""
    x = jax.device_put(jnp.ones((32, 64), jnp.bfloat16), device)
    with jax_aiter.use_backend("native"):
        hlo = jax.jit(lambda x: (rms_norm(x, x[0]), silu_and_mul(x), cast_mxfp4_dual(x))).lower(x).as_text()
    for target in ("ja_rms_norm_fwd", "ja_silu_and_mul_fwd", "ja_cast_mxfp4"):
        assert target in hlo


# --- error paths: exceptions, never crashes --------------------------------------------------------------


def ffi(target, outputs, *args, **attrs):
    # GPU handlers run asynchronously: their errors surface when the result is waited for.
    return jax.block_until_ready(jax.ffi.ffi_call(target, outputs)(*args, **attrs))


def test_ffi_errors_raise(device):
    bf16 = jnp.bfloat16
    x = jax.device_put(jnp.ones((4, 64), bf16), device)
    words = jax.device_put(jnp.zeros(2, jnp.uint32), device)
    out = jax.ShapeDtypeStruct
    # gamma of the wrong length
    with pytest.raises(jax.errors.JaxRuntimeError, match="gamma must be 1-D with x's last dimension"):
        ffi("ja_rms_norm_fwd", (out((4, 64), bf16), out((4,), jnp.float32)), x, x[0, :32],
            epsilon=np.float32(1e-6))
    # an integer input
    with pytest.raises(jax.errors.JaxRuntimeError, match="x must be bfloat16, float16 or float32, got int32"):
        ffi("ja_silu_and_mul_fwd", out((4, 32), jnp.int32), jax.device_put(jnp.ones((4, 64), jnp.int32), device))
    # an odd [gate | up] width
    with pytest.raises(jax.errors.JaxRuntimeError, match="must be even"):
        ffi("ja_silu_and_mul_fwd", out((4, 16), bf16), x[:, :33])
    cast = dict(rowwise=True, columnwise=False, scale_rule="even", stochastic=False, hadamard_rowwise=np.int32(0),
                hadamard_columnwise=np.int32(0), hadamard_signs=False, layout_rowwise="plain",
                layout_columnwise="plain")
    none = (out((0, 0), jnp.uint8), out((0, 0), jnp.uint8))
    good = (out((4, 32), jnp.uint8), out((4, 2), jnp.uint8), *none)
    with pytest.raises(jax.errors.JaxRuntimeError, match="scale_rule must be even, floor or ceil, got nearest"):
        ffi("ja_cast_mxfp4", good, x, words, words, words, **{**cast, "scale_rule": "nearest"})
    with pytest.raises(jax.errors.JaxRuntimeError, match="hadamard_rowwise must be 0, 16 or 32"):
        ffi("ja_cast_mxfp4", good, x, words, words, words, **{**cast, "hadamard_rowwise": np.int32(8)})
    with pytest.raises(jax.errors.JaxRuntimeError, match="not a multiple of 32"):
        ffi("ja_cast_mxfp4", (out((4, 24), jnp.uint8), out((4, 1), jnp.uint8), *none), x[:, :48], words, words,
            words, **cast)
    with pytest.raises(jax.errors.JaxRuntimeError, match="rowwise scales must have shape"):
        ffi("ja_cast_mxfp4", (out((4, 32), jnp.uint8), out((4, 3), jnp.uint8), *none), x, words, words, words,
            **cast)
    # The process is still healthy: a valid call works.
    with jax_aiter.use_backend("native"):
        np.testing.assert_array_equal(np.asarray(cast_mxfp4(x)[1]), np.full((4, 2), 125, np.uint8))


def test_python_rejects_odd_shapes_before_the_kernel():
    """Shapes the kernels do not take never reach them: the public functions raise ValueError first."""
    x = jnp.ones((48, 40), jnp.bfloat16)
    with jax_aiter.use_backend("native"):
        with pytest.raises(ValueError, match="multiple of 32"):
            cast_mxfp4(x)  # rowwise blocks run along K = 40
        with pytest.raises(ValueError, match="multiple of 32"):
            cast_mxfp4_dual(jnp.ones((40, 64), jnp.bfloat16))  # columnwise blocks run along M = 40
        with pytest.raises(ValueError, match="gemm_b"):
            cast_mxfp4(jnp.ones((24, 64), jnp.bfloat16), layout="gemm_b")
        with pytest.raises(ValueError, match="even"):
            silu_and_mul(jnp.ones((4, 7), jnp.bfloat16))
