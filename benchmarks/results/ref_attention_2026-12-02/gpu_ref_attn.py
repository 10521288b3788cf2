"""Reference attention on the GPU: the committed jax_aiter.ref.mha beside the sequence-major form of main
eb97793 and jax.nn.dot_product_attention (xla, cudnn), fwd+bwd, with accuracy against float64 for float32 and
bfloat16 inputs. Run from a checkout:
    git show eb97793:jax_aiter/ref/mha.py > /tmp/old_mha.py && python3 gpu_ref_attn.py /tmp/old_mha.py
ref_attention.json and gpu_ref_attn.log also hold the two intermediate forms measured while the change was made
(head-major with autodiff; head-major with the written-out backward and bf16 products, without key-range groups),
whose code was not kept."""
import json, os, sys, time
import numpy as np
import jax, jax.numpy as jnp
from jax import lax
import importlib.util
from jax_aiter.ref import mha as committed_mha

out_dir = os.environ.get("OUT", ".")
B, S, H, HK, D = (4, 4096, 32, 8, 128) if jax.default_backend() == "gpu" else (1, 512, 4, 2, 64)
results = dict(device=str(jax.devices()[0]), jax=jax.__version__, shape=[B, S, H, HK, D], rows=[])

def ref_fn(mod):
    return lambda q, k, v: mod.attention(q, k, v, bias=None, alibi_slopes=None, dropout_seed=None,
                                         softmax_scale=q.shape[-1] ** -0.5, window=(-1, 0), dropout_p=0.0)[0]

def fb(f):
    def g(q, k, v, do):
        o, vjp = jax.vjp(f, q, k, v)
        return (o, *vjp(do))
    return jax.jit(g)

def timed(fn, args, n=10):
    jax.block_until_ready(fn(*args))
    best = []
    for _ in range(n):
        t = time.perf_counter(); jax.block_until_ready(fn(*args)); best.append(time.perf_counter() - t)
    return float(np.median(best))

spec = importlib.util.spec_from_file_location("old_mha", sys.argv[1])
old_mha = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old_mha)
variants = [("sequence-major (eb97793)", old_mha),
            ("head-major, written-out backward, bf16 tensor cores, query blocks in 4 groups over the keys their "
             "window allows (committed)", committed_mha)]
ks = jax.random.split(jax.random.key(0), 4)
bf = lambda kk, shape: jax.random.normal(kk, shape, jnp.float32).astype(jnp.bfloat16)
args = (bf(ks[0], (B, S, H, D)), bf(ks[1], (B, S, HK, D)), bf(ks[2], (B, S, HK, D)), bf(ks[3], (B, S, H, D)))

# accuracy: float32 inputs, small shape, against float64 dense attention
sb, ss, sh, shk, sd = 1, 1024, 8, 2, 128
acc_args = [np.asarray(jax.random.normal(kk, s, jnp.float32)) for kk, s in
            zip(ks, [(sb, ss, sh, sd), (sb, ss, shk, sd), (sb, ss, shk, sd), (sb, ss, sh, sd)])]
def f64_oracle(q, k, v, do):
    # numpy float64, causal, GQA; returns out, dq, dk, dv
    g = sh // shk
    qq = q.reshape(sb, ss, shk, g, sd).astype(np.float64); kk = k.astype(np.float64); vv = v.astype(np.float64)
    s = np.einsum("bqhgd,bkhd->bhgqk", qq, kk) * sd ** -0.5
    mask = np.tril(np.ones((ss, ss), bool)); s = np.where(mask, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    o = np.einsum("bhgqk,bkhd->bqhgd", p, vv)
    dd = do.reshape(sb, ss, shk, g, sd).astype(np.float64)
    dp = np.einsum("bqhgd,bkhd->bhgqk", dd, vv)
    dv = np.einsum("bhgqk,bqhgd->bkhd", p, dd)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True)) * sd ** -0.5
    dq = np.einsum("bhgqk,bkhd->bqhgd", ds, kk)
    dk = np.einsum("bhgqk,bqhgd->bkhd", ds, qq)
    return [o.reshape(sb, ss, sh, sd), dq.reshape(sb, ss, sh, sd), dk, dv]
oracle = f64_oracle(*acc_args)

xla = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
base = {}
for name, fn in [("jax.nn xla", xla)] + ([("jax.nn cudnn", lambda q, k, v: jax.nn.dot_product_attention(
        q, k, v, is_causal=True, implementation="cudnn"))] if jax.default_backend() == "gpu" else []):
    base[name] = timed(fb(fn), args)
    results["rows"].append(dict(name=name, time_s=base[name]))
    print(name, "%.2f ms" % (base[name] * 1e3), flush=True)
bf_acc = [a.astype(jnp.bfloat16) for a in map(jnp.asarray, acc_args)]
oracle_bf = f64_oracle(*[np.asarray(a.astype(jnp.float32)) for a in bf_acc])
def rel_err(got, want):
    return {n: float(np.max(np.abs(np.asarray(g.astype(jnp.float32), np.float64) - o)) / np.max(np.abs(o)))
            for n, g, o in zip(("out", "dq", "dk", "dv"), got, want)}
for name, mod in variants:
    row = dict(name=name)
    try:
        f = fb(ref_fn(mod))
        row["time_s"] = timed(f, args)
        row["over_xla"] = row["time_s"] / base["jax.nn xla"]
        row["max_rel_err_vs_f64_float32_inputs"] = rel_err(f(*map(jnp.asarray, acc_args)), oracle)
        row["max_rel_err_vs_f64_bfloat16_inputs"] = rel_err(f(*bf_acc), oracle_bf)
    except Exception as err:  # noqa: BLE001
        row["error"] = f"{type(err).__name__}: {str(err)[:300]}"
    results["rows"].append(row)
    print(json.dumps(row), flush=True)
for name in ("jax.nn xla",) + (("jax.nn cudnn",) if "jax.nn cudnn" in base else ()):
    fn = xla if name == "jax.nn xla" else (lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn"))
    row = next(r for r in results["rows"] if r["name"] == name)
    row["max_rel_err_vs_f64_bfloat16_inputs"] = rel_err(fb(fn)(*bf_acc), oracle_bf)
    print(json.dumps(row), flush=True)
json.dump(results, open(os.path.join(out_dir, "ref_attention.json"), "w"), indent=1)
