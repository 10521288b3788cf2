"""Loads this package's native FFI libraries and registers their XLA targets.

Libraries are looked up only in ``jax_aiter/lib`` of the installed package, or in the one directory named by
``JAX_AITER_LIB_DIR`` (for development builds). Each library exports ``ja_ffi_targets``, a table of
(target name, handler) pairs, so the library itself says what it provides and nothing here lists targets twice.
A library that is absent or fails to load makes its backend unavailable; it never makes ``import jax_aiter``
fail. Loading is lazy: the first op that could use a library loads it.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import threading
from pathlib import Path

import jax

LIB_DIR_ENV = "JAX_AITER_LIB_DIR"


@dataclasses.dataclass(frozen=True)
class LibrarySpec:
    file: str
    xla_platform: str  # the platform name jax.ffi.register_ffi_target expects
    built_by: str  # what to do to get it, for messages


LIBRARIES: dict[str, LibrarySpec] = {
    "cpu": LibrarySpec("libjax_aiter_cpu.so", "cpu", "built by every `pip install .`"),
    "cuda": LibrarySpec("libjax_aiter_cuda.so", "CUDA", "built when CMake finds nvcc (JA_ENABLE_CUDA)"),
    "hip": LibrarySpec("libjax_aiter_hip.so", "ROCM", "built with -DJA_ENABLE_HIP=ON"),
    "aiter": LibrarySpec("libjax_aiter_aiter.so", "ROCM", "built with the AITER submodule on a ROCm machine"),
    "aiter_mha": LibrarySpec("libjax_aiter_aiter_mha.so", "ROCM",
                             "shipped by jax-aiter-mha, built with the AITER submodule on a ROCm machine"),
}


class _TargetEntry(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("handler", ctypes.c_void_p)]


@dataclasses.dataclass(frozen=True)
class LoadedLibrary:
    name: str
    path: Path | None
    targets: tuple[str, ...] = ()
    problem: str | None = None  # None when loaded and registered
    handle: ctypes.CDLL | None = dataclasses.field(default=None, repr=False, compare=False)


_lock = threading.Lock()
_loaded: dict[str, LoadedLibrary] = {}


def library_dir() -> Path:
    override = os.environ.get(LIB_DIR_ENV)
    return Path(override) if override else Path(__file__).resolve().parent / "lib"


def load(name: str) -> LoadedLibrary:
    """Load library ``name`` once and register its targets; the result says why it is unusable, if it is."""
    with _lock:
        if name not in _loaded:
            _loaded[name] = _load_and_register(name)
        return _loaded[name]


def _load_and_register(name: str) -> LoadedLibrary:
    spec = LIBRARIES[name]
    path = library_dir() / spec.file
    if not path.is_file():
        return LoadedLibrary(name, None, problem=f"{spec.file} not found in {path.parent} ({spec.built_by})")
    try:
        handle = ctypes.CDLL(str(path))
        table_fn = handle.ja_ffi_targets
    except (OSError, AttributeError) as err:
        return LoadedLibrary(name, path, problem=f"{spec.file} failed to load: {err}")
    table_fn.restype = ctypes.POINTER(_TargetEntry)
    table_fn.argtypes = [ctypes.POINTER(ctypes.c_size_t)]
    count = ctypes.c_size_t()
    entries = table_fn(ctypes.byref(count))
    names = []
    try:
        for i in range(count.value):
            target = entries[i].name.decode()
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(entries[i].handler),
                                        platform=spec.xla_platform, api_version=1)
            names.append(target)
    except Exception as err:  # registration fails e.g. when the platform's plugin is absent
        return LoadedLibrary(name, path, tuple(names), problem=f"{spec.file}: registering targets failed: {err}")
    return LoadedLibrary(name, path, tuple(names), None, handle)


def describe() -> list[str]:
    """One line per library: where it was loaded from and how many targets, or why it is unavailable."""
    lines = []
    for name in LIBRARIES:
        lib = load(name)
        if lib.problem is None:
            lines.append(f"library {name}: {lib.path} ({len(lib.targets)} FFI targets)")
        else:
            lines.append(f"library {name}: unavailable: {lib.problem}")
    return lines
