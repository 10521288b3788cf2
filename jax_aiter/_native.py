"""Loads this package's native FFI libraries and registers their XLA targets.

Where libraries come from: ``jax_aiter/lib`` of the installed package, or the one directory named by
``JAX_AITER_LIB_DIR`` (for development builds). The directory is resolved once, to an absolute path, when this
module is imported; ``jax-aiter info`` shows it and where it came from. Libraries are opened by absolute path.

Before a library is opened it is checked: against its build record (``<library>.record``: size and sha256,
written when the library was installed) when there is one, and in every case that the ELF file holds every
segment and header table it declares, so a truncated or altered file disables its backend with one warning
instead of crashing the process. Only libraries for platforms this process has devices for are opened; the
others are judged by those checks alone (a CPU machine can still lower and export programs for GPUs).

Each library exports ``ja_ffi_targets``, a table of (target name, handler) pairs, so the library itself says what
it provides: an implementation whose targets a loaded library lacks (a stale build) is not selected. A library
that is absent or fails to load makes its backend unavailable; it never makes ``import jax_aiter`` fail.
Loading is lazy: the first op that could use a library loads it.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import json
import os
import struct
import threading
from pathlib import Path

import jax

LIB_DIR_ENV = "JAX_AITER_LIB_DIR"
PLATFORMS: tuple[str, ...] = ("cpu", "cuda", "rocm")


@dataclasses.dataclass(frozen=True)
class LibrarySpec:
    file: str
    platform: str  # the platform (as in PLATFORMS) whose devices it serves
    xla_platform: str  # the platform name jax.ffi.register_ffi_target expects
    built_by: str  # what to do to get it, for messages


LIBRARIES: dict[str, LibrarySpec] = {
    "cpu": LibrarySpec("libjax_aiter_cpu.so", "cpu", "cpu", "built by every `pip install .`"),
    "cuda": LibrarySpec("libjax_aiter_cuda.so", "cuda", "CUDA", "built when CMake finds nvcc (JA_ENABLE_CUDA)"),
    "hip": LibrarySpec("libjax_aiter_hip.so", "rocm", "ROCM", "built with -DJA_ENABLE_HIP=ON"),
    "aiter": LibrarySpec("libjax_aiter_aiter.so", "rocm", "ROCM", "built with the AITER submodule on a ROCm machine"),
    "aiter_mha": LibrarySpec("libjax_aiter_aiter_mha.so", "rocm", "ROCM",
                             "shipped by jax-aiter-mha, built with the AITER submodule on a ROCm machine"),
}


def _resolve_library_dir() -> tuple[Path, str]:
    override = os.environ.get(LIB_DIR_ENV)
    if override:
        return Path(override).expanduser().resolve(), f"{LIB_DIR_ENV}={override}"
    return Path(__file__).resolve().parent / "lib", "the installed package"


_LIBRARY_DIR, _LIBRARY_DIR_SOURCE = _resolve_library_dir()


def library_dir() -> Path:
    """The absolute directory libraries are loaded from (resolved once, at import)."""
    return _LIBRARY_DIR


@functools.cache
def present_platforms() -> frozenset[str]:
    """Platforms with devices in this process (``cuda`` and ``rocm`` told apart, unlike ``device.platform``)."""
    found = set()
    for platform in PLATFORMS:
        try:
            if jax.devices(platform):
                found.add(platform)
        except RuntimeError:
            pass
    return frozenset(found)


class _TargetEntry(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("handler", ctypes.c_void_p)]


@dataclasses.dataclass(frozen=True)
class LoadedLibrary:
    """What is known about one library: ``problem`` is None when it can serve its platform. ``targets`` is None
    when the library was checked but not opened (no device of its platform in this process)."""

    name: str
    path: Path | None
    targets: tuple[str, ...] | None = ()
    problem: str | None = None
    handle: ctypes.CDLL | None = dataclasses.field(default=None, repr=False, compare=False)

    def missing_targets(self, wanted: tuple[str, ...]) -> tuple[str, ...]:
        if self.targets is None:
            return ()
        return tuple(t for t in wanted if t not in self.targets)


_lock = threading.Lock()
_loaded: dict[str, LoadedLibrary] = {}


def load(name: str) -> LoadedLibrary:
    """Check library ``name`` once, open it and register its targets when its platform is present; the result
    says why it is unusable, if it is."""
    with _lock:
        if name not in _loaded:
            _loaded[name] = _check_and_load(name)
        return _loaded[name]


def _check_and_load(name: str) -> LoadedLibrary:
    spec = LIBRARIES[name]
    path = library_dir() / spec.file
    if not path.is_file():
        return LoadedLibrary(name, None, problem=f"{spec.file} not found in {path.parent} ({spec.built_by})")
    problem = check_file(path)
    if problem is not None:
        return LoadedLibrary(name, path, problem=problem)
    if spec.platform not in present_platforms():
        return LoadedLibrary(name, path, targets=None)
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


def check_file(path: Path) -> str | None:
    """Why ``path`` must not be opened, or None: it differs from its build record, or it is not a whole ELF
    shared object (a truncated file would crash the process when the loader maps it)."""
    data = path.read_bytes()
    record_path = path.with_name(path.name + ".record")
    if record_path.exists():
        try:
            record = json.loads(record_path.read_text())
            size, digest = int(record["size"]), str(record["sha256"])
        except (ValueError, KeyError, TypeError) as err:
            return f"{record_path.name} is unreadable ({err}); reinstall jax-aiter"
        if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
            return (f"{path} differs from its build record ({len(data)} bytes, expected {size}; sha256 "
                    f"mismatch): a damaged or partial install; reinstall jax-aiter")
    return _elf_problem(path, data)


def _elf_problem(path: Path, data: bytes) -> str | None:
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return f"{path} is not a 64-bit little-endian ELF file"
    phoff, shoff = struct.unpack_from("<QQ", data, 32)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, 54)
    if phoff + phnum * phentsize > len(data) or shoff + shnum * shentsize > len(data):
        return f"{path} is truncated: its header tables end past the file's {len(data)} bytes"
    for i in range(phnum):
        p_type, _, p_offset, _, _, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if p_offset + p_filesz > len(data):
            return f"{path} is truncated: segment {i} ends past the file's {len(data)} bytes"
    return None


def describe() -> list[str]:
    """Where libraries come from, then one line per library: where it was loaded from and how many targets, or
    why it is unavailable."""
    lines = [f"libraries from {library_dir()} ({_LIBRARY_DIR_SOURCE})"]
    for name, spec in LIBRARIES.items():
        lib = load(name)
        if lib.problem is not None:
            lines.append(f"library {name}: unavailable: {lib.problem}")
        elif lib.targets is None:
            lines.append(f"library {name}: {lib.path} (checked, not loaded: no {spec.platform} device here)")
        else:
            lines.append(f"library {name}: {lib.path} ({len(lib.targets)} FFI targets)")
    return lines
