"""Per-kernel GPU time of the decoder-block step (bench --only block) for programs mixing plain and our ops."""
import json, sys, functools
sys.path.insert(0, "benchmarks")
import jax, jax.numpy as jnp
from train_step_profile import kernel_times
from jax_aiter import benchmark as B
from jax_aiter import activation, gemm, rmsnorm
from jax_aiter.gemm_fp4 import gemm_fp4_bf16
from jax_aiter.mha import flash_attn_func

import os
cfg = B.BlockConfig(batch=1, seq=256, dim=512, heads=4, kv_heads=2, ffn=1024) if os.environ.get("QUICK") else B.BlockConfig()

def block(params, x, ops):
    head_dim = cfg.dim // cfg.heads
    b, s, d = x.shape
    def linear(t, w):
        if ops["linear"] == "mxfp4": return gemm_fp4_bf16(t, w)
        if ops["linear"] == "ours": return gemm.gemm(t.reshape(-1, t.shape[-1]), w).reshape(*t.shape[:-1], w.shape[0])
        return jnp.dot(t, w.T)
    def norm(t, g):
        if ops["norm"] == "plain":
            t32 = t.astype(jnp.float32)
            return (t32 * jax.lax.rsqrt(jnp.mean(t32 * t32, -1, keepdims=True) + 1e-6) * g).astype(t.dtype)
        return rmsnorm.rms_norm(t, g, 1e-6)
    h = norm(x, params["norm1"])
    qkv = linear(h, params["qkv"])
    q, k, v = jnp.split(qkv, [cfg.heads * head_dim, (cfg.heads + cfg.kv_heads) * head_dim], axis=-1)
    q = q.reshape(b, s, cfg.heads, head_dim); k = k.reshape(b, s, cfg.kv_heads, head_dim); v = v.reshape(b, s, cfg.kv_heads, head_dim)
    if ops["attn"] == "plain":
        attn = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
    elif ops["attn"] == "unguarded":
        attn = B._unguarded_cudnn(q, k, v)
    else:
        attn = flash_attn_func(q, k, v, causal=True)
    x = x + linear(attn.reshape(b, s, d), params["o"])
    h = norm(x, params["norm2"])
    if ops["act"] == "plain":
        gate, up = jnp.split(linear(h, params["gate_up"]), 2, axis=-1)
        mlp = (jax.nn.silu(gate.astype(jnp.float32)) * up.astype(jnp.float32)).astype(x.dtype)
    else:
        mlp = activation.silu_and_mul(linear(h, params["gate_up"]))
    return x + linear(mlp, params["down"])

PLAIN = dict(linear="plain", norm="plain", attn="plain", act="plain")
OURS = dict(linear="ours", norm="ours", attn="ours", act="ours")
programs = {
    "plain_cudnn": PLAIN,
    "ours": OURS,
    "ours_mxfp4": dict(OURS, linear="mxfp4"),
    "ours_linear_plain": dict(OURS, linear="plain"),
    "ours_norm_plain": dict(OURS, norm="plain"),
    "ours_attn_plain": dict(OURS, attn="plain"),
    "ours_attn_unguarded": dict(OURS, attn="unguarded"),
    "ours_act_plain": dict(OURS, act="plain"),
}
if len(sys.argv) > 2:
    programs = {k: v for k, v in programs.items() if k in sys.argv[2].split(",")}
params = B.block_params(cfg, jax.random.key(0))
x = B.normal(jax.random.key(1), (cfg.batch, cfg.seq, cfg.dim))
dy = B.normal(jax.random.key(2), x.shape)
args = (params, x, dy)
compiled = {}
for name, ops in programs.items():
    def step(a, ops=ops):
        p, x, dy = a
        out, vjp = jax.vjp(lambda p, x: block(p, x, ops), p, x)
        return out, vjp(dy)
    compiled[name] = B.compile_fn(step, args)
times = B.timed_together({n: c for n, c in compiled.items()}, args, 7, 3, settle_s=B.STEADY_STATE_S)
res = {}
for name, c in compiled.items():
    kt = kernel_times(lambda *a, c=c: c(a), args)
    res[name] = dict(step_ms=times[name] * 1e3, **kt)
    print(f"{name}: step {times[name]*1e3:.3f} ms (x{times.get("plain_cudnn", times[name])/times[name]:.3f} of plain_cudnn) kernels {kt['kernel_ms']:.3f} span {kt['span_ms']:.3f}")
    for k in kt["kernels"][:25]:
        print(f"   {k['us']:9.1f} us {k['calls']:5.1f}x {k['name'][:140]}")
json.dump(res, open(f"{sys.argv[1]}/block_profile.json", "w"), indent=1)
