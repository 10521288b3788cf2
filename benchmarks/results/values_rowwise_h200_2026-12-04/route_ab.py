"""gemm_fp4_bf16 fwd+bwd with the A operands cast to values (default on CUDA) against the packed route, one library,
one process: the route is fixed at trace time, so the packed programs are traced with emulates_gemm_fp4 patched."""
import json, sys, time, statistics
import contextlib
import jax, jax.numpy as jnp
import jax_aiter
from jax_aiter import _backend
from jax_aiter.gemm_fp4 import _linear, gemm_fp4_bf16
out = sys.argv[1]
real = _linear.emulates_gemm_fp4
def make_step():
    def step(x, w, dy):  # a new function per route: jit caches traces by function
        y, vjp = jax.vjp(gemm_fp4_bf16, x, w)
        return y, vjp(dy)
    return step
res = {}
for m, k, n in [(16384, 768, 2048), (16384, 2048, 768), (16384, 4096, 14336)]:
    ks = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(ks[0], (m, k), jnp.bfloat16); w = jax.random.normal(ks[1], (n, k), jnp.bfloat16) * 0.02
    dy = jax.random.normal(ks[2], (m, n), jnp.bfloat16)
    progs = {}
    for route in ("values", "packed"):
        _linear.emulates_gemm_fp4 = real if route == "values" else (lambda *a: {p: False for p in _backend.PLATFORMS})
        # An override of an op not involved changes the partitioner's cache key, so the patched route is traced.
        with jax_aiter.use_backend(gemm_fp8="xla") if route == "packed" else contextlib.nullcontext():
            lowered = jax.jit(make_step()).lower(x, w, dy)
            progs[route] = lowered.compile()
        assert ('layout_rowwise = "values"' in lowered.as_text()) == (route == "values"), route
    _linear.emulates_gemm_fp4 = real
    outs = {r: jax.device_get(p(x, w, dy)) for r, p in progs.items()}
    same = all(bool((a.view("uint16") == b.view("uint16")).all()) for a, b in
               zip(jax.tree.leaves(outs["values"]), jax.tree.leaves(outs["packed"])))
    samples = {r: [] for r in progs}
    for _ in range(7):
        for r, p in progs.items():
            t_end = time.perf_counter() + 0.25
            while time.perf_counter() < t_end: jax.block_until_ready(p(x, w, dy))
            t0 = time.perf_counter()
            for _ in range(10): o = p(x, w, dy)
            jax.block_until_ready(o)
            samples[r].append((time.perf_counter() - t0) / 10 * 1e3)
    med = {r: statistics.median(v) for r, v in samples.items()}
    res[f"{m}x{k}->{n}"] = dict(ms=med, samples=samples, same_bits=same)
    print(f"{m}x{k}->{n}: values {med['values']:.3f} ms, packed {med['packed']:.3f} ms, packed/values {med['packed']/med['values']:.3f}, same bits {same}", flush=True)
    json.dump(res, open(f"{out}/route_ab.json", "w"), indent=1)

# The 75 M model's training step, MXFP4 on every block, both routes, timed together (the benchmark's method).
from jax_aiter.benchmark import compile_fn, timed_together
from jax_aiter.examples import convergence, tiny_llama
setup = convergence.Setup.for_model("75m"); cfg = setup.config
params = tiny_llama.init_params(cfg, jax.random.key(0)); opt = tiny_llama.adam_init(params)
tokens = jax.random.randint(jax.random.key(1), (cfg.batch, cfg.seq_len + 1), 0, cfg.vocab, jnp.int32)
args = (params, opt, tokens)
steps = {}
for arm in ("bf16", "mxfp4-every-block"):
    for route in (("values", "packed") if arm != "bf16" else ("values",)):
        _linear.emulates_gemm_fp4 = real if route == "values" else (lambda *a: {p: False for p in _backend.PLATFORMS})
        with jax_aiter.use_backend(gemm_fp8="xla") if route == "packed" else contextlib.nullcontext():
            fn = compile_fn(convergence.make_step(setup, convergence.ARMS[arm].policy, jax.random.key(2)), *args)
        _linear.emulates_gemm_fp4 = real
        steps[f"{arm}/{route}"] = lambda a, fn=fn: fn(*a)
        steps[f"{arm}/{route}"](args)
for rnd in range(2):
    times = timed_together(steps, args, 7, calls=3, settle_s=0.5)
    print("step round", rnd, {k: f"{v*1e3:.2f} ms" for k, v in times.items()},
          "packed/values", times["mxfp4-every-block/packed"] / times["mxfp4-every-block/values"], flush=True)
    res[f"step_round{rnd}"] = times
    json.dump(res, open(f"{out}/route_ab.json", "w"), indent=1)
