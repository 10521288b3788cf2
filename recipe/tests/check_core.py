"""Checks an installed jax-aiter-core without jax-aiter-mha: `python check_core.py PREFIX [PACKAGE]`.

Run by the recipe's tests and by tests/test_packaging.py, and by tests/test_pip_install.py on the lite wheel in a
virtual environment (which has the same lib/pythonX.Y/site-packages). jax_aiter must be imported from PREFIX (its
site-packages comes first on the path, whichever Python runs this), every native library there must equal its build
record (size and sha256 written when CMake installed it), the CPU library must load from there and serve rms_norm
when forced (selected and present in the lowered program; on the CPU the default is XLA's code, measured faster),
the result must match the pure-JAX reference, and importing
jax_aiter.mha must fail with a message naming PACKAGE, the package that adds it: the conda package jax-aiter-mha by
default, the full wheel jax-aiter for the lite wheel. Prints what it found as one JSON line.
"""

import hashlib
import json
import sys
from pathlib import Path

prefix = Path(sys.argv[1]).resolve()
package_to_add = sys.argv[2] if len(sys.argv) > 2 else "jax-aiter-mha"
sys.path[:0] = [str(site) for site in sorted(prefix.glob("lib/python*/site-packages"))]

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jax_aiter  # noqa: E402
from jax_aiter import _backend, _native, rmsnorm  # noqa: E402
from jax_aiter.ref import rmsnorm as norm  # noqa: E402

package_dir = Path(jax_aiter.__file__).resolve().parent
assert package_dir.is_relative_to(prefix), f"jax_aiter imported from {package_dir}, not from {prefix}"

records = {}
for library in sorted((package_dir / "lib").glob("*.so")):
    record = json.loads(library.with_name(library.name + ".record").read_text())
    data = library.read_bytes()
    assert record == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}, \
        f"{library} differs from its build record {record}"
    records[library.name] = record["sha256"]
assert "libjax_aiter_cpu.so" in records, records

x = jax.random.normal(jax.random.key(0), (8, 128), jnp.float32)
gamma = jax.random.uniform(jax.random.key(1), (128,), jnp.float32, 0.5, 1.5)
epsilon = 1e-6

with jax_aiter.use_backend(rms_norm="native"):
    chosen = _backend.select("rms_norm", "cpu", (x, gamma), {"epsilon": epsilon}).name
    lowered = jax.jit(rmsnorm.rms_norm).lower(x, gamma).as_text()
    y = rmsnorm.rms_norm(x, gamma, epsilon)
library = _native.load("cpu")
assert library.problem is None, library.problem
assert library.path is not None and library.path.resolve().parent == package_dir / "lib", library
assert "ja_rms_norm_fwd" in lowered, "the lowered rms_norm does not call the native FFI target"
np.testing.assert_allclose(np.asarray(y), np.asarray(norm.rms_norm(x, gamma, epsilon=epsilon)), rtol=1e-5, atol=1e-5)

try:
    import jax_aiter.mha  # noqa: F401
except ModuleNotFoundError as err:
    assert err.name == "jax_aiter.mha" and repr(package_to_add) in str(err), repr(err)
    mha_error = str(err)
else:
    raise AssertionError(f"jax_aiter.mha imported although {package_to_add} is not installed")

print(json.dumps({"jax_aiter": str(package_dir), "cpu_library": str(library.path), "rms_norm": chosen,
                  "mha_error": mha_error, "records": records}))
