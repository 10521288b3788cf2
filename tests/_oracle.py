"""float64 numpy oracles and a dtype-aware comparison shared by the op tests."""

import ml_dtypes
import numpy as np

# Relative tolerance per output dtype: a few units in the last place, since kernels and references may sum in
# a different order before the final rounding.
RTOL = {"bfloat16": 2 ** -7, "float16": 2 ** -9, "float32": 1e-5}


def f64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def assert_close(actual, expected, dtype, scale=None, factor=1.0):
    """|actual - expected| <= rtol * (|expected| + scale) + factor * subnormal, scale defaulting to the rms of
    expected (absorbs cancellation near zero, where a relative bound is meaningless). ``subnormal`` is the dtype's
    smallest subnormal, its spacing below the normal range: there a result rounded to the dtype is off by up to half
    a spacing from the exact value and two rounded results by one spacing, which no relative term covers (a float16
    row whose outputs are ~2e-6 differs by one 6e-8 step between two correct kernels)."""
    actual, expected = f64(actual), f64(expected)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    rtol = RTOL[str(np.dtype(dtype))] * factor
    if scale is None:
        scale = float(np.sqrt(np.mean(expected ** 2))) if expected.size else 0.0
    subnormal = float(ml_dtypes.finfo(dtype).smallest_subnormal)
    bound = rtol * (np.abs(expected) + scale) + factor * subnormal
    err = np.abs(actual - expected)
    worst = np.unravel_index(np.argmax(err - bound), err.shape) if err.size else ()
    assert np.all(err <= bound), f"max excess at {worst}: got {actual[worst]}, want {expected[worst]}"


def rms_norm(x, gamma, eps):
    x, gamma = f64(x), f64(gamma)
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return x * r * gamma


def rms_norm_grads(x, gamma, eps, dy):
    """Hand-derived: dx = r*g*dy - x*r^3*mean(g*dy*x), dgamma = sum over rows of dy*x*r."""
    x, gamma, dy = f64(x), f64(gamma), f64(dy)
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    dx = r * gamma * dy - x * r ** 3 * np.mean(gamma * dy * x, axis=-1, keepdims=True)
    dgamma = np.sum((dy * x * r).reshape(-1, x.shape[-1]), axis=0)
    return dx, dgamma


def silu_and_mul(x):
    x = f64(x)
    gate, up = np.split(x, 2, axis=-1)
    return gate / (1.0 + np.exp(-gate)) * up


def silu_and_mul_grad(x, dout):
    x, dout = f64(x), f64(dout)
    gate, up = np.split(x, 2, axis=-1)
    s = 1.0 / (1.0 + np.exp(-gate))
    return np.concatenate([dout * up * s * (1 + gate * (1 - s)), dout * gate * s], axis=-1)


def central_difference(f, x, eps=1e-6):
    """Gradient of scalar f at x by central differences (float64)."""
    x = f64(x).copy()
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        saved = x[i]
        x[i] = saved + eps
        up = f(x)
        x[i] = saved - eps
        down = f(x)
        x[i] = saved
        grad[i] = (up - down) / (2 * eps)
    return grad


def native_and_reference(fn, *args, **kwargs):
    """fn(*args) with the native kernels and with the xla reference, as numpy pytrees."""
    import jax
    import jax_aiter

    results = []
    for impl in ("native", "xla"):
        with jax_aiter.use_backend(impl):
            results.append(jax.tree.map(np.asarray, fn(*args, **kwargs)))
    return results


def ffi_call_now(target, outputs, *args, **attrs):
    """One FFI call, waited for: GPU handlers run asynchronously and their errors surface when the result is."""
    import jax

    return jax.block_until_ready(jax.ffi.ffi_call(target, outputs)(*args, **attrs))
