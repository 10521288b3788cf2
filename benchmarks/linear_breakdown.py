"""Where the time of ``gemm_fp4_bf16``'s training step goes on a GPU without FP4 GEMMs (docs/performance.md):
the casts, the exact bf16 dequantization of the GEMM operands, and the GEMMs, each timed alone, against the bf16
``jnp.dot`` linear.

    python benchmarks/linear_breakdown.py [M N K]
"""

import sys

import jax
import jax.numpy as jnp

from jax_aiter import _native, gemm_fp4, native
from jax_aiter.benchmark import normal, timed
from jax_aiter.native import mxfp4 as native_mxfp4
from jax_aiter.ref import mxfp4 as ref


def main(argv):
    m, n, k = (int(a) for a in argv) if argv else (16384, 14336, 4096)
    x, w, dy = normal(jax.random.key(0), (m, k)), normal(jax.random.key(1), (n, k), 0.05), \
        normal(jax.random.key(2), (m, n))
    rows = []

    def time_it(name, fn, *args):
        compiled = jax.jit(fn).lower(*args).compile()
        rows.append((name, timed(lambda a: compiled(*a), args, 7, 3)))

    dual = lambda t: gemm_fp4.cast_mxfp4_dual(t, layout_rowwise="gemm_a", layout_columnwise="plain")  # noqa
    time_it("bf16 dot fwd (x . w^T)", lambda x, w: jnp.dot(x, w.T), x, w)
    time_it("bf16 dot dgrad (dy . w)", lambda dy, w: jnp.dot(dy, w), dy, w)
    time_it("bf16 dot wgrad (dy^T . x)", lambda dy, x: jnp.dot(dy.T, x), dy, x)
    time_it("cast x rowwise (gemm_a)", lambda t: gemm_fp4.cast_mxfp4(t, layout="gemm_a"), x)
    time_it("cast w rowwise (gemm_b)", lambda t: gemm_fp4.cast_mxfp4(t, layout="gemm_b"), w)
    time_it("cast x dual", dual, x)
    time_it("cast w dual", dual, w)
    time_it("cast dy dual", dual, dy)
    xa, xs = gemm_fp4.cast_mxfp4(x, layout="gemm_a")
    wb, ws = gemm_fp4.cast_mxfp4(w, layout="gemm_b")
    time_it("dequantize x, w to bf16", lambda *o: ref._gemm_operands(*o, ref.dequantize_bf16), xa, wb, xs, ws)
    platform = next((p for p in ("cuda", "rocm") if p in _native.present_platforms()), "cpu")
    if not _native.load(native.LIBRARY[platform]).problem:
        time_it("native dequantize x, w to bf16", lambda xa, wb, xs, ws: (
            native_mxfp4.dequantize_bf16(xa, xs, layout="gemm_a"),
            native_mxfp4.dequantize_bf16(wb, ws, layout="gemm_b")), xa, wb, xs, ws)
        time_it("native gemm_fp4 fprop (dequantize + dot)", native_mxfp4.gemm_fp4, xa, wb, xs, ws)
    time_it("gemm_fp4 fprop (dequantize + dot)", ref.gemm_fp4_bf16_operands, xa, wb, xs, ws)
    time_it("gemm_fp4_bf16 fwd", lambda x, w: gemm_fp4.gemm_fp4_bf16(x, w), x, w)

    def step(x, w, dy):
        y, vjp = jax.vjp(lambda x, w: gemm_fp4.gemm_fp4_bf16(x, w), x, w)
        return (y, *vjp(dy))

    def step_bf16(x, w, dy):
        y, vjp = jax.vjp(lambda x, w: jnp.dot(x, w.T), x, w)
        return (y, *vjp(dy))

    time_it("gemm_fp4_bf16 fwd+bwd", step, x, w, dy)
    time_it("bf16 linear fwd+bwd", step_bf16, x, w, dy)
    print(f"linear breakdown, M N K = {m} {n} {k}")
    for name, seconds in rows:
        print(f"  {name:<40} {seconds * 1e3:8.3f} ms")


if __name__ == "__main__":
    main(sys.argv[1:])
