"""Are our GPU handlers recorded into XLA's command buffers (CUDA graphs), and what does that change in the 75 M
training step? One process: each arm's step compiled four ways on the same inputs,

  default       XLA's default command-buffer kinds (custom calls included: ours are recorded where they qualify)
  no-ffi        every default kind but CUSTOM_CALL: our calls end the graphs around them, as before the handlers
                declared the command-buffer trait
  no-graphs     no command buffers at all (minimum graph size out of reach)
  conditionals  the default kinds and CONDITIONAL: the attention guard's forward conditional runs inside a graph
                instead of waiting for its predicate on the host

For each: how many of our custom calls sit inside a command-buffer computation of the optimized HLO, and how many
outside (an XLA that forms command buffers from the compiled thunks instead shows none); the step time
(interleaved batches, each after half a second of its own steps); whether the default step's outputs equal the
no-graphs step's bit for bit.

    python probe.py OUT_DIR
"""

import json
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np

from jax_aiter.benchmark import STEADY_STATE_S, timed_together
from jax_aiter.examples import convergence, tiny_llama

OURS = re.compile(r'custom_call_target="(ja_\w+)"')
VARIANTS = {
    "default": None,
    "no-ffi": {"xla_gpu_enable_command_buffer": "FUSION,CUBLAS,CUBLASLT,CUDNN,DYNAMIC_SLICE_FUSION"},
    "no-graphs": {"xla_gpu_graph_min_graph_size": 2 ** 30},
    "conditionals": {"xla_gpu_enable_command_buffer":
                     "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,DYNAMIC_SLICE_FUSION,CONDITIONAL"},
}


def our_calls(hlo: str) -> dict:
    """Our custom calls by target, split into those inside command-buffer computations and the rest."""
    counts = {"in_command_buffers": {}, "outside": {}, "command_buffer_computations": 0}
    where = "outside"
    for line in hlo.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith("{"):  # a computation's header
            inside = "command_buffer" in line.split("(")[0]
            where = "in_command_buffers" if inside else "outside"
            counts["command_buffer_computations"] += inside
        match = OURS.search(line)
        if match:
            counts[where][match.group(1)] = counts[where].get(match.group(1), 0) + 1
    return counts


def main(out):
    setup = convergence.Setup.for_model("75m")
    cfg = setup.config
    params = tiny_llama.init_params(cfg, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (cfg.batch, cfg.seq_len + 1), 0, cfg.vocab, jnp.int32)
    args = (params, tiny_llama.adam_init(params), tokens)
    result = {"device": jax.devices()[0].device_kind, "jax": jax.__version__, "variants": VARIANTS, "arms": {}}
    compiled = {}
    for arm in ("bf16", "mxfp4-every-block"):
        lowered = jax.jit(convergence.make_step(setup, convergence.ARMS[arm].policy, jax.random.key(2))).lower(*args)
        for variant, options in VARIANTS.items():
            step = lowered.compile(compiler_options=options)
            compiled[f"{arm}/{variant}"] = step
            result["arms"].setdefault(arm, {})[variant] = {"hlo": our_calls(step.as_text())}
            print(arm, variant, result["arms"][arm][variant]["hlo"], flush=True)
        default, no_graphs = (jax.tree.leaves(compiled[f"{arm}/{v}"](*args)) for v in ("default", "no-graphs"))
        same = [np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(default, no_graphs)]
        result["arms"][arm]["default_equals_no_graphs"] = all(same)
        print(arm, "default step == no-graphs step bit for bit:", all(same), flush=True)
    times = timed_together({name: (lambda a, s=s: s(*a)) for name, s in compiled.items()}, args, 7, 5,
                           settle_s=STEADY_STATE_S)
    for name, seconds in times.items():
        arm, variant = name.split("/")
        result["arms"][arm][variant]["step_ms"] = seconds * 1e3
        print(f"{name}: {seconds * 1e3:.2f} ms", flush=True)
    with open(f"{out}/probe.json", "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
