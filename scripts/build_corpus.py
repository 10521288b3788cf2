#!/usr/bin/env python3
"""Build the real-English-text corpus of the convergence benchmark from pinned Debian documentation packages.

    python3 scripts/build_corpus.py --out DIR            # download (cached in DIR/debs), build DIR/corpus.txt + .json
    python3 scripts/build_corpus.py --out DIR --check    # verify DIR/corpus.txt against the recorded sha256 and size
    python3 scripts/build_corpus.py --sample --out DIR   # the small CPU-test sample (Python tutorial) instead

Documents: the reStructuredText sources that Sphinx ships beside its HTML (``html/_sources/**/*.txt``) of the Linux
kernel documentation (without ``translations/``, which is not English) and of the Python documentation. They are
ordered by path, then shuffled with a fixed seed (so a held-out tail mixes both manuals), joined with
``DOCUMENT_SEPARATOR`` and written as one UTF-8 file. Same packages, same bytes: each .deb's sha256 is pinned here
and the result's sha256 and size are recorded below. Needs only Python's standard library, apt-get and dpkg-deb
(Debian or Ubuntu with Debian's sources; run ``apt-get update`` first).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Package:
    name: str
    version: str
    sha256: str
    sources: str  # the Sphinx _sources folder inside the package
    exclude: tuple[str, ...] = ()  # folders under sources to leave out

    @property
    def pin(self) -> str:
        return f"{self.name}={self.version}"


LINUX_DOC = Package("linux-doc-6.1", "6.1.176-1",
                    "0d843674607703b9ef8c1db5e715c38ed52ff23574feabfe0d961d552126859f",
                    "usr/share/doc/linux-doc-6.1/html/_sources", exclude=("translations",))
PYTHON_DOC = Package("python3.11-doc", "3.11.2-6+deb12u8",
                     "50eb63e7f636c4281e9ce1b8f10386f1def42159eddce34fc1f41c46261df71b",
                     "usr/share/doc/python3.11/html/_sources")
CORPUS_PACKAGES = (LINUX_DOC, PYTHON_DOC)

# The sample: the Python tutorial only (PSF License, redistributable), with the documentation's license beside it.
SAMPLE_FOLDER = "tutorial"
SAMPLE_LICENSE = "license.rst.txt"

SHUFFLE_SEED = "jax-aiter convergence corpus 1"
# ASCII record separator between documents: no source contains it (checked), so documents can be split back out.
DOCUMENT_SEPARATOR = b"\n\x1e\n"

CORPUS_FILE, CORPUS_SHA256, CORPUS_BYTES = (
    "corpus.txt", "523167dcc7045d9b3095e1d9a3c34b63f6c97fa8ce2c23ac0101d6a7ee495e63", 32445432)
SAMPLE_FILE, SAMPLE_SHA256, SAMPLE_BYTES = (
    "python-3.11-tutorial.txt", "2371ac580ba238c28904ac1e588c4b4f0c323ce5783884d52b00aaf41b59b0ad", 256351)
SAMPLE_LICENSE_FILE = "LICENSE-python-docs.rst.txt"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--cache", type=Path, help="where downloaded .debs are kept (default OUT/debs)")
    parser.add_argument("--sample", action="store_true", help="build the small CPU-test sample instead")
    parser.add_argument("--check", action="store_true", help="only verify the built file's sha256 and size")
    args = parser.parse_args(argv)
    name, sha256, size = (SAMPLE_FILE, SAMPLE_SHA256, SAMPLE_BYTES) if args.sample else \
        (CORPUS_FILE, CORPUS_SHA256, CORPUS_BYTES)
    target = args.out / name
    if args.check:
        return check(target, sha256, size)

    packages = (PYTHON_DOC,) if args.sample else CORPUS_PACKAGES
    cache = args.cache or args.out / "debs"
    cache.mkdir(parents=True, exist_ok=True)
    debs = [fetch(package, cache) for package in packages]
    with tempfile.TemporaryDirectory(prefix="build_corpus_") as scratch:
        documents = []
        for package, deb in zip(packages, debs):
            root = Path(scratch) / package.name
            subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
            sources = root / package.sources
            if args.sample:
                documents += read_documents(package, sources / SAMPLE_FOLDER, sources)
                shutil.copyfile(sources / SAMPLE_LICENSE, args.out / SAMPLE_LICENSE_FILE)
            else:
                documents += read_documents(package, sources, sources)
    text = join(documents)
    write_atomically(target, text)
    digest = hashlib.sha256(text).hexdigest()
    record = {"file": name, "sha256": digest, "bytes": len(text), "documents": len(documents),
              "packages": [{"name": p.name, "version": p.version, "sha256": p.sha256} for p in packages],
              "shuffle_seed": SHUFFLE_SEED, "document_separator": DOCUMENT_SEPARATOR.decode()}
    if not args.sample:
        write_atomically(args.out / "corpus.json", (json.dumps(record, indent=2) + "\n").encode())
    print(json.dumps(record, indent=2))
    if (digest, len(text)) != (sha256, size):
        print(f"build_corpus: built {target} with sha256 {digest} ({len(text)} bytes), but this script records "
              f"{sha256} ({size} bytes)", file=sys.stderr)
        return 1
    return 0


def check(target: Path, sha256: str, size: int) -> int:
    if not target.is_file():
        print(f"build_corpus: {target} does not exist; build it first (without --check)", file=sys.stderr)
        return 1
    digest = file_sha256(target)
    actual_size = target.stat().st_size
    if (digest, actual_size) != (sha256, size):
        print(f"build_corpus: {target} has sha256 {digest} ({actual_size} bytes); expected {sha256} ({size} bytes)",
              file=sys.stderr)
        return 1
    print(f"{target}: sha256 {digest}, {actual_size} bytes: as recorded")
    return 0


def fetch(package: Package, cache: Path) -> Path:
    """The package's .deb from the cache, else from apt-get download; its sha256 checked either way."""
    deb = cache / f"{package.name}_{package.version.replace(':', '%3a')}_all.deb"
    if deb.is_file() and file_sha256(deb) == package.sha256:
        return deb
    if shutil.which("apt-get") is None:
        sys.exit(f"build_corpus: apt-get is needed to download {package.pin} and is not on PATH")
    with tempfile.TemporaryDirectory(dir=cache) as download:
        proc = subprocess.run(["apt-get", "download", package.pin], cwd=download, capture_output=True, text=True)
        fetched = list(Path(download).glob("*.deb"))
        if proc.returncode != 0 or len(fetched) != 1:
            sys.exit(f"build_corpus: `apt-get download {package.pin}` failed:\n{proc.stderr.strip()}\n"
                     f"The pinned version {package.version} of {package.name} is not served by this machine's apt "
                     f"sources (run `apt-get update` first if their lists are old; Debian drops superseded versions "
                     f"from its mirrors). The corpus cannot be rebuilt bit for bit without it: pin a served version "
                     f"in scripts/build_corpus.py and record the new sha256 and size.")
        digest = file_sha256(fetched[0])
        if digest != package.sha256:
            sys.exit(f"build_corpus: {package.pin} downloaded with sha256 {digest}, pinned {package.sha256}")
        fetched[0].replace(deb)
    return deb


def read_documents(package: Package, folder: Path, sources: Path) -> list[tuple[str, bytes]]:
    """``(key, text)`` for each ``*.txt`` under ``folder``, keyed ``<package>/<path under sources>``."""
    if not folder.is_dir():
        sys.exit(f"build_corpus: {package.pin} has no folder {folder.relative_to(sources)} under {package.sources}")
    documents = []
    for path in sorted(folder.rglob("*.txt")):
        relative = path.relative_to(sources)
        if relative.parts[0] in package.exclude:
            continue
        text = path.read_bytes()
        try:
            text.decode("utf-8")
        except UnicodeDecodeError as err:
            sys.exit(f"build_corpus: {package.name}/{relative} is not UTF-8 ({err})")
        if DOCUMENT_SEPARATOR.strip() in text:
            sys.exit(f"build_corpus: {package.name}/{relative} contains the document separator byte")
        documents.append((f"{package.name}/{relative.as_posix()}", text))
    return documents


def join(documents: list[tuple[str, bytes]]) -> bytes:
    """Documents in path order, then shuffled: sorted by the sha256 of seed + key, which no Python or platform
    version changes."""
    in_path_order = sorted(documents)
    shuffled = sorted(in_path_order, key=lambda doc: hashlib.sha256(f"{SHUFFLE_SEED}\0{doc[0]}".encode()).digest())
    return DOCUMENT_SEPARATOR.join(text for _, text in shuffled)


def write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(data)
    partial.replace(path)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


if __name__ == "__main__":
    sys.exit(main())
