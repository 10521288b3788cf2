"""The per-token sequence index of packed sequences (jax_aiter.ref.mha.segments) by each jnp.searchsorted method,
timed on the CPU: median of 7 batches of 20 calls, one process.

    JAX_PLATFORMS=cpu python index_cpu.py
"""
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

for sequences, tokens in [(4, 16384), (1024, 65536)]:
    offsets = np.sort(np.random.default_rng(0).integers(0, tokens, sequences + 1)).astype(np.int32)
    offsets[0] = 0
    cu = jnp.asarray(offsets)
    positions = jnp.arange(tokens, dtype=jnp.int32)
    results = {}
    for method in ("scan", "scan_unrolled", "sort", "compare_all"):
        fn = jax.jit(lambda c, method=method: jnp.searchsorted(c[1:], positions, side="right", method=method))
        results[method] = np.asarray(fn(cu))
        samples = []
        for _ in range(7):
            start = time.perf_counter()
            for _ in range(20):
                out = fn(cu)
            out.block_until_ready()
            samples.append((time.perf_counter() - start) / 20)
        print(f"B {sequences:5d}  T {tokens:6d}  {method:14s} {statistics.median(samples) * 1e6:10.1f} us"
              f"  equal to scan: {np.array_equal(results[method], results['scan'])}")
