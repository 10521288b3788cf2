"""Where flash_attn_varlen's time over cuDNN's dense call goes (B 4, S 4096, Hq 32, D 128, causal, fwd + bwd):
cuDNN dense; our varlen on this tree; copies of its cuDNN path with the per-token sequence index from
jnp.searchsorted's while loop (main before this change) and from the unrolled search, and without the final
select (wrong in general: its cost only); the packed cuDNN call alone; the dense default. All timed interleaved
and settled in one process; cuDNN dense, the packed call alone and our varlen then profiled per kernel, with
their optimized HLO written (xz) to find the owners of the memsets and copies the packed layout adds.

    PYTHONPATH=. python benchmarks/results/varlen_h200_2026-12-06/probe.py OUT_DIR   (from the repository root)
"""
import json
import lzma
import sys

import jax
import jax.numpy as jnp

from jax_aiter.benchmark import compile_fn, normal, timed_together
from jax_aiter.mha import _cudnn, attention
from benchmarks.train_step_profile import kernel_times

out_dir = sys.argv[1]
batch, seq, heads, dim = 4, 4096, 32, 128


def packed(q, k, v, cu_q, cu_k, options, method, select):
    total_q, total_k = q.shape[0], k.shape[0]
    q_offsets = jnp.concatenate([cu_q, jnp.asarray([total_q], cu_q.dtype)])
    k_offsets = jnp.concatenate([cu_k, jnp.asarray([total_k], cu_k.dtype)])
    len_k = jnp.diff(cu_k)
    mask = _cudnn._private_cudnn.MaskType.PADDING_CAUSAL
    out = _cudnn._private_cudnn.dot_product_attention(
        q[None], k[None], v[None], q_seqlen=jnp.diff(q_offsets)[None], kv_seqlen=jnp.diff(k_offsets)[None],
        q_offsets=q_offsets[None], kv_offsets=k_offsets[None], scale=options.softmax_scale, mask_type=mask)[0]
    if not select:
        return out
    sequence = jnp.searchsorted(cu_q[1:], jnp.arange(total_q, dtype=cu_q.dtype), side="right", method=method)
    nseq = len_k.shape[0]
    sees_keys = (sequence < nseq) & (len_k[jnp.clip(sequence, 0, nseq - 1)] > 0)
    return jnp.where(sees_keys[:, None, None], out, 0)


rows = {}
for kv_heads in (heads, heads // 4):
    # the inputs of jax-aiter bench's attention rows
    q, do = (normal(jax.random.key(i), (batch, seq, heads, dim)) for i in (0, 3))
    k, v = (normal(jax.random.key(i), (batch, seq, kv_heads, dim)) for i in (1, 2))
    cu = jnp.arange(batch + 1, dtype=jnp.int32) * seq
    flat = lambda t: t.reshape(batch * seq, *t.shape[2:])  # noqa: E731
    (_, _, _, cu_q, cu_k), params = attention.flash_attn_varlen_call(
        flat(q), flat(k), flat(v), cu, cu, seq, seq, dropout_p=0.0, softmax_scale=None, causal=True,
        window_size=(-1, -1), bias=None, alibi_slopes=None, deterministic=False, return_lse=False, dropout_key=None)
    options = params["options"]

    def guarded(method, select=True):
        kernel = lambda q, k, v, cu_q, cu_k, options: packed(q, k, v, cu_q, cu_k, options, method, select)  # noqa
        fn = attention._non_finite_kept_out(kernel, attention._xla_flash_attn_varlen)
        return lambda q, k, v: fn(flat(q), flat(k), flat(v), cu, cu, options=options).reshape(q.shape)

    variants = {
        "cudnn dense": lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn"),
        "varlen this tree": lambda q, k, v: attention.flash_attn_varlen(
            flat(q), flat(k), flat(v), cu, cu, seq, seq, causal=True).reshape(q.shape),
        "varlen scan (the old index)": guarded("scan"),
        "varlen scan_unrolled": guarded("scan_unrolled"),
        "varlen no select": guarded("scan", select=False),
        "packed alone": lambda q, k, v: packed(flat(q), flat(k), flat(v), cu, cu, options, "scan", False
                                               ).reshape(q.shape),
        "dense default": lambda q, k, v: attention.flash_attn_func(q, k, v, causal=True),
    }
    compiled = {}
    for name, fn in variants.items():
        def program(a, fn=fn):
            o, vjp = jax.vjp(fn, *a[:3])
            return (o, *vjp(a[3]))
        try:
            compiled[name] = compile_fn(program, (q, k, v, do))
        except Exception as err:  # noqa: BLE001
            print(f"hk{kv_heads} {name}: {type(err).__name__}: {str(err)[:300]}")
            continue
        text = compiled[name].as_text()
        print(f"hk{kv_heads} {name}: while loops {text.count(' while(')}, conditionals {text.count(' conditional(')}")
    ref = compiled["varlen this tree"]((q, k, v, do))
    for name in ("varlen scan_unrolled", "varlen scan (the old index)"):
        got = compiled[name]((q, k, v, do))
        same = all(bool(jnp.array_equal(a, b)) for a, b in zip(ref, got))
        print(f"hk{kv_heads} {name} equal to this tree: {same}")
    times = timed_together(compiled, (q, k, v, do), batches=7, calls=10, settle_s=1.0)
    for name, t in times.items():
        print(f"hk{kv_heads} {name:28s} {t * 1e3:7.3f} ms  cudnn/this {times['cudnn dense'] / t:.3f}")
        rows[f"hk{kv_heads} {name}"] = t
    # The memsets and memcpy128 kernels of the varlen call (2026-12-04 profile): cuDNN's own or XLA's, and whose.
    for name in ("cudnn dense", "packed alone", "varlen this tree"):
        with lzma.open(f"{out_dir}/hk{kv_heads}_{name.replace(' ', '_')}.hlo.txt.xz", "wt") as f:
            f.write(compiled[name].as_text())
        profile = kernel_times(compiled[name], ((q, k, v, do),))
        rows[f"hk{kv_heads} {name} profile"] = profile
        print(f"hk{kv_heads} {name} per call: kernels {profile['kernel_ms']:.3f} ms, span {profile['span_ms']:.3f} ms")
        for kernel in profile["kernels"][:16]:
            print(f"   {kernel['us']:8.1f} us {kernel['calls']:4.1f}x {kernel['name'][:90]}")
with open(f"{out_dir}/varlen_probe.json", "w") as f:
    json.dump(rows, f, indent=1)
