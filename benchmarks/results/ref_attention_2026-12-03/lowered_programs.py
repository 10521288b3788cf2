"""The gradient programs of the reference, before (main 8b3c3e9) and now, lowered for cpu, cuda and rocm
(bf16; no mask, softcap, causal, sliding window, bias, dropout, 100 queries): which programs are unchanged, and for
the others the lines that differ once SSA names are left out.
    git show 8b3c3e9:jax_aiter/ref/mha.py > /tmp/before_mha.py && python3 lowered_programs.py /tmp/before_mha.py"""
import difflib, importlib.util, re, sys
import jax, jax.numpy as jnp
from jax_aiter.ref import mha as committed_mha

spec = importlib.util.spec_from_file_location("before_mha", sys.argv[1])
before_mha = importlib.util.module_from_spec(spec)
spec.loader.exec_module(before_mha)
CASES = {"no mask": ((1, 1100, 4, 2, 64), (-1, -1), 0.0, 0.0), "softcap": ((1, 700, 4, 4, 64), (-1, -1), 0.0, 2.0),
         "causal": ((1, 1100, 4, 2, 64), (-1, 0), 0.0, 0.0), "window": ((1, 2100, 4, 1, 64), (64, 0), 0.0, 0.0),
         "bias": ((1, 1100, 4, 2, 64), (-1, -1), 0.0, 0.0), "dropout": ((1, 300, 2, 2, 64), (-1, -1), 0.1, 0.0),
         "100 queries": ((2, 100, 4, 4, 32), (-1, -1), 0.0, 0.0)}

def lowered(mod, case, platform):
    (B, S, H, HK, D), window, dropout_p, softcap = CASES[case]
    args = [jax.ShapeDtypeStruct((B, S, H, D), jnp.bfloat16)] + 2 * [jax.ShapeDtypeStruct((B, S, HK, D), jnp.bfloat16)]
    if case == "bias":
        args.append(jax.ShapeDtypeStruct((1, 1, S, S), jnp.float32))

    def loss(q, k, v, bias=None):
        out, lse = mod.attention(q, k, v, bias=bias, alibi_slopes=None, softmax_scale=0.125, window=window,
                                 dropout_seed=jnp.zeros(2, jnp.uint32) if dropout_p else None, dropout_p=dropout_p,
                                 softcap=softcap)
        return out.astype(jnp.float32).sum() + lse.sum()

    grad = jax.jit(jax.grad(loss, argnums=tuple(range(len(args)))))
    return grad.trace(*args).lower(lowering_platforms=(platform,)).as_text()

def nameless(text):
    return [re.sub(r"(iterArg|c|cst|arg)_?\d+", r"\1", re.sub(r"%[\w#.:]+", "%", line)) for line in text.splitlines()]

for platform in ("cpu", "cuda", "rocm"):
    for case in CASES:
        before, now = lowered(before_mha, case, platform), lowered(committed_mha, case, platform)
        if before == now:
            print(f"{platform} {case}: unchanged")
            continue
        diff = [line for line in difflib.unified_diff(nameless(before), nameless(now), lineterm="", n=0)
                if line[:1] in "+-" and line[:3] not in ("+++", "---")]
        print(f"{platform} {case}: {len(diff)} lines differ once SSA names are left out")
        if platform != "cpu":
            for line in diff:
                print("   ", line.strip()[:160])
