"""Which GEMMs XLA compiles gemm_fp8's fwd+bwd (bf16 operands) into at several shapes, and whether y, dx and dW are
within the float64 oracle's bound there: writes each compiled program's HLO and prints its GEMM calls and fusions.

usage: python3 gemm_choice_probe.py OUT_DIR   (run from tests/, which holds the oracle)
"""

import re
import sys

import jax
import jax.numpy as jnp
import numpy as np

from jax_aiter.gemm_fp8 import Fp8Recipe, gemm_fp8
from test_gemm_fp8 import assert_fp8_close, oracle_products, random

SHAPES = [(512, 1024, 768), (2048, 2048, 2048), (4096, 4096, 4096)]  # tokens, K, N


def main(out_dir):
    recipe = Fp8Recipe()
    for tokens, k, n in SHAPES:
        a, b, dy = random(20, (tokens, k), jnp.bfloat16, 2.0), random(21, (n, k), jnp.bfloat16, 0.03), \
            random(22, (tokens, n), jnp.bfloat16)

        def step(a, b, dy):
            y, vjp = jax.vjp(lambda a, b: gemm_fp8(a, b, recipe), a, b)
            return (y, *vjp(dy))

        compiled = jax.jit(step).lower(a, b, dy).compile()
        text = compiled.as_text()
        with open(f"{out_dir}/hlo_{tokens}x{k}x{n}.txt", "w") as f:
            f.write(text)
        calls = [f"{m.group(2)} -> {m.group(1)}" for m in
                 re.finditer(r"= \(?(\w+\[[\d,]*\])[^\n]*custom_call_target=\"([^\"]+)\"", text)]
        kinds = sorted(set(re.findall(r'"kind":"(__triton\w*)"', text)))
        print(tokens, k, n, "calls:", calls, "triton kinds:", kinds, flush=True)
        expected = oracle_products(np.asarray(a), np.asarray(b), np.asarray(dy), recipe)
        for name, got in zip(("y", "dx", "dw"), compiled(a, b, dy), strict=True):
            for factor in (1, 2, 4):
                try:
                    assert_fp8_close(got, *expected[name], jnp.bfloat16, float32_factor=factor)
                    print(f"  {name}: within the bound with float32_factor {factor}", flush=True)
                    break
                except AssertionError as e:
                    print(f"  {name}: factor {factor}: {e}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
