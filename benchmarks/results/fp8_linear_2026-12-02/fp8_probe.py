"""Where the FP8 linear's time goes (x [16384, 4096], W [14336, 4096], fwd + bwd, one process, interleaved):
jax_aiter.gemm_fp8 against the bf16 linear, the three FP8 GEMMs alone on operands cast beforehand (at HIGHEST
precision, as gemm_fp8 asks, and at DEFAULT, where XLA lets cuBLASLt accumulate fast), the casts alone, and
gemm_fp8 forms that differ in one thing each: fast accumulation in fprop only / in every GEMM; the backward's
operands cast straight into the layouts cuBLASLt's FP8 GEMM needs (K-major)."""
import functools, json, os, sys
import jax, jax.numpy as jnp
from jax import lax
from jax_aiter.benchmark import compile_fn, normal, timed_together
from jax_aiter.gemm_fp8 import gemm_fp8
from jax_aiter.ref import gemm_fp8 as ref

M, N, K = (16384, 14336, 4096) if jax.default_backend() == "gpu" else (256, 512, 128)
x, w, dy = normal(jax.random.key(0), (M, K)), normal(jax.random.key(1), (N, K), 0.05), normal(jax.random.key(2), (M, N))
E4, E5 = ref.E4M3, ref.E5M2


def cast(t, fmt):
    s = ref.current_scale(t, fmt)
    return ref.quantize(t, s, fmt), s


def dot(a, b, ca, cb, prec):
    """a·b over a's axis ca and b's axis cb, float32 out."""
    return lax.dot_general(a, b, (((ca,), (cb,)), ((), ())), precision=prec, preferred_element_type=jnp.float32)


def variant(fprop_prec, bwd_prec, k_major):
    @jax.custom_vjp
    def linear(a, b):
        return fwd(a, b)[0]

    def fwd(a, b):
        qx, sx = cast(a, E4)
        qw, sw = cast(b, E4)
        y = (dot(qx, qw, 1, 1, fprop_prec) * (sx * sw)).astype(a.dtype)
        return y, ((a if k_major else qx), qw, sx, sw)

    def bwd(res, g):
        xres, qw, sx, sw = res
        qg, sg = cast(g, E5)
        if k_major:
            # dgrad's B = W^T [K, N] and wgrad's A = g^T [N, M], B = x^T [K, M], cast straight from the transposes
            dx = dot(qg, qw.T, 1, 1, bwd_prec) * (sg * sw)
            qgt = ref.quantize(g.T, sg, E5)
            qxt = ref.quantize(xres.T, sx, E4)
            dw = dot(qgt, qxt, 1, 1, bwd_prec) * (sg * sx)
        else:
            dx = dot(qg, qw, 1, 0, bwd_prec) * (sg * sw)
            dw = dot(qg, xres, 0, 0, bwd_prec) * (sg * sx)
        return dx.astype(jnp.bfloat16), dw.astype(jnp.bfloat16)

    linear.defvjp(fwd, bwd)
    return linear


H, D = lax.Precision.HIGHEST, lax.Precision.DEFAULT
linears = {"bf16": lambda a, b: jnp.dot(a, b.T), "gemm_fp8": gemm_fp8,
           "probe, as gemm_fp8": variant(H, H, False), "fast accumulation in fprop": variant(D, H, False),
           "fast accumulation everywhere": variant(D, D, False), "K-major backward casts": variant(H, H, True),
           "K-major + fast fprop": variant(D, H, True)}
programs = {}
for name, fn in linears.items():
    def program(a, fn=fn):
        y, vjp = jax.vjp(fn, a[0], a[1])
        return (y, *vjp(a[2]))
    programs[name] = compile_fn(program, (x, w, dy))

qx, qw, qg = cast(x, E4)[0], cast(w, E4)[0], cast(dy, E5)[0]
for prec, tag in ((H, "HIGHEST"), (D, "DEFAULT")):
    programs[f"3 FP8 GEMMs alone, {tag}"] = compile_fn(
        lambda a, p=prec: (dot(a[0], a[1], 1, 1, p), dot(a[2], a[1], 1, 0, p), dot(a[2], a[0], 0, 0, p)), (qx, qw, qg))
programs["casts alone (x, W, dy)"] = compile_fn(lambda a: (cast(a[0], E4), cast(a[1], E4), cast(a[2], E5)), (x, w, dy))

args = {name: ((qx, qw, qg) if "GEMMs alone" in name else (x, w, dy)) for name in programs}
times = {}
groups = [[n for n in programs if "GEMMs alone" not in n], [n for n in programs if "GEMMs alone" in n]]
for group in groups:
    by_args = {n: programs[n] for n in group}
    times.update(timed_together(by_args, args[group[0]], batches=7, calls=3))
ref_out = programs["bf16"]((x, w, dy))
rows = []
for name, t in times.items():
    row = dict(name=name, ms=t * 1e3, over_bf16=t / times["bf16"])
    if name in linears and name != "bf16":
        out = programs[name]((x, w, dy))
        row["rel_err_vs_bf16"] = [float(jnp.linalg.norm((a.astype(jnp.float32) - b.astype(jnp.float32)).ravel())
                                        / jnp.linalg.norm(b.astype(jnp.float32).ravel())) for a, b in zip(out, ref_out)]
        if name != "gemm_fp8":
            row["equal_to_gemm_fp8"] = [bool(jnp.array_equal(a, b)) for a, b in zip(out, programs["gemm_fp8"]((x, w, dy)))]
    rows.append(row)
    print(json.dumps(row), flush=True)
json.dump(dict(device=str(jax.devices()[0]), jax=jax.__version__, shape=[M, N, K], rows=rows),
          open(os.path.join(os.environ.get("OUT", "."), "fp8_probe.json"), "w"), indent=1)
