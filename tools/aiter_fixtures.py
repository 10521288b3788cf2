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
uses it as is, ``unread``). For every kernel table of those families it records the header and the rows.

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

from elftools.elf.elffile import ELFFile
import msgpack

FAMILIES = (("gfx950", "f4gemm"), ("gfx942", "bf16gemm"), ("gfx950", "bf16gemm"), ("gfx942", "f4gemm"))
NT_AMDGPU_METADATA = 32

# kernel_code_properties bits (AMDGPU code object v3+ kernel descriptor, byte 56) that place user SGPRs before
# the kernarg segment pointer, with the number of SGPRs each takes.
_USER_SGPRS_BEFORE_KERNARG = ((0, 4), (1, 2), (2, 2))  # private segment buffer, dispatch ptr, queue ptr
_KERNARG_PTR_BIT = 3


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


def kernarg_sgpr(descriptor: bytes) -> tuple[int | None, int]:
    """(first SGPR of the kernarg pointer pair or None when not enabled, number of preloaded kernarg dwords)."""
    props = int.from_bytes(descriptor[56:58], "little")
    preload = int.from_bytes(descriptor[58:60], "little") & 0x7F
    if not props >> _KERNARG_PTR_BIT & 1:
        return None, preload
    return sum(n for bit, n in _USER_SGPRS_BEFORE_KERNARG if props >> bit & 1), preload


_INSN = re.compile(r"^\s+([a-z0-9_]+)(?:\s+(.*?))?\s*(?://.*)?$")
_SREG = re.compile(r"^s(\d+)$|^s\[(\d+):(\d+)\]$")
_LOAD = re.compile(r"^s_load_(dword|dwordx2|dwordx4|dwordx8|dwordx16|b32|b64|b128|b256|b512)$")
_WIDTH = {"dword": 4, "dwordx2": 8, "dwordx4": 16, "dwordx8": 32, "dwordx16": 64, "b32": 4, "b64": 8,
          "b128": 16, "b256": 32, "b512": 64}
# Instructions whose first operand is read, not written.
_NO_DEST = ("s_cmp", "s_bitcmp", "s_store", "s_buffer_store", "buffer_store", "global_store", "flat_store",
            "ds_write", "ds_store", "s_cbranch", "s_setreg", "s_waitcnt", "s_branch", "s_endpgm", "s_nop",
            "s_barrier", "s_sendmsg", "s_dcache", "s_setprio", "s_sleep", "s_atomic")


def _regs(operand: str) -> set[int]:
    match = _SREG.match(operand.strip())
    if not match:
        return set()
    if match.group(1) is not None:
        return {int(match.group(1))}
    return set(range(int(match.group(2)), int(match.group(3)) + 1))


def _split_operands(text: str) -> list[str]:
    return [o.strip() for o in text.split(",")] if text else []


def scan_loads(disassembly: str, base: int) -> dict:
    """Kernarg loads of one kernel's disassembly: [[offset, width, [use of each dword]]], and whether any load
    from the kernarg pointer has a non-constant offset or the pointer is overwritten before its last load."""
    insns = []
    for line in disassembly.splitlines():
        match = _INSN.match(line)
        if match and not line.lstrip().startswith("//"):
            insns.append((match.group(1), _split_operands(match.group(2) or "")))
    aliases = {(base, base + 1)}
    loads = []  # (index, offset, width, first dest register)
    dynamic = []
    for i, (mnemonic, ops) in enumerate(insns):
        if _LOAD.match(mnemonic) and len(ops) >= 3:
            pair = _regs(ops[1])
            if len(pair) == 2 and (min(pair), max(pair)) in aliases:
                width = _WIDTH[_LOAD.match(mnemonic).group(1)]
                offset_text = ops[2].split()[0]
                if re.fullmatch(r"0x[0-9a-fA-F]+|\d+", offset_text):
                    loads.append((i, int(offset_text, 0), width, min(_regs(ops[0]))))
                else:
                    dynamic.append(f"{mnemonic} {', '.join(ops)}")
            continue
        if mnemonic == "s_mov_b64" and len(ops) == 2:
            src, dst = _regs(ops[1]), _regs(ops[0])
            if len(src) == 2 and (min(src), max(src)) in aliases and len(dst) == 2:
                aliases.add((min(dst), max(dst)))
    result = []
    for index, offset, width, first in loads:
        uses = []
        for d in range(width // 4):
            reg = first + d
            use = "unread"
            for mnemonic, ops in insns[index + 1:]:
                dest_first = not mnemonic.startswith(_NO_DEST)
                sources = ops[1:] if dest_first else ops
                if any(reg in _regs(o) for o in sources):
                    shift = re.fullmatch(r"s_(lshr|lshl)_b32", mnemonic)
                    if shift and reg in _regs(ops[0]) and _regs(ops[0]) == _regs(ops[1]) and ops[2].isdigit():
                        use = ("shr" if shift.group(1) == "lshr" else "shl") + ops[2]
                    else:
                        use = "raw"
                    break
                if dest_first and ops and reg in _regs(ops[0]):
                    use = "overwritten"
                    break
            uses.append(use)
        result.append([offset, width, uses])
    return {"loads": sorted(result), "dynamic": dynamic}


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
