"""What the aiter implementations' ``supports`` checks share: the GPU architecture of this machine's ROCm
device (when it has one) and the architectures whose AITER assets are installed.

Lowering for ROCm on a machine without an AMD GPU knows no architecture: the checks then judge the call alone
(dtype, shapes) and the FFI handler checks the device when the program runs.
"""

from __future__ import annotations

import functools
import re

import jax

from jax_aiter import _backend, _native
from jax_aiter.aiter import manifest

SUPPORTED_ARCHS = ("gfx942", "gfx950")
# device_kind strings of the Instinct parts, for ROCm plugins that report no gfx name.
_KIND_TO_ARCH = (("MI300", "gfx942"), ("MI325", "gfx942"), ("MI308", "gfx942"), ("MI350", "gfx950"),
                 ("MI355", "gfx950"))
_GFX = re.compile(r"gfx[0-9a-f]+")


def arch_of(device: jax.Device) -> str | None:
    """``gfx942``-style architecture of a ROCm device, or None when the plugin does not say."""
    for attribute in ("compute_capability", "device_kind"):
        value = str(getattr(device, attribute, "") or "")
        if match := _GFX.search(value):
            return match.group(0)
    kind = str(getattr(device, "device_kind", "") or "")
    return next((arch for part, arch in _KIND_TO_ARCH if part in kind), None)


@functools.cache
def local_arch() -> str | None:
    """The architecture of this process's first ROCm device; None without one (e.g. lowering from a CPU)."""
    if "rocm" not in _backend.present_platforms():
        return None
    return arch_of(jax.devices("rocm")[0])


@functools.cache
def assets_problem() -> str | None:
    """Why the installed AITER assets are refused (see manifest.validation_problem); None when none are
    installed or they may be used."""
    try:
        found = manifest.read(_native.library_dir() / "aiter")
    except manifest.ManifestError as err:
        return str(err)
    return manifest.validation_problem(found)


@functools.cache
def staged_archs() -> tuple[str, ...] | None:
    """Architectures of the installed AITER assets (their manifest), None when none are installed."""
    try:
        found = manifest.read(_native.library_dir() / "aiter")
    except manifest.ManifestError:
        return None  # the handlers report the broken installation when a program runs
    return None if found is None else tuple(found.get("gpu_archs", ()))


def arch_problem(needs: tuple[str, ...] = SUPPORTED_ARCHS) -> str | None:
    """Why this machine's ROCm device cannot run a kernel built for ``needs``, or the installed assets are
    refused; None when it can or is unknown."""
    if refused := assets_problem():
        return refused
    arch = local_arch()
    if arch is None:
        return None
    if arch not in needs:
        return f"AITER has these kernels for {', '.join(needs)} only, this device is {arch}"
    staged = staged_archs()
    if staged is not None and arch not in staged:
        return f"the installed AITER assets are built for {', '.join(staged)}, this device is {arch}"
    return None
