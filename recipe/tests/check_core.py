"""Checks an installed jax-aiter-core without jax-aiter-mha: `python check_core.py PREFIX`.

Run by the recipe's tests and by tests/test_packaging.py. jax_aiter must be imported from PREFIX, its native CPU
library must load from there and serve rms_norm (selected and present in the lowered program), the result must
match the pure-JAX reference, and importing jax_aiter.mha must fail with a message naming jax-aiter-mha.
Prints what it found as one JSON line.
"""

import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import jax_aiter
from jax_aiter import _backend, _native, rmsnorm
from jax_aiter.ref import rmsnorm as norm

prefix = Path(sys.argv[1]).resolve()
package_dir = Path(jax_aiter.__file__).resolve().parent
assert package_dir.is_relative_to(prefix), f"jax_aiter imported from {package_dir}, not from {prefix}"

x = jax.random.normal(jax.random.key(0), (8, 128), jnp.float32)
gamma = jax.random.uniform(jax.random.key(1), (128,), jnp.float32, 0.5, 1.5)
epsilon = 1e-6

chosen = _backend.select("rms_norm", "cpu", (x, gamma), {"epsilon": epsilon}).name
assert chosen == "native", f"rms_norm on cpu selected {chosen!r}: {_native.load('cpu').problem}"
library = _native.load("cpu")
assert library.path is not None and library.path.resolve().parent == package_dir / "lib", library
lowered = jax.jit(rmsnorm.rms_norm).lower(x, gamma).as_text()
assert "ja_rms_norm_fwd" in lowered, "the lowered rms_norm does not call the native FFI target"

y = rmsnorm.rms_norm(x, gamma, epsilon)
np.testing.assert_allclose(np.asarray(y), np.asarray(norm.rms_norm(x, gamma, epsilon=epsilon)), rtol=1e-5, atol=1e-5)

try:
    import jax_aiter.mha  # noqa: F401
except ModuleNotFoundError as err:
    assert err.name == "jax_aiter.mha" and "jax-aiter-mha" in str(err), repr(err)
    mha_error = str(err)
else:
    raise AssertionError("jax_aiter.mha imported although jax-aiter-mha is not installed")

print(json.dumps({"jax_aiter": str(package_dir), "cpu_library": str(library.path), "rms_norm": chosen,
                  "mha_error": mha_error}))
