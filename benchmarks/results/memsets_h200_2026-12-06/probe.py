"""Which operations the memsets of the 75 M training step belong to: the BF16 and every-block MXFP4 steps under the
JAX profiler for a few steps each; every memset on a GPU stream with its recorded details and the kernels just
before and after it on that stream, grouped; the optimized HLO of both steps written beside (xz).

    python probe.py OUT_DIR
"""
import collections
import glob
import lzma
import sys
import tempfile

import jax
import jax.numpy as jnp

from jax_aiter.examples import convergence, tiny_llama

STEPS = 3

out = sys.argv[1]
setup = convergence.Setup.for_model("75m")
cfg = setup.config
params = tiny_llama.init_params(cfg, jax.random.key(0))
tokens = jax.random.randint(jax.random.key(1), (cfg.batch, cfg.seq_len + 1), 0, cfg.vocab, jnp.int32)
args = (params, tiny_llama.adam_init(params), tokens)
for arm in ["bf16", "mxfp4-every-block"]:
    step = jax.jit(convergence.make_step(setup, convergence.ARMS[arm].policy, jax.random.key(2))).lower(*args).compile()
    with lzma.open(f"{out}/{arm}.hlo.txt.xz", "wt") as f:
        f.write(step.as_text())
    for _ in range(3):
        jax.block_until_ready(step(*args))
    with tempfile.TemporaryDirectory() as trace_dir:
        jax.profiler.start_trace(trace_dir)
        for _ in range(STEPS):
            result = step(*args)
        jax.block_until_ready(result)
        jax.profiler.stop_trace()
        profile = jax.profiler.ProfileData.from_file(glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True)[0])
    groups = collections.defaultdict(lambda: [0, 0])
    shown = 0
    for plane in profile.planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        for line in plane.lines:
            if "Stream" not in line.name:
                continue
            events = sorted(line.events, key=lambda e: e.start_ns)
            for i, event in enumerate(events):
                if "memset" not in event.name.lower():
                    continue
                stats = {name: str(value) for name, value in event.stats}
                if shown < 3:
                    print(arm, "memset stats:", stats)
                    shown += 1
                detail = stats.get("memset_details", stats.get("details", ""))
                before = events[i - 1].name[:70] if i else "-"
                after = events[i + 1].name[:70] if i + 1 < len(events) else "-"
                key = (detail[:80], before, after)
                groups[key][0] += 1
                groups[key][1] += event.duration_ns
    print(f"{arm}: memsets per step, grouped by (details, kernel before, kernel after)")
    for (detail, before, after), (n, ns) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
        print(f"  {n / STEPS:5.1f}x {ns / STEPS / 1e3:8.1f} us  [{detail}]  after {before}  before {after}")
