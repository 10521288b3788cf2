#!/usr/bin/env python3
"""Extract the facts the AITER bridge relies on from AITER's real artifacts into a compact JSON fixture.

    python tools/aiter_fixtures.py --hsa <aiter checkout or its hsa/ tree> \\
        --objdump /usr/lib/llvm-22/bin/llvm-objdump --commit <sha> --out tests/fixtures/aiter/<sha8>.json

For every code object of the ASM GEMM families the bridge launches (gfx950 ``f4gemm``, gfx942/gfx950
``bf16gemm``) it records the kernel symbol, the kernarg segment size and argument list from the code object's
``NT_AMDGPU_METADATA`` note, and the kernarg offsets the machine code actually loads: the SGPR pair holding the
kernarg pointer is derived from the kernel descriptor's ``kernel_code_properties``, then every scalar load whose
base is that pair (or a copy of it) is collected from ``llvm-objdump -d`` with its width and the first
instruction that reads the loaded dword (``shr1``: the kernel halves it first, ``shl1``: doubles it, ``raw``:
uses it as is, ``unread``; jax_aiter.aiter.validate.scan_loads). The ELF and its note are read with pyelftools
and msgpack here, independently of the validator's own standard-library reader. For every kernel table of those families it records the header and the rows.

Identical argument lists are stored once (``abis``) and referred to by id, as are identical load lists.
Needs pyelftools and msgpack; not used at test time (the tests read only the JSON).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import msgpack
from elftools.elf.elffile import ELFFile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from jax_aiter.aiter.validate import kernarg_sgpr, scan_loads  # noqa: E402  (the validator's load scan)

FAMILIES = (("gfx950", "f4gemm"), ("gfx942", "bf16gemm"), ("gfx950", "bf16gemm"), ("gfx942", "f4gemm"))
NT_AMDGPU_METADATA = 32

def hsa_root(path: Path) -> Path:
    """``path`` itself when it holds gfx*/ folders, else ``path/hsa`` (a checkout) or ``path/aiter_meta/hsa``."""
    for candidate in (path, path / "hsa", path / "aiter_meta" / "hsa"):
        if candidate.is_dir() and any(p.name.startswith("gfx") for p in candidate.iterdir() if p.is_dir()):
            return candidate
    raise SystemExit(f"{path}: no hsa tree (gfx*/ folders) found")


def _note_metadata(elf: ELFFile) -> dict:
    for section in elf.iter_sections():
        if section.header.sh_type != "SHT_NOTE":
            continue
        for note in section.iter_notes():
            if note.n_name == "AMDGPU" and note.n_type in (NT_AMDGPU_METADATA, "NT_AMDGPU_METADATA"):
                data = note.n_descdata
                if isinstance(data, str):
                    data = data.encode("latin-1")
                return msgpack.unpackb(data, raw=False)
    raise ValueError("no NT_AMDGPU_METADATA note")


def _kernel_descriptor(elf: ELFFile, symbol: str) -> bytes:
    for name in (".symtab", ".dynsym"):
        table = elf.get_section_by_name(name)
        if table is None:
            continue
        for sym in table.iter_symbols():
            if sym.name == symbol:
                for section in elf.iter_sections():
                    start = section.header.sh_addr
                    if section.header.sh_type == "SHT_PROGBITS" and start <= sym.entry.st_value < start + section.header.sh_size:
                        data = section.data()
                        off = sym.entry.st_value - start
                        return data[off:off + 64]
    raise ValueError(f"kernel descriptor {symbol} not found")


def kernel_disassembly(objdump: str, path: Path, arch: str, symbol: str) -> str:
    """The machine code from the kernel's entry to the end of .text. The code objects hold one kernel each, and
    their branch targets are local symbols, so --disassemble-symbols would stop at the first label."""
    out = subprocess.run([objdump, "-d", f"--mcpu={arch}", str(path)], capture_output=True, text=True,
                         check=True).stdout
    start = out.find(f"<{symbol}>:")
    if start < 0:
        raise ValueError(f"{path}: llvm-objdump printed no code for {symbol}")
    return out[start:]


def read_code_object(path: Path, arch: str, objdump: str | None) -> dict:
    data = path.read_bytes()
    elf = ELFFile(io.BytesIO(data))
    meta = _note_metadata(elf)
    kernels = meta.get("amdhsa.kernels", [])
    if len(kernels) != 1:
        raise ValueError(f"{path}: {len(kernels)} kernels, expected one")
    kernel = kernels[0]
    entry = {
        "kernel": kernel[".name"],
        "target": meta.get("amdhsa.target", ""),
        "kernarg_segment_size": kernel[".kernarg_segment_size"],
        "args": [[a.get(".name", ""), a[".offset"], a[".size"], a[".value_kind"]] for a in kernel.get(".args", [])],
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    if objdump:
        base, preload = kernarg_sgpr(_kernel_descriptor(elf, kernel[".symbol"]))
        entry["kernarg_sgpr"] = base
        entry["kernarg_preload_dwords"] = preload
        scanned = scan_loads(kernel_disassembly(objdump, path, arch, kernel[".name"]), base) if base is not None \
            else {"loads": [], "dynamic": []}
        entry["loads"] = scanned["loads"]
        if scanned["dynamic"]:
            entry["dynamic_loads"] = scanned["dynamic"]
    return entry


def read_table(path: Path) -> dict:
    rows = [r for r in csv.reader(io.StringIO(path.read_text())) if any(f.strip() for f in r)]
    return {"columns": rows[0] if rows else [], "rows": rows[1:]}


def _intern(store: dict, prefix: str, value) -> str:
    key = json.dumps(value, sort_keys=True)
    for ident, existing in store.items():
        if json.dumps(existing, sort_keys=True) == key:
            return ident
    ident = f"{prefix}{len(store)}"
    store[ident] = value
    return ident


def extract(hsa: Path, objdump: str | None, families=FAMILIES) -> dict:
    abis, load_sets, code_objects, tables = {}, {}, {}, {}
    for arch, family in families:
        folder = hsa / arch / family
        if not folder.is_dir():
            continue
        for csv_path in sorted(folder.glob("*.csv")):
            tables[f"{arch}/{family}/{csv_path.name}"] = read_table(csv_path)
        for co in sorted(folder.glob("*.co")):
            entry = read_code_object(co, arch, objdump)
            abi = {"kernarg_segment_size": entry.pop("kernarg_segment_size"), "args": entry.pop("args")}
            entry["abi"] = _intern(abis, f"{family}-abi", abi)
            if "loads" in entry:
                entry["loads"] = _intern(load_sets, f"{family}-loads", entry.pop("loads"))
            code_objects[f"{arch}/{family}/{co.name}"] = entry
    return {"abis": abis, "load_sets": load_sets, "code_objects": code_objects, "tables": tables}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hsa", type=Path, required=True, help="AITER checkout, wheel tree or hsa/ folder")
    parser.add_argument("--objdump", help="llvm-objdump with AMDGPU support (omit to skip the load scan)")
    parser.add_argument("--commit", default="", help="the AITER commit or release the tree comes from")
    parser.add_argument("--families", default="", help="arch/family,... (default: the bridge's four)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    families = tuple(tuple(f.split("/")) for f in args.families.split(",") if f) or FAMILIES
    root = hsa_root(args.hsa)
    data = extract(root, args.objdump, families)
    version = ""
    if args.objdump:
        version = subprocess.run([args.objdump, "--version"], capture_output=True, text=True).stdout
        version = next((line.strip() for line in version.splitlines() if "version" in line.lower()), "")
    data = {"source": {"aiter": args.commit, "tool": "tools/aiter_fixtures.py", "objdump": version}, **data}
    args.out.write_text(json.dumps(data, indent=None, separators=(",", ":")) + "\n")
    print(f"{args.out}: {len(data['code_objects'])} code objects, {len(data['abis'])} argument lists, "
          f"{len(data['load_sets'])} load lists, {len(data['tables'])} tables, {args.out.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
