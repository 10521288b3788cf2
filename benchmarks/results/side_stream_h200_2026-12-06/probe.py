"""Can the weights' casts of the every-block MXFP4 step hide behind the rest of the step on a second GPU stream?

The 72 plain dual casts of the weights take 0.73 ms of the 75 M step on the H200 (docs/performance.md, "Training
step"), each on 9 to 192 thread blocks: latency-bound, and they depend on nothing but the parameters. Here they
are wrapped in ``jax.experimental.compute_on("gpu_stream:1")`` (XLA's experimental stream annotation; the cast
itself, its numbers and its kernel are unchanged) and the step is compiled with and without the annotation flag
and XLA's latency-hiding scheduler, in one process:

  default        the step as jax_aiter emits it
  lhs            the same with the latency-hiding scheduler
  stream         weight casts annotated, xla_gpu_experimental_stream_annotation
  stream+lhs     both

For each: the step time (interleaved batches, each after half a second of its own steps), how many async starts
the optimized HLO holds, whether its outputs equal the default step's bit for bit; then the per-kernel profile of
the default and the fastest other variant (summed kernel time against the span: overlap shows as span < sum).
The BF16 step is timed beside them for the ratio.

    PYTHONPATH=. python3 benchmarks/results/side_stream_h200_2026-12-06/probe.py OUT_DIR   (from the repository root)
"""

import json
import sys
import traceback

import jax
import numpy as np
from jax._src.core import MemorySpace
from jax.experimental.compute_on import compute_on

from benchmarks.train_step_profile import kernel_times, step_inputs
from jax_aiter.benchmark import STEADY_STATE_S, timed_together
from jax_aiter.examples import convergence
from jax_aiter.gemm_fp4 import _linear

LHS = {"xla_gpu_enable_latency_hiding_scheduler": True}
STREAM = {"xla_gpu_experimental_stream_annotation": True}
VARIANTS = {"default": (False, None), "lhs": (False, LHS), "stream": (True, STREAM), "stream+lhs": (True, STREAM | LHS)}
_plain_cast = _linear._cast


def _cast_weights_on_side_stream(t, role, recipe, key_words, *, rowwise, columnwise, index_offset):
    if role != "weight":
        return _plain_cast(t, role, recipe, key_words, rowwise=rowwise, columnwise=columnwise,
                           index_offset=index_offset)

    def cast(t, key_words):
        return _plain_cast(t, role, recipe, key_words, rowwise=rowwise, columnwise=columnwise,
                           index_offset=index_offset)

    return compute_on(cast, compute_type="gpu_stream:1", out_memory_spaces=MemorySpace.Device)(t, key_words)


def lower(setup, arm, args, annotate):
    jax.clear_caches()  # the linear's inner jit keeps its traces: without this, no call would be annotated
    _linear._cast = _cast_weights_on_side_stream if annotate else _plain_cast
    try:
        return jax.jit(convergence.make_step(setup, convergence.ARMS[arm].policy, jax.random.key(2))).lower(*args)
    finally:
        _linear._cast = _plain_cast


def main(out):
    setup, args = step_inputs()
    result = {"device": jax.devices()[0].device_kind, "jax": jax.__version__, "variants": {}}
    compiled = {"bf16": lower(setup, "bf16", args, False).compile()}
    lowered = {annotate: lower(setup, "mxfp4-every-block", args, annotate) for annotate in (False, True)}
    text = lowered[True].as_text()
    result["annotated_calls_in_stablehlo"] = text.count("_xla_stream_annotation")
    print("annotated calls in the StableHLO:", result["annotated_calls_in_stablehlo"], flush=True)
    reference = None
    for name, (annotate, options) in VARIANTS.items():
        row = result["variants"].setdefault(name, {"options": options})
        try:
            step = lowered[annotate].compile(compiler_options=options)
            hlo = step.as_text()
            outputs = [np.asarray(a) for a in jax.tree.leaves(step(*args))]
        except Exception as error:  # an experimental XLA feature: record how it fails, time the others
            row["error"] = "".join(traceback.format_exception_only(error))[-2000:]
            print(name, "failed:", row["error"], flush=True)
            continue
        reference = outputs if reference is None else reference
        row.update(async_starts=hlo.count("-start("), stream_attributes=hlo.count("_xla_stream_annotation"),
                   equals_default=all(np.array_equal(a, b) for a, b in zip(outputs, reference)))
        compiled[name] = step
        print(name, {k: v for k, v in row.items() if k != "options"}, flush=True)
    times = timed_together({name: (lambda a, s=s: s(*a)) for name, s in compiled.items()}, args, 7, 5,
                           settle_s=STEADY_STATE_S)
    for name, seconds in times.items():
        ratio = seconds / times["bf16"]
        print(f"{name}: {seconds * 1e3:.2f} ms, {ratio:.3f}x BF16", flush=True)
        if name != "bf16":
            result["variants"][name].update(step_ms=seconds * 1e3, vs_bf16=ratio)
    result["bf16_step_ms"] = times["bf16"] * 1e3
    others = [name for name in compiled if name not in ("bf16", "default")]
    profiled = ["default"] + ([min(others, key=times.get)] if others else [])
    for name in profiled:
        profile = kernel_times(compiled[name], args)
        result["variants"][name]["profile"] = profile
        print(f"{name} profiled: kernels {profile['kernel_ms']:.2f} ms, span {profile['span_ms']:.2f} ms", flush=True)
        for kernel in profile["ours_by_grid"][:12]:
            print(f"  {kernel['us']:9.1f} us {kernel['calls']:6.1f}x  grid {kernel['grid']:>12}  "
                  f"{kernel['name'][:100]}", flush=True)
    with open(f"{out}/probe.json", "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
