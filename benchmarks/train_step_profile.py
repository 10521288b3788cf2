"""Where the GPU time of one training step of the 75 M decoder goes (docs/performance.md, "Training step"): the
convergence benchmark's step (``jax-aiter bench --only train``) under each policy named, timed with the batches of
all policies interleaved (each after half a second of its own steps), then half a second of steps of each under
the JAX profiler, with every kernel's GPU time summed by name per step, and ours (jax_aiter::) also by launch grid,
which tells the tensor shapes of one kernel apart. XLA turns its command buffers (CUDA graphs) off while a profiler
runs, so the profiled steps run op by op; the step times are taken without it. An arm ``name@impl`` compiles the
arm with ``rms_norm`` and ``rms_norm_with_add`` forced to ``impl``.

    python benchmarks/train_step_profile.py OUT_DIR [ARM,ARM,...]   (default: bf16,mxfp4-every-block)

Writes OUT_DIR/train_step_profile.json and prints the largest kernels of each arm.
"""

import contextlib
import glob
import json
import os
import sys
import tempfile
import time
from collections import defaultdict

import jax
import jax.numpy as jnp

import jax_aiter
from jax_aiter.benchmark import STEADY_STATE_S, timed_together
from jax_aiter.examples import convergence, tiny_llama

PROFILED_STEPS = 3
LISTED_KERNELS = 60


def _grid(event) -> str:
    """The launch grid the profiler recorded for a kernel event ("?" where it recorded none)."""
    for _, value in event.stats:
        if isinstance(value, str) and "grid:" in value:
            return value.split("grid:")[1].split()[0]
    return "?"


def kernel_times(step, args) -> dict:
    """Per step: GPU time and count of each kernel name, the summed kernel time and the span from the first
    kernel's start to the last one's end, over the steps run in STEADY_STATE_S seconds (at least PROFILED_STEPS).
    Averaged over that many, they are the times at the clock this program keeps: a GPU at its power limit runs the
    first steps after a pause, or after another program, at another clock (docs/performance.md, "Method")."""
    steps = 0
    with tempfile.TemporaryDirectory() as trace_dir:
        jax.profiler.start_trace(trace_dir)
        settled = time.perf_counter() + STEADY_STATE_S
        while steps < PROFILED_STEPS or time.perf_counter() < settled:
            for _ in range(PROFILED_STEPS):
                result = step(*args)
            jax.block_until_ready(result)
            steps += PROFILED_STEPS
        jax.profiler.stop_trace()
        profile = jax.profiler.ProfileData.from_file(glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True)[0])
    per_name = defaultdict(lambda: [0, 0])
    per_grid = defaultdict(lambda: [0, 0])
    first, last = None, None
    for plane in profile.planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        for line in plane.lines:
            if "Stream" not in line.name:  # the per-stream lines hold the kernels; others are derived views
                continue
            for event in line.events:
                per_name[event.name][0] += 1
                per_name[event.name][1] += event.duration_ns
                if "jax_aiter::" in event.name:
                    grid = per_grid[(event.name, _grid(event))]
                    grid[0] += 1
                    grid[1] += event.duration_ns
                end = event.start_ns + event.duration_ns
                first = event.start_ns if first is None else min(first, event.start_ns)
                last = end if last is None else max(last, end)
    kernels = sorted(per_name.items(), key=lambda item: -item[1][1])
    return dict(steps=steps, kernel_ms=sum(t for _, t in per_name.values()) / steps / 1e6,
                span_ms=(last - first) / steps / 1e6 if kernels else 0.0,
                kernels=[dict(name=name, calls=calls / steps, us=ns / steps / 1e3) for name, (calls, ns) in kernels],
                ours_by_grid=[dict(name=name, grid=grid, calls=calls / steps, us=ns / steps / 1e3)
                              for (name, grid), (calls, ns) in sorted(per_grid.items(), key=lambda item: -item[1][1])])


def step_inputs() -> tuple[convergence.Setup, tuple]:
    """The 75 M decoder's setup and one step's arguments (params, Adam state, a batch of tokens), fixed keys."""
    setup = convergence.Setup.for_model("75m")
    cfg = setup.config
    params = tiny_llama.init_params(cfg, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (cfg.batch, cfg.seq_len + 1), 0, cfg.vocab, jnp.int32)
    return setup, (params, tiny_llama.adam_init(params), tokens)


def main(argv):
    out = argv[0]
    arms = argv[1].split(",") if len(argv) > 1 else ["bf16", "mxfp4-every-block"]
    setup, args = step_inputs()
    steps = {}
    for name in arms:
        arm, _, norm = name.partition("@")
        forced = jax_aiter.use_backend(rms_norm=norm, rms_norm_with_add=norm) if norm else contextlib.nullcontext()
        with forced:
            step = convergence.make_step(setup, convergence.ARMS[arm].policy, jax.random.key(2))
            steps[name] = jax.jit(step).lower(*args).compile()
    times = timed_together({name: (lambda a, s=s: s(*a)) for name, s in steps.items()}, args, 7, 5,
                           settle_s=STEADY_STATE_S)
    result = {"device": jax.devices()[0].device_kind, "jax": jax.__version__, "arms": {}}
    for name, step in steps.items():
        row = dict(step_ms=times[name] * 1e3, **kernel_times(step, args))
        result["arms"][name] = row
        print(f"{name}: step {row['step_ms']:.2f} ms, kernels {row['kernel_ms']:.2f} ms, span {row['span_ms']:.2f} ms")
        for kernel in row["kernels"][:LISTED_KERNELS]:
            print(f"  {kernel['us']:9.1f} us {kernel['calls']:6.1f}x  {kernel['name'][:150]}")
        print(f"{name}: our kernels by launch grid")
        for kernel in row["ours_by_grid"]:
            grid = f"grid {kernel['grid']}"
            print(f"  {kernel['us']:9.1f} us {kernel['calls']:6.1f}x  {grid:>17}  {kernel['name'][:110]}")
    os.makedirs(out, exist_ok=True)
    with open(f"{out}/train_step_profile.json", "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
