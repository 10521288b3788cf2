"""Where gemm_fp8's fwd+bwd time goes on one GPU, and what changes would buy (issue 18: target <= 0.70x BF16).

One process, the shape of the bench's linear row (M, N, K = 16384, 14336, 4096), every program timed with its
batches interleaved (jax_aiter.benchmark.timed_together). Variants re-implement gemm_fp8's custom VJP here with
the casts of jax_aiter.ref.gemm_fp8 and one knob changed each; the compiled HLO of each is summarized (its cuBLAS
calls and their result types) so a time can be tied to what XLA emitted.

usage: python3 fp8_probe.py OUT_DIR
"""

import functools
import json
import re
import sys

import jax
import jax.numpy as jnp
from jax import lax

from jax_aiter.benchmark import compile_fn, normal, timed_together
from jax_aiter.gemm_fp8 import gemm_fp8
from jax_aiter.ref import gemm_fp8 as ref

M, N, K = 16384, 14336, 4096
HIGHEST, DEFAULT = lax.Precision.HIGHEST, lax.Precision.DEFAULT


def product(qa, qb, scale, contracting, precision, form, out_dtype):
    dims = (((contracting[0],), (contracting[1],)), ((), ()))
    if form == "f8":  # gemm_fp8's form: float8 operands, float32 result, scale after, one rounding
        return (lax.dot_general(qa, qb, dims, precision=precision, preferred_element_type=jnp.float32)
                * scale).astype(out_dtype)
    if form == "upcast":  # operands upcast to bf16 (exact), float32 result
        return (lax.dot_general(qa.astype(jnp.bfloat16), qb.astype(jnp.bfloat16), dims, precision=precision,
                                preferred_element_type=jnp.float32) * scale).astype(out_dtype)
    if form == "f8_out":  # the result type asked of the dot itself (a second rounding: timing only)
        return lax.dot_general(qa, qb, dims, precision=precision,
                               preferred_element_type=out_dtype) * scale.astype(out_dtype)
    raise ValueError(form)


def cast(t, fmt):
    s = ref.current_scale(t, fmt)
    return ref.quantize(t, s, fmt), s


def make_linear(fprop_precision, backward_precision, form):
    @jax.custom_vjp
    def linear(x, w):
        return fwd(x, w)[0]

    def fwd(x, w):
        qx, sx = cast(x, ref.E4M3)
        qw, sw = cast(w, ref.E4M3)
        return product(qx, qw, sx * sw, (1, 1), fprop_precision, form, x.dtype), (qx, qw, sx, sw)

    def bwd(res, dy):
        qx, qw, sx, sw = res
        qg, sg = cast(dy, ref.E5M2)
        dx = product(qg, qw, sg * sw, (1, 0), backward_precision, form, jnp.bfloat16)
        dw = product(qg, qx, sg * sx, (0, 0), backward_precision, form, jnp.bfloat16)
        return dx, dw

    linear.defvjp(fwd, bwd)
    return linear


def fwd_bwd(fn):
    def program(a):
        y, vjp = jax.vjp(fn, a[0], a[1])
        return (y, *vjp(a[2]))
    return program


def casts_only(a):
    return tuple(cast(t, f) for t, f in ((a[0], ref.E4M3), (a[1], ref.E4M3), (a[2], ref.E5M2)))


def gemms_only(precision, form):
    def program(q):
        qx, qw, qg, s = q
        return (product(qx, qw, s, (1, 1), precision, form, jnp.bfloat16),
                product(qg, qw, s, (1, 0), precision, form, jnp.bfloat16),
                product(qg, qx, s, (0, 0), precision, form, jnp.bfloat16))
    return program


def hlo_summary(compiled) -> list[str]:
    text = compiled.as_text()
    calls = [line.strip()[:240] for line in text.splitlines() if "custom_call_target=\"__cublas" in line]
    fusions = len(re.findall(r"^\s*\S+ = \S+ fusion\(", text, flags=re.M))
    return [f"{len(calls)} cuBLAS calls, {fusions} fusions"] + calls


def main(out_dir):
    x, w, dy = normal(jax.random.key(0), (M, K)), normal(jax.random.key(1), (N, K), 0.05), \
        normal(jax.random.key(2), (M, N))
    inputs = (x, w, dy)
    linears = {
        "bf16": lambda a, b: jnp.dot(a, b.T),
        "gemm_fp8": gemm_fp8,
        "f8 DEFAULT fprop": make_linear(DEFAULT, HIGHEST, "f8"),
        "f8 DEFAULT all": make_linear(DEFAULT, DEFAULT, "f8"),
        "upcast HIGHEST": make_linear(HIGHEST, HIGHEST, "upcast"),
        "f8_out HIGHEST (two roundings)": make_linear(HIGHEST, HIGHEST, "f8_out"),
    }
    programs, hlo, values = {}, {}, {}
    for name, fn in linears.items():
        programs[name] = compile_fn(fwd_bwd(fn), inputs)
        hlo[name] = hlo_summary(programs[name])
        values[name] = programs[name](inputs)
        print(f"compiled {name}: {hlo[name][0]}", flush=True)
    times = timed_together(programs, inputs, batches=7, calls=3)

    quantized = jax.jit(casts_only)(inputs)
    q = (quantized[0][0], quantized[1][0], quantized[2][0], jnp.float32(1e-3))
    parts = {"casts only (amax + cast of x, w, dy)": (compile_fn(casts_only, inputs), inputs)}
    for precision, pname in ((HIGHEST, "HIGHEST"), (DEFAULT, "DEFAULT")):
        for form in ("f8",):
            parts[f"3 GEMMs only, {form} {pname}"] = (compile_fn(gemms_only(precision, form), q), q)
    part_times = {}
    for name, (prog, args) in parts.items():
        part_times[name] = timed_together({name: prog}, args, batches=7, calls=3)[name]
        hlo[name] = hlo_summary(prog)
        print(f"{name}: {part_times[name] * 1e3:.3f} ms", flush=True)

    ref_vals = values["gemm_fp8"]
    report = {"shape": [M, N, K], "device": jax.devices()[0].device_kind, "jax": jax.__version__,
              "fwd_bwd_s": times, "over_bf16": {k: v / times["bf16"] for k, v in times.items()},
              "parts_s": part_times, "hlo": hlo,
              "max_abs_diff_vs_gemm_fp8": {
                  k: [float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))))
                      for a, b in zip(v, ref_vals)] for k, v in values.items() if k not in ("bf16", "gemm_fp8")}}
    for k, v in times.items():
        print(f"{k:34s} {v * 1e3:7.3f} ms  {v / times['bf16']:.3f}x bf16")
    for k, v in part_times.items():
        print(f"{k:40s} {v * 1e3:7.3f} ms")
    for k, v in hlo.items():
        print(k, "::", v[0])
    with open(f"{out_dir}/fp8_probe.json", "w") as f:
        json.dump(report, f, indent=1)
    with open(f"{out_dir}/gemm_fp8_hlo.txt", "w") as f:
        f.write(programs["gemm_fp8"].as_text())


if __name__ == "__main__":
    main(sys.argv[1])
