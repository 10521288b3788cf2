"""The ``native`` implementations: this project's own kernels (csrc/cpu as C++, csrc/gpu as one CUDA/HIP source)
behind ``jax.ffi.ffi_call``. One module per op family, each a leaf that exports its implementations and their
``supports`` checks; the op modules (``jax_aiter.rmsnorm``, ...) declare them.

The FFI target names are the same on every platform (three builds of one source), so one ``ffi_call`` serves
them all; :data:`LIBRARY` names the library each platform loads them from (``jax_aiter._native``).
"""

LIBRARY: dict[str, str] = {"cpu": "cpu", "cuda": "cuda", "rocm": "hip"}
