"""Probe: MXFP4 GEMM emulated on FP8 (E4M3) tensor cores, against the bf16 emulation and a float64 oracle.

Each MXFP4 row gets one power-of-two factor 2^E with E = (largest block exponent) - 6: every element
code * 2^(e_block - E) is exact in E4M3 when e_block >= E - 8 (span <= 14 binades incl. the 2^6 headroom).
Parts: A accuracy + timing on synthetic operands; B adversarial accumulation; C spans of real operands
(75m model on real text, bf16 training) per GEMM role; writes $OUT/fp8_emulation.json.
"""
import collections
import functools
import json
import sys
import time

import numpy as np
import jax
import jax.numpy as jnp
from jax import lax

jax.config.update("jax_enable_x64", True)

from jax_aiter.ref import mxfp4 as ref  # noqa: E402

OUT = sys.argv[1]
SMALL = len(sys.argv) > 2  # CPU smoke test
F8 = jnp.float8_e4m3fn
NT = (((1,), (1,)), ((), ()))
result = {"device": str(jax.devices()[0]), "jax": jax.__version__}


def save():
    with open(f"{OUT}/fp8_emulation.json", "w") as f:
        json.dump(result, f, indent=1)


def quantize(x):
    return ref.quantize_rows(x, scale_rule="even", sr_key=None, transposed=False, hadamard=0, hadamard_key=None)


def fp8_rows(data, scales):
    """(f8 [R, K], row exponent E [R] int32, exact [R] bool, span [R] int32) of plain MXFP4 rows."""
    vals = ref.dequantize(data, scales)
    r, k = vals.shape
    nz = jnp.max(jnp.abs(vals.reshape(r, k // 32, 32)), axis=-1) > 0
    e = scales.astype(jnp.int32) - 127
    emax = jnp.max(jnp.where(nz, e, -1000), axis=1)
    emin = jnp.min(jnp.where(nz, e, 1000), axis=1)
    anynz = jnp.any(nz, axis=1)
    row_e = jnp.where(anynz, emax - 6, 0)
    span = jnp.where(anynz, emax - emin, 0)
    # 2^-E in two exact steps (E can be near the float32 range's ends)
    half = row_e // 2
    scaled = vals * jnp.ldexp(1.0, -half).astype(jnp.float32)[:, None]
    scaled = scaled * jnp.ldexp(1.0, -(row_e - half)).astype(jnp.float32)[:, None]
    f8 = scaled.astype(F8)
    exact = jnp.all(f8.astype(jnp.float32) == scaled, axis=1)
    return f8, row_e, exact, span


def fp8_gemm(a8, ea, b8, eb, precision, out=jnp.float32):
    acc = lax.dot_general(a8, b8, NT, precision=precision, preferred_element_type=jnp.float32)
    s = (ea[:, None] + eb[None, :])
    h = s // 2
    acc = acc * jnp.ldexp(1.0, h).astype(jnp.float32) * jnp.ldexp(1.0, s - h).astype(jnp.float32)
    return acc.astype(out)


def timeit(fn, *args, reps=20, batches=5):
    out = fn(*args)
    jax.block_until_ready(out)
    best = []
    for _ in range(batches):
        t = time.perf_counter()
        for _ in range(reps):
            out = fn(*args)
        jax.block_until_ready(out)
        best.append((time.perf_counter() - t) / reps)
    return float(np.median(best))


def kernels(fn, *args):
    txt = jax.jit(fn).lower(*args).compile().as_text()
    names = set()
    for line in txt.splitlines():
        for key in ("custom_call_target=\"", "__triton", "kind=kCustom"):
            if key in line:
                i = line.find("custom_call_target=\"")
                if i >= 0:
                    names.add(line[i + 20:line.find("\"", i + 20)])
                if "__triton" in line:
                    names.add("triton")
    return sorted(names)


def err_stats(got, oracle, norm):
    err = jnp.abs(got.astype(jnp.float64) - oracle)
    rel = err / jnp.maximum(norm, 1e-300)
    return {"max_err_over_sum_abs": float(jnp.max(rel)), "mean_err_over_sum_abs": float(jnp.mean(rel)),
            "exact_fraction": float(jnp.mean(err == 0))}


# --- A: synthetic operands --------------------------------------------------------------------------------
def part_a():
    shapes = [(256, 256, 512)] if SMALL else [(8192, 8192, 8192), (16384, 14336, 4096)]
    kinds = {
        "normal": lambda k, s: jax.random.normal(k, s, jnp.float32),
        "outlier_channels": lambda k, s: jax.random.normal(k, s, jnp.float32) * jnp.where(
            jax.random.uniform(jax.random.fold_in(k, 1), (1, s[1])) < 0.01, 64.0, 1.0),
        "student_t2": lambda k, s: jax.random.t(k, 2.0, s, jnp.float32),
    }
    rows = []
    for (m, n, k) in shapes:
        for kind, gen in kinds.items():
            if kind != "normal" and (m, n, k) != shapes[0]:
                continue
            xa = gen(jax.random.key(1), (m, k)).astype(jnp.bfloat16)
            xb = gen(jax.random.key(2), (n, k)).astype(jnp.bfloat16)
            da, sa = jax.jit(quantize)(xa)
            db, sb = jax.jit(quantize)(xb)
            va, vb = ref.dequantize(da, sa), ref.dequantize(db, sb)
            a8, ea, exa, spa = jax.jit(fp8_rows)(da, sa)
            b8, eb, exb, spb = jax.jit(fp8_rows)(db, sb)
            row = dict(m=m, n=n, k=k, kind=kind, a_rows_exact=float(jnp.mean(exa)), b_rows_exact=float(jnp.mean(exb)),
                       a_span_max=int(jnp.max(spa)), b_span_max=int(jnp.max(spb)),
                       a_span_hist=np.bincount(np.asarray(spa), minlength=1).tolist(),
                       b_span_hist=np.bincount(np.asarray(spb), minlength=1).tolist())
            oracle = jax.jit(lambda x, y: lax.dot_general(x.astype(jnp.float64), y.astype(jnp.float64), NT,
                                                          precision=lax.Precision.HIGHEST))(va, vb)
            norm = jax.jit(lambda x, y: lax.dot_general(jnp.abs(x).astype(jnp.float64), jnp.abs(y).astype(jnp.float64),
                                                        NT, precision=lax.Precision.HIGHEST))(va, vb)
            abf, bbf = va.astype(jnp.bfloat16), vb.astype(jnp.bfloat16)
            emu32 = jax.jit(lambda x, y: lax.dot_general(x, y, NT, preferred_element_type=jnp.float32))(abf, bbf)
            emu16 = jax.jit(lambda x, y: lax.dot_general(x, y, NT, preferred_element_type=jnp.bfloat16))(abf, bbf)
            f32ref = jax.jit(lambda x, y: lax.dot_general(x, y, NT, precision=lax.Precision.HIGHEST,
                                                          preferred_element_type=jnp.float32))(va, vb)
            want16 = oracle.astype(jnp.float32).astype(jnp.bfloat16)
            row["bf16_emulation_f32"] = err_stats(emu32, oracle, norm)
            row["bf16_emulation_bf16_equals_oracle_rounded"] = float(jnp.mean(emu16 == want16))
            row["float32_highest"] = err_stats(f32ref, oracle, norm)
            for pname, prec in (("default", lax.Precision.DEFAULT), ("highest", lax.Precision.HIGHEST)):
                g = jax.jit(functools.partial(fp8_gemm, precision=prec))
                got = g(a8, ea, b8, eb)
                row[f"fp8_{pname}_f32"] = err_stats(got, oracle, norm)
                got16 = got.astype(jnp.bfloat16)
                row[f"fp8_{pname}_bf16_equals_emulation"] = float(jnp.mean(got16 == emu16))
                row[f"fp8_{pname}_bf16_equals_oracle_rounded"] = float(jnp.mean(got16 == want16))
                row[f"fp8_{pname}_kernels"] = kernels(lambda x, y, p=prec: lax.dot_general(
                    x, y, NT, precision=p, preferred_element_type=jnp.float32), a8, b8)
            if kind == "normal":
                t = {}
                t["bf16_gemm_bf16_out"] = timeit(jax.jit(lambda x, y: lax.dot_general(
                    x, y, NT, preferred_element_type=jnp.bfloat16)), xa, xb)
                for pname, prec in (("default", lax.Precision.DEFAULT), ("highest", lax.Precision.HIGHEST)):
                    t[f"fp8_gemm_{pname}_f32_out"] = timeit(jax.jit(lambda x, y, p=prec: lax.dot_general(
                        x, y, NT, precision=p, preferred_element_type=jnp.float32)), a8, b8)
                    t[f"fp8_gemm_{pname}_bf16_out"] = timeit(jax.jit(lambda x, y, p=prec: lax.dot_general(
                        x, y, NT, precision=p, preferred_element_type=jnp.bfloat16)), a8, b8)
                    t[f"fp8_gemm_{pname}_scaled_bf16"] = timeit(jax.jit(functools.partial(
                        fp8_gemm, precision=prec, out=jnp.bfloat16)), a8, ea, b8, eb)

                    def pipeline(da, sa, db, sb, p=prec):
                        a8, ea, _, _ = fp8_rows(da, sa)
                        b8, eb, _, _ = fp8_rows(db, sb)
                        return fp8_gemm(a8, ea, b8, eb, p, jnp.bfloat16)
                    t[f"fp8_pipeline_{pname}_from_packed"] = timeit(jax.jit(pipeline), da, sa, db, sb)
                try:
                    from jax_aiter.gemm_fp4._gemm import gemm_fp4_plain_b
                    sas = ref.shuffle_scales(sa)
                    t["current_gemm_fp4_plain_b"] = timeit(jax.jit(gemm_fp4_plain_b), da, db, sas, sb)
                    cur = jax.jit(gemm_fp4_plain_b)(da, db, sas, sb)
                    row["current_equals_bf16_emulation"] = float(jnp.mean(cur == emu16))
                except Exception as err:  # noqa: BLE001
                    t["current_error"] = repr(err)
                row["time_s"] = t
            rows.append(row)
            result["synthetic"] = rows
            save()
            print(json.dumps({k: v for k, v in row.items() if "hist" not in k}), flush=True)


# --- B: adversarial accumulation: one big product, then many small exact ones (bytes built by hand) ---------
def part_b():
    m = n = 256 if SMALL else 1024
    k = 1024 if SMALL else 8192
    cases = {}
    # A row: element 0 of block `big` is code 7 (6.0) at scale 2^0, the rest of that block 0; every element of the
    # other blocks is code 1 (0.5) at scale 2^e_small. Row exponent E = -6, so the small ones are 0.5 * 2^(e_small+6)
    # in E4M3: 2^-9 (the smallest subnormal) for e_small = -14, inexact for -15. B: all ones (code 2, scale 2^0).
    for name, e_small, big in (("big_first_span14", -14, 0), ("big_last_span14", -14, k // 32 - 1),
                               ("big_first_span8", -8, 0), ("span15_inexact", -15, 0)):
        data = np.full((m, k // 2), 0x11, np.uint8)
        data[:, big * 16:(big + 1) * 16] = 0
        data[:, big * 16] = 0x07
        scales = np.full((m, k // 32), 127 + e_small, np.uint8)
        scales[:, big] = 127
        db = np.full((n, k // 2), 0x22, np.uint8)
        sb = np.full((n, k // 32), 127, np.uint8)
        da, sa, db, sb = map(jnp.asarray, (data, scales, db, sb))
        a8, ea, exa, spa = fp8_rows(da, sa)
        b8, eb, _, _ = fp8_rows(db, sb)
        va = np.asarray(ref.dequantize(da, sa), np.float64)
        want = float(va[0].sum())
        case = dict(a_rows_exact=float(jnp.mean(exa)), a_span=int(spa[0]), want=want)
        for pname, prec in (("default", lax.Precision.DEFAULT), ("highest", lax.Precision.HIGHEST)):
            got = jax.jit(functools.partial(fp8_gemm, precision=prec))(a8, ea, b8, eb)
            case[f"fp8_{pname}"] = float(got[0, 0])
            case[f"fp8_{pname}_all_equal_want"] = bool(jnp.all(got == np.float32(want)))
        emu = lax.dot_general(jnp.asarray(va, jnp.bfloat16), ref.dequantize(db, sb).astype(jnp.bfloat16), NT,
                              preferred_element_type=jnp.float32)
        case["bf16_emulation"] = float(emu[0, 0])
        case["bf16_emulation_all_equal_want"] = bool(jnp.all(emu == np.float32(want)))
        cases[name] = case
    result["accumulation"] = cases
    save()
    print(json.dumps(cases), flush=True)


# --- C: spans of real operands --------------------------------------------------------------------------------
def part_c():
    jax.config.update("jax_enable_x64", False)
    from jax_aiter.examples import convergence, text_data, tiny_llama
    import jax_aiter.precision as precision_mod

    model = "cpu-tiny" if SMALL else "75m"
    setup = convergence.Setup.for_model(model, steps=300 if not SMALL else 3)
    corpus = text_data.open_corpus(sys.argv[3] if SMALL else "/tmp/corpus.txt")
    cfg = dataclasses_replace_vocab(setup, corpus)
    setup = cfg
    cfg = setup.config
    params = tiny_llama.init_params(cfg, jax.random.key(0))
    opt = tiny_llama.adam_init(params)
    rng = np.random.default_rng(0)
    train = np.asarray(text_data.split(corpus, held_out_fraction=setup.held_out_fraction)[0].tokens)

    def batch(i):
        starts = rng.integers(0, len(train) - cfg.seq_len - 1, cfg.batch)
        return jnp.asarray(np.stack([train[s:s + cfg.seq_len + 1].astype(np.int32) for s in starts]), jnp.int32)

    records = collections.defaultdict(lambda: collections.Counter())
    spans_max = collections.defaultdict(int)

    def record(name, span, exact):
        span, exact = np.asarray(span), np.asarray(exact)
        records[name]["rows"] += int(span.size)
        records[name]["inexact_rows"] += int((~exact).sum())
        records[name]["gemms"] += 1
        records[name]["gemms_all_exact"] += int(exact.all())
        for s in range(0, 41):
            if s in (6, 8, 10, 12, 14, 16, 20):
                records[name][f"span>{s}"] += int((span > s).sum())
        spans_max[name] = max(spans_max[name], int(span.max()))

    def stats(name, t2d, hadamard=0):
        d, s = ref.quantize_rows(t2d, scale_rule="even", sr_key=None, transposed=False, hadamard=hadamard,
                                 hadamard_key=None)
        _, _, exact, span = fp8_rows(d, s)
        jax.debug.callback(functools.partial(record, name), span, exact)

    counter = iter(range(10 ** 9))
    names = ["wq", "wk", "wv", "wo", "w_gate_up", "w_down"]

    def tapped_project(x, w, recipe, *, key=None):
        i = next(counter)
        pname = "head" if i % (6 * cfg.layers + 1) == 6 * cfg.layers else names[(i % (6 * cfg.layers + 1)) % 6]

        @jax.custom_vjp
        def lin(x2, w):
            return lax.dot_general(x2, w, NT, preferred_element_type=jnp.bfloat16)

        def fwd(x2, w):
            stats(f"{pname}/fprop_x", x2)
            stats(f"{pname}/fprop_w", w)
            stats(f"{pname}/dgrad_wT", w.T)
            stats(f"{pname}/wgrad_xT", x2.T)
            stats(f"{pname}/wgrad_xT_h16", x2.T, 16)
            return lin(x2, w), (x2, w)

        def bwd(res, g):
            x2, w = res
            stats(f"{pname}/dgrad_g", g)
            stats(f"{pname}/wgrad_gT", g.T)
            stats(f"{pname}/wgrad_gT_h16", g.T, 16)
            return (lax.dot_general(g, w, (((1,), (0,)), ((), ())), preferred_element_type=jnp.bfloat16),
                    lax.dot_general(g, x2, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32).astype(w.dtype))

        lin.defvjp(fwd, bwd)
        shape = x.shape
        return lin(x.reshape(-1, shape[-1]), w).reshape(*shape[:-1], w.shape[0])

    tok0 = batch(0)
    plain_step = jax.jit(convergence.make_step(setup, precision_mod.PrecisionPolicy.bf16(), jax.random.key(2)))
    plain_step = plain_step.lower(params, opt, tok0).compile()
    orig = tiny_llama.project
    tiny_llama.project = tapped_project
    tapped_step = jax.jit(convergence.make_step(setup, precision_mod.PrecisionPolicy.bf16(), jax.random.key(2)))
    tapped_step = tapped_step.lower(params, opt, tok0).compile()
    tiny_llama.project = orig
    out = {}
    steps = setup.config.steps
    losses = []
    for t in range(steps + 1):
        tok = tok0 if t == 0 else batch(t)
        if t in (0, steps):
            records.clear()
            spans_max.clear()
            jax.block_until_ready(tapped_step(params, opt, tok))
            jax.effects_barrier()
            out[f"step{t}"] = {name: dict(c, span_max=spans_max[name]) for name, c in sorted(records.items())}
        if t < steps:
            params, opt, loss = plain_step(params, opt, tok)
            if t % 50 == 0:
                losses.append((t, float(loss)))
    out["losses"] = losses
    result["real_operands"] = dict(model=model, corpus=str(corpus.name), steps=steps, spans=out)
    save()
    print(json.dumps(losses), flush=True)


def dataclasses_replace_vocab(setup, corpus):
    import dataclasses
    vocab = -(-corpus.vocab_size // 64) * 64
    return dataclasses.replace(setup, config=dataclasses.replace(setup.config, vocab=vocab))


for part in (part_a, part_b, part_c):
    t0 = time.perf_counter()
    try:
        part()
    except Exception as err:  # noqa: BLE001
        import traceback
        traceback.print_exc()
        result[f"{part.__name__}_error"] = repr(err)
    result[f"{part.__name__}_s"] = time.perf_counter() - t0
    save()
