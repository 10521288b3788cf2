"""The manifest of a staged AITER build: which AITER commit, which GPU architectures and which build
configuration produced the staged files, and a hash of every file.

A staged build is reused only when all three inputs match and every file is as the manifest recorded
(:func:`mismatches` lists what differs). ``scripts/build-aiter.sh`` rebuilds on a mismatch, or fails with
``--reuse-only``; CMake refuses a stage that does not match. The ROCm version is recorded as provenance only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

SCHEMA = 1
FILE_NAME = "manifest.json"
# The AITER commit the bridge was checked against (third_party/aiter's gitlink; a test keeps them equal). Staged
# assets are used only when their manifest records that jax_aiter.aiter.validate passed on this commit.
PINNED_AITER_COMMIT = "e4048607a535ace3a2b51ded31b1c8c2d45c0879"
_ARCH = re.compile(r"gfx[0-9a-f]+")


class ManifestError(ValueError):
    """A manifest that cannot be read, or build inputs that cannot be stated."""


def parse_archs(text: str) -> tuple[str, ...]:
    """``"gfx942;gfx950"`` (``;`` or ``,`` separated, as GPU_ARCHS is written) -> sorted, unique names."""
    archs = sorted({part.strip() for part in re.split(r"[;,]", text) if part.strip()})
    if not archs:
        raise ManifestError("GPU_ARCHS names no architecture")
    bad = [a for a in archs if not _ARCH.fullmatch(a)]
    if bad:
        raise ManifestError(f"GPU_ARCHS: {bad} are not gfx architecture names (e.g. gfx942)")
    return tuple(archs)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def config_hash(root: Path, files: Iterable[str], settings: Mapping[str, Any]) -> str:
    """One hash of the build configuration: the contents of ``files`` (paths relative to ``root``) and the
    JSON-serializable ``settings`` (modules, asset families, build flags)."""
    digest = hashlib.sha256()
    for rel in sorted(files):
        path = root / rel
        if not path.is_file():
            raise ManifestError(f"build configuration file {rel} does not exist under {root}")
        digest.update(f"{rel}\0{sha256_file(path)}\0".encode())
    digest.update(json.dumps(settings, sort_keys=True, separators=(",", ":")).encode())
    return "sha256:" + digest.hexdigest()


@dataclasses.dataclass(frozen=True)
class BuildKey:
    """The inputs a staged build must match to be reused."""

    aiter_commit: str
    gpu_archs: tuple[str, ...]
    config_hash: str

    def as_json(self) -> dict[str, Any]:
        return {"aiter_commit": self.aiter_commit, "gpu_archs": list(self.gpu_archs), "config_hash": self.config_hash}


def hash_tree(stage: Path) -> dict[str, str]:
    """sha256 of every file under ``stage`` except the manifest, by path relative to ``stage``. A stage holds
    regular files and folders only: a symbolic link (whose target the hashes would not cover) is an error."""
    hashes = {}
    for folder, dirs, files in os.walk(stage, followlinks=False):
        for name in sorted(dirs + files):
            path = Path(folder) / name
            if path.is_symlink():
                raise ManifestError(f"{path} is a symbolic link; a staged AITER build holds regular files only")
        for name in files:
            path = Path(folder) / name
            if path.name != FILE_NAME or path.parent != stage:
                hashes[path.relative_to(stage).as_posix()] = sha256_file(path)
    return dict(sorted(hashes.items()))


def write(stage: Path, key: BuildKey, provenance: Mapping[str, str],
          validated: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Record ``key``, ``provenance``, the validation of the staged artifacts (``validated``: the AITER commit
    jax_aiter.aiter.validate passed on, and how) and the hashes of the files now under ``stage``; returns the
    manifest."""
    data = {"schema": SCHEMA, **key.as_json(), "provenance": dict(provenance), "files": hash_tree(stage)}
    if validated is not None:
        data["validated"] = dict(validated)
    tmp = stage / (FILE_NAME + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, stage / FILE_NAME)  # a crash mid-write leaves no manifest, never a half one
    return data


def read(stage: Path) -> dict[str, Any] | None:
    """The manifest under ``stage``; None when there is none."""
    path = stage / FILE_NAME
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as err:
        raise ManifestError(f"{path} is unreadable: {type(err).__name__}: {str(err)[:200]}") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ManifestError(f"{path} is not a schema-{SCHEMA} manifest")
    for field, kind, check in _FIELDS:
        if field in data and not check(data[field]):
            raise ManifestError(f"{path}: {field!r} must be {kind}, got {type(data[field]).__name__}")
    return data


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _string_map(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


# The fields a manifest may hold, with the JSON type each must have.
_FIELDS = (
    ("aiter_commit", "a string", lambda v: isinstance(v, str)),
    ("gpu_archs", "a list of strings", _strings),
    ("config_hash", "a string", lambda v: isinstance(v, str)),
    ("provenance", "an object of strings", _string_map),
    ("files", "an object mapping paths to sha256 strings", _string_map),
    ("validated", "an object", lambda v: isinstance(v, dict)),
)


def mismatches(stage: Path, key: BuildKey, *, verify_files: bool = True) -> list[str]:
    """Why the build staged under ``stage`` must not be reused for ``key``; empty when it may be."""
    try:
        data = read(stage)
    except ManifestError as err:
        return [str(err)]
    if data is None:
        return [f"no {FILE_NAME} in {stage}"]
    problems = []
    for field, wanted in key.as_json().items():
        if data.get(field) != wanted:
            problems.append(f"{field}: staged {data.get(field)!r}, wanted {wanted!r}")
    if verify_files:
        recorded = data.get("files", {})
        try:
            present = hash_tree(stage)
        except ManifestError as err:
            return problems + [str(err)]
        for rel in sorted(set(recorded) | set(present)):
            if rel not in present:
                problems.append(f"{rel}: recorded but missing")
            elif rel not in recorded:
                problems.append(f"{rel}: present but not recorded")
            elif present[rel] != recorded[rel]:
                problems.append(f"{rel}: contents changed since staging")
    return problems


def validation_problem(data: Mapping[str, Any] | None, pinned: str = PINNED_AITER_COMMIT) -> str | None:
    """Why the assets a manifest describes must not be used: no record that the validator passed on them, or
    passed on another AITER commit than the one the bridge pins. None when they may be used."""
    if data is None:
        return None
    validated = data.get("validated")
    if not isinstance(validated, Mapping) or "aiter_commit" not in validated:
        return "the installed AITER assets were staged without validation (rebuild with scripts/build-aiter.sh)"
    if validated.get("problems", 1) != 0:
        return f"the installed AITER assets failed validation ({validated.get('problems')} problems)"
    if validated["aiter_commit"] != pinned:
        return (f"the installed AITER assets were validated for AITER {str(validated['aiter_commit'])[:12]}, "
                f"this jax-aiter is checked against {pinned[:12]}")
    return None
