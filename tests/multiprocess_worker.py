"""One process of a JAX multi-controller run on the CPU, started by tests/test_multiprocess.py:

    python multiprocess_worker.py --coordinator 127.0.0.1:PORT --processes 2 --process-id I --out DIR

Each process has 4 CPU devices and joins the others through jax.distributed (gloo collectives across processes),
so the meshes span 4 x processes devices. It runs tests/test_sharding.py's MXFP4 and BF16 training steps (forward
and both gradients) under the FSDP layout on all of them, from inputs every process makes alike and places only on
its own devices. Process 0 writes the gathered results (DIR/results.npz, as float32: bf16 converts exactly) and the
collectives of each compiled step (DIR/collectives.json). The test compares them with one process's run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import jax
import numpy as np

LOCAL_DEVICES = 4


def runs() -> dict:
    """Step name: (step, its inputs, activation spec, weight spec): tests/test_sharding.py's training steps under its
    FSDP layout (tokens and weight rows split over all devices). Imported only once JAX is set up: importing
    jax_aiter may touch devices."""
    from jax.sharding import PartitionSpec as P

    import test_sharding as steps

    return {"mxfp4": (steps.fp4_step, steps.fp4_inputs, P("fsdp", None, None), P("fsdp", None)),
            "bf16": (steps.gemm_step, steps.gemm_inputs, P("fsdp", None, None), P("fsdp", None))}


def fsdp_mesh(devices) -> jax.sharding.Mesh:
    return jax.sharding.Mesh(np.array(devices), ("fsdp",), axis_types=(jax.sharding.AxisType.Auto,))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--coordinator", required=True, help="host:port of process 0's coordination service")
    parser.add_argument("--processes", type=int, required=True)
    parser.add_argument("--process-id", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    # Before anything touches a device: the CPU client is made once, with these settings.
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", LOCAL_DEVICES)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(args.coordinator, num_processes=args.processes, process_id=args.process_id,
                               initialization_timeout=120)
    assert jax.local_device_count() == LOCAL_DEVICES and jax.device_count() == LOCAL_DEVICES * args.processes

    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding

    import test_sharding

    def placed(host, sharding):
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

    results, collectives = {}, {}
    mesh = fsdp_mesh(jax.devices())
    for name, (step, inputs, act_spec, weight_spec) in runs().items():
        act, weight = NamedSharding(mesh, act_spec), NamedSharding(mesh, weight_spec)
        a, b, dy = (np.asarray(t) for t in inputs())
        operands = placed(a, act), placed(b, weight), placed(dy, act)
        compiled = jax.jit(step, in_shardings=(act, weight, act), out_shardings=(act, act, weight)).lower(
            *operands).compile()
        outputs = compiled(*operands)
        for label, output in zip(("y", "da", "db"), outputs):
            assert isinstance(output.sharding, NamedSharding) and not output.is_fully_addressable
            results[f"{name}.{label}"] = np.asarray(multihost_utils.process_allgather(output, tiled=True),
                                                    np.float32)
        collectives[name] = test_sharding.collectives(compiled)

    if jax.process_index() == 0:
        np.savez(args.out / "results.npz", **results)
        (args.out / "collectives.json").write_text(json.dumps(collectives))
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
