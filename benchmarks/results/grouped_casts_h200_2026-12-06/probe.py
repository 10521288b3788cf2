"""Would one cast per weight width pay for the 75 M step's 72 small weight casts? (issue 20, the every-block step)

The weights' dual casts run one launch per weight, 9 to 256 blocks each on 132 SMs: latency-bound. Weights that
share K can be cast as one matrix: their rows stacked, one dual cast, the copies cut back per weight. Rowwise
blocks run along K within a row and columnwise blocks along N never straddle two weights (every N is a multiple of
64), so with a scale rule that looks at nothing but the block (rounding to nearest, no rotation, no hashed
indices) each weight's copies are the bytes of its own cast. Both copies stay plain: the shuffled scales of the
AITER layout are padded per 256 rows and cannot be cut at a weight's rows.

Part 1, the casts alone. Times, one process, interleaved and settled: the separate casts as the step makes them
(rowwise copy shuffled for AITER's B operand, columnwise plain), the same with both plain, the grouped form (stack,
two casts, cuts), and the copy ceiling (every weight read and written once). Checks the grouped copies equal the
separate plain ones bit for bit, and profiles the separate and grouped forms per kernel.

Part 2, the training step: the 75 M model's BF16 step, its every-block MXFP4 step, and the same with the policy's
``quantize_weights_once`` (the library's form of the grouping: ``jax_aiter.gemm_fp4.quantize_weights`` at the start
of the forward pass), timed interleaved and settled, whether the two MXFP4 steps give the same bits, and the
per-kernel profile of the last.

    PYTHONPATH=. python benchmarks/results/grouped_casts_h200_2026-12-06/probe.py OUT_DIR
"""

import dataclasses
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.train_step_profile import kernel_times, step_inputs
from jax_aiter.benchmark import STEADY_STATE_S, compile_fn, timed_together
from jax_aiter.examples import convergence
from jax_aiter.gemm_fp4 import cast_mxfp4_dual


def model_weights() -> list[jax.Array]:
    """The every-block step's quantized weights in bf16, as its linears receive them: 6 per layer."""
    _, (params, _, _) = step_inputs()
    names = ("wq", "wk", "wv", "wo", "w_gate_up", "w_down")
    return [params["layers"][i][name].astype(jnp.bfloat16) for i in range(len(params["layers"])) for name in names]


def separate(weights, rowwise_layout):
    return [cast_mxfp4_dual(w, layout_rowwise=rowwise_layout) for w in weights]


def grouped(weights):
    """Each weight's ((row data, row scales), (column data, column scales)) from one dual cast per K."""
    copies = [None] * len(weights)
    for k in sorted({w.shape[1] for w in weights}):
        members = [i for i, w in enumerate(weights) if w.shape[1] == k]
        (row_data, row_scales), (col_data, col_scales) = cast_mxfp4_dual(
            jnp.concatenate([weights[i] for i in members]))
        start = 0
        for i in members:
            n = weights[i].shape[0]
            copies[i] = ((row_data[start:start + n], row_scales[start:start + n]),
                         (col_data[:, start // 2:(start + n) // 2], col_scales[:, start // 32:(start + n) // 32]))
            start += n
    return copies


def copy_ceiling(weights):
    return [w + jnp.ones((), w.dtype) for w in weights]


def main(out):
    os.makedirs(out, exist_ok=True)
    weights = model_weights()
    shapes = sorted({w.shape for w in weights})
    print(f"{len(weights)} weights, shapes {shapes}, {sum(w.size for w in weights) / 1e6:.1f} M elements")
    forms = {"separate (gemm_b, plain)": lambda ws: separate(ws, "gemm_b"),
             "separate (plain, plain)": lambda ws: separate(ws, "plain"),
             "grouped by K (plain, plain)": grouped,
             "copy ceiling": copy_ceiling}
    compiled = {name: compile_fn(fn, weights) for name, fn in forms.items()}
    want = compiled["separate (plain, plain)"](weights)
    got = compiled["grouped by K (plain, plain)"](weights)
    equal = all(np.array_equal(np.asarray(a), np.asarray(b))
                for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True))
    print(f"grouped copies equal the separate ones bit for bit: {equal}")
    times = timed_together({name: (lambda ws, c=c: c(ws)) for name, c in compiled.items()}, weights, 9, 20,
                           settle_s=STEADY_STATE_S)
    result = dict(device=jax.devices()[0].device_kind, jax=jax.__version__, weights=len(weights),
                  shapes=[list(s) for s in shapes], grouped_equal=equal,
                  times_us={name: t * 1e6 for name, t in times.items()}, profiles={})
    for name, t in times.items():
        print(f"{name:>30}: {t * 1e6:8.1f} us")
    for name in ("separate (gemm_b, plain)", "grouped by K (plain, plain)"):
        profile = kernel_times(compiled[name], (weights,))
        result["profiles"][name] = profile
        print(f"{name}: kernels {profile['kernel_ms'] * 1e3:.1f} us, span {profile['span_ms'] * 1e3:.1f} us")
        for kernel in profile["kernels"][:8]:
            print(f"  {kernel['us']:9.1f} us {kernel['calls']:6.1f}x  {kernel['name'][:120]}")
    result["step"] = training_step()
    with open(f"{out}/grouped_casts.json", "w") as f:
        json.dump(result, f, indent=1)


def training_step() -> dict:
    setup, args = step_inputs()
    every_block = convergence.ARMS["mxfp4-every-block"].policy
    policies = {"bf16": convergence.ARMS["bf16"].policy, "mxfp4-every-block": every_block,
                "mxfp4-every-block, weights once": dataclasses.replace(every_block, quantize_weights_once=True)}
    steps = {name: compile_fn(convergence.make_step(setup, policy, jax.random.key(2)), *args)
             for name, policy in policies.items()}
    outputs = {name: steps[name](*args) for name in policies if name != "bf16"}
    same = all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(*map(jax.tree.leaves, outputs.values())))
    print(f"the two MXFP4 steps give the same bits: {same}")
    times = timed_together({name: (lambda a, s=s: s(*a)) for name, s in steps.items()}, args, 7, 5,
                           settle_s=STEADY_STATE_S)
    row = dict(same_bits=same, step_ms={name: t * 1e3 for name, t in times.items()},
               over_bf16={name: t / times["bf16"] for name, t in times.items()})
    for name, t in times.items():
        print(f"{name:>32}: {t * 1e3:7.2f} ms  {t / times['bf16']:.3f}x bf16")
    profile = kernel_times(steps["mxfp4-every-block, weights once"], args)
    row["profile_weights_once"] = profile
    print(f"weights once: kernels {profile['kernel_ms']:.2f} ms, span {profile['span_ms']:.2f} ms; ours by grid:")
    for kernel in profile["ours_by_grid"][:24]:
        print(f"  {kernel['us']:9.1f} us {kernel['calls']:6.1f}x  grid {kernel['grid']:>12}  {kernel['name'][:100]}")
    return row


if __name__ == "__main__":
    main(sys.argv[1])
