"""bf16 linear fwd+bwd on random-normal operands vs on MXFP4-representable ones (same shapes), and gemm_fp4_bf16,
each timed interleaved at its own steady clock, with the SM clock and power sampled during each timed batch."""
import json, subprocess, sys, threading, time, statistics
import jax, jax.numpy as jnp
from jax_aiter import benchmark as B
from jax_aiter.ref import mxfp4 as R
from jax_aiter.gemm_fp4 import gemm_fp4_bf16

import os
M, N, K = (256, 512, 256) if os.environ.get("QUICK") else (16384, 14336, 4096)
x = B.normal(jax.random.key(0), (M, K)); w = B.normal(jax.random.key(1), (N, K), K ** -0.5)
dy = B.normal(jax.random.key(2), (M, N))
def mx(t):
    d, s = R.quantize_rows(t, scale_rule="even", sr_key=None, transposed=False, hadamard=0, hadamard_key=None)
    return R.dequantize(d, s, jnp.bfloat16)
xq, wq, dyq = jax.jit(mx)(x), jax.jit(mx)(w), jax.jit(mx)(dy)
def lin(x, w): return jnp.dot(x, w.T)
def prog(fn):
    def p(a):
        y, vjp = jax.vjp(fn, a[0], a[1]); return (y, *vjp(a[2]))
    return p
cases = {"bf16 normal data": (prog(lin), (x, w, dy)), "bf16 mxfp4-valued data": (prog(lin), (xq, wq, dyq)),
         "gemm_fp4_bf16": (prog(gemm_fp4_bf16), (x, w, dy))}
compiled = {n: (B.compile_fn(f, a), a) for n, (f, a) in cases.items()}
current = [None]; samples = {n: [] for n in cases}
def poll():
    while current[0] != "stop":
        name = current[0]
        out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True).stdout.strip()
        if name in samples and out: samples[name].append([float(v) for v in out.split(",")])
        time.sleep(0.05)
threading.Thread(target=poll, daemon=True).start()
times = {n: [] for n in cases}
for n, (c, a) in compiled.items(): jax.block_until_ready(c(a))
for _ in range(7):
    for n, (c, a) in compiled.items():
        end = time.perf_counter() + 0.5
        while time.perf_counter() < end: jax.block_until_ready(c(a))
        current[0] = n
        start = time.perf_counter()
        for _ in range(10): out = c(a)
        jax.block_until_ready(out)
        times[n].append((time.perf_counter() - start) / 10)
        current[0] = None
current[0] = "stop"
res = {n: dict(ms=statistics.median(t) * 1e3, sm_mhz=statistics.median(s[0] for s in samples[n]) if samples[n] else None,
               watts=statistics.median(s[1] for s in samples[n]) if samples[n] else None, samples=len(samples[n]))
       for n, t in times.items()}
for n, r in res.items(): print(n, r)
json.dump(res, open(f"{sys.argv[1]}/power_probe.json", "w"), indent=1)
