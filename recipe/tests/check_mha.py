"""Checks an installed jax-aiter-mha: `python check_mha.py PREFIX`.

Run by the recipe's tests and by tests/test_packaging.py. jax_aiter.mha must be imported from PREFIX (its
site-packages comes first on the path, whichever Python runs this) and flash_attn_func (causal, grouped-query) must
match softmax attention computed here in NumPy. Prints what it found as one JSON line.
"""

import hashlib
import json
import sys
from pathlib import Path

prefix = Path(sys.argv[1]).resolve()
sys.path[:0] = [str(site) for site in sorted(prefix.glob("lib/python*/site-packages"))]

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jax_aiter.mha  # noqa: E402
from jax_aiter.mha import flash_attn_func  # noqa: E402

module_dir = Path(jax_aiter.mha.__file__).resolve().parent
assert module_dir.is_relative_to(prefix), f"jax_aiter.mha imported from {module_dir}, not from {prefix}"

# The attention libraries of the rocm build equal their build records.
for library in sorted((module_dir.parent / "lib").glob("libjax_aiter_*mha*.so")):
    record = json.loads(library.with_name(library.name + ".record").read_text())
    data = library.read_bytes()
    assert record == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}, \
        f"{library} differs from its build record {record}"

batch, seq, q_heads, kv_heads, dim = 2, 16, 4, 2, 32
keys = jax.random.split(jax.random.key(0), 3)
q = jax.random.normal(keys[0], (batch, seq, q_heads, dim), jnp.float32)
k = jax.random.normal(keys[1], (batch, seq, kv_heads, dim), jnp.float32)
v = jax.random.normal(keys[2], (batch, seq, kv_heads, dim), jnp.float32)
out = np.asarray(flash_attn_func(q, k, v, causal=True))

qn, kn, vn = (np.asarray(t, np.float64) for t in (q, k, v))
kn, vn = (np.repeat(t, q_heads // kv_heads, axis=2) for t in (kn, vn))
logits = np.einsum("bqhd,bkhd->bhqk", qn, kn) / np.sqrt(dim)
logits = np.where(np.tril(np.ones((seq, seq), bool)), logits, -np.inf)
weights = np.exp(logits - logits.max(-1, keepdims=True))
weights /= weights.sum(-1, keepdims=True)
expected = np.einsum("bhqk,bkhd->bqhd", weights, vn)
np.testing.assert_allclose(out, expected, rtol=2e-5, atol=2e-5)

print(json.dumps({"jax_aiter.mha": str(module_dir), "max_abs_error": float(np.abs(out - expected).max())}))
