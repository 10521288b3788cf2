"""Forward + backward of the reference attention (``flash_attn_func`` forced to the xla implementation) against
``jax.nn.dot_product_attention(implementation="xla")``, causal, bf16 (docs/performance.md, attention). The
reference's products run on matrix units off the CPU; the row "reference, float32 products" forces the CPU form
(float32 at ``Precision.HIGHEST``) on the same device, which the reference used everywhere before.

    python benchmarks/reference_attention.py [B S Hq D]

Prints milliseconds per forward + backward (median of interleaved batches) for 32 and 8 KV heads, and checks that
the calls agree: reference against XLA's attention within bf16 tolerance, the two reference forms within one
bf16 rounding of each other.
"""

import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jax_aiter
from jax_aiter.benchmark import normal, timed_together
from jax_aiter.mha import flash_attn_func
from jax_aiter.ref import mha as ref


def xla_attention(q, k, v):
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")


def reference(q, k, v):
    with jax_aiter.use_backend(flash_attn="xla"):
        return flash_attn_func(q, k, v, causal=True)


def reference_float32_products(q, k, v):
    out, _ = ref.attention(q, k, v, bias=None, alibi_slopes=None, dropout_seed=None,
                           softmax_scale=q.shape[-1] ** -0.5, window=(-1, 0), dropout_p=0.0, products="float32")
    return out


def step(attention, q, k, v, dout):
    """Output and the gradients of q, k, v for the cotangent dout: one training step's attention."""
    out, vjp = jax.vjp(attention, q, k, v)
    return out, *vjp(dout)


def agree(got, want, bound, what):
    """Whether every output and gradient in ``got`` is within ``bound(got, want)`` of ``want``; prints it."""
    worst = 0.0
    for a, b in zip(got, want, strict=True):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        worst = max(worst, float((np.abs(a - b) - bound(a, b)).max()))
    print(f"  {what}: {'agree' if worst <= 0 else f'DIFFER (largest excess over tolerance {worst:.3g})'}")
    return worst <= 0


def few_bf16_units(a, b):
    """XLA's attention rounds the probabilities to bf16 before p·v; relative to b's rms where b is near 0."""
    return 2 ** -5 * (np.abs(b) + np.sqrt(np.mean(b ** 2)))


def one_bf16_rounding(a, b):
    """Both forms round float32 values equal up to summation order once to bf16: at most one unit apart."""
    return 2 ** -7 * np.maximum(np.abs(a), np.abs(b))


def main(argv):
    batch, seq, q_heads, dim = (int(a) for a in argv) if argv else (4, 4096, 32, 128)
    print(f"{jax.devices()[0].device_kind}: B {batch}, S {seq}, Hq {q_heads}, D {dim}, causal, bf16, "
          "forward + backward, ms")
    print(f"| Hk | {'jax.nn xla':>10} | {'reference':>10} | {'ref / xla':>9} | {'reference, float32 products':>27} |")
    print("|---|---|---|---|---|")
    ok = True
    for kv_heads in (q_heads, q_heads // 4):
        keys = jax.random.split(jax.random.key(kv_heads), 4)
        q = normal(keys[0], (batch, seq, q_heads, dim))
        k, v = (normal(key, (batch, seq, kv_heads, dim)) for key in keys[1:3])
        dout = normal(keys[3], q.shape)
        calls = {name: jax.jit(functools.partial(step, fn))
                 for name, fn in (("xla", xla_attention), ("reference", reference),
                                  ("float32", reference_float32_products))}
        args = (q, k, v, dout)
        times = timed_together({name: functools.partial(lambda fn, a: fn(*a), fn) for name, fn in calls.items()},
                               args, batches=7, calls=3)
        ms = {name: 1e3 * t for name, t in times.items()}
        print(f"| {kv_heads} | {ms['xla']:10.2f} | {ms['reference']:10.2f} | {ms['reference'] / ms['xla']:8.2f}x "
              f"| {ms['float32']:27.2f} |")
        results = {name: fn(*args) for name, fn in calls.items()}
        ok &= agree(results["reference"], results["xla"], few_bf16_units, "reference vs jax.nn xla")
        ok &= agree(results["reference"], results["float32"], one_bf16_rounding, "reference vs its float32 products")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
