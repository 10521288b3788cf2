"""Check an AITER tree's ASM GEMM code objects and kernel tables against what the bridge passes and reads.

:func:`check_tree` takes an AITER checkout (or its ``hsa/`` folder, or an installed stage) and returns a list of
problems, each naming the table, code object, kernel and argument concerned; empty means the bridge's argument
blocks (csrc/aiter/asm_kernel_args.h, described here by :data:`LAYOUTS`), its table parser and its selection fit
those artifacts. ``jax-aiter check-aiter <path>`` prints the same list.

The checks run on extracted metadata (:func:`check_artifacts`), in the form tools/aiter_fixtures.py writes, so
the tests run them on committed fixtures; :func:`read_tree` extracts that metadata from a real tree. It reads
the ELF code objects and their ``NT_AMDGPU_METADATA`` note (msgpack) with the standard library alone. With an
``llvm-objdump`` (``objdump=``) it also disassembles each kernel and checks that every kernarg offset the code
loads is a field the launcher fills, used in the unit the bridge passes. An llvm-objdump that cannot disassemble
an architecture present (LLVM 14, Debian's default, knows neither gfx942 nor gfx950) is one problem, naming its
version and the versions needed; those code objects are checked without their loads, never reported missing.

A leaf module: it imports no jax_aiter op module and nothing outside the standard library.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

# --- what the bridge passes ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Field:
    """One member of an argument block: our C++ name, the code objects' argument name, where it lies, how the
    launcher fills it, and the first use the kernels make of the loaded value (``raw``: as is, ``shr1``: halved
    first, ``shl1``: doubled first; None for pointers)."""

    member: str
    arg: str
    offset: int
    size: int
    unit: str
    launcher: str  # "set" (gemm_*.cc assigns it) or why zero is the right value
    first_use: str | None = "raw"
    split_only: bool = False  # only split-K kernels (splitK = 1 in the table) must declare it


@dataclasses.dataclass(frozen=True)
class Layout:
    struct: str  # the C++ struct in csrc/aiter/asm_kernel_args.h
    size: int  # sizeof, what the launcher passes
    max_kernarg: int  # the largest kernarg segment a code object may declare (the rest must be padding)
    fields: tuple[Field, ...]

    def by_arg(self) -> dict[str, Field]:
        return {f.arg: f for f in self.fields}

    def by_offset(self) -> dict[int, Field]:
        return {f.offset: f for f in self.fields}


_UNUSED = "zero: not used (the kernels never load it)"


def _common(c_stride_unit: str, c_use: str, ab_unit: str, ab_use: str) -> tuple[Field, ...]:
    ptr = dict(size=8, first_use=None)
    return (
        Field("ptr_d", "D", 0x00, unit="pointer", launcher="set", **ptr),
        Field("ptr_c", "C", 0x10, unit="pointer", launcher="zero: no C input (beta = 0), as AITER passes", **ptr),
        Field("ptr_a", "A", 0x20, unit="pointer", launcher="set", **ptr),
        Field("ptr_b", "B", 0x30, unit="pointer", launcher="set", **ptr),
        Field("alpha", "alpha", 0x40, 4, "f32", "set"),
        Field("beta", "beta", 0x50, 4, "f32", "set"),
        Field("stride_d0", "strideD0", 0x60, 4, c_stride_unit, "set", None),
        Field("stride_d1", "strideD1", 0x70, 4, "-", _UNUSED, None),
        Field("stride_c0", "strideC0", 0x80, 4, c_stride_unit, "set", c_use),
        Field("stride_c1", "strideC1", 0x90, 4, "-", _UNUSED, None),
        Field("stride_a0", "strideA0", 0xA0, 4, ab_unit, "set", ab_use),
        Field("stride_a1", "strideA1", 0xB0, 4, "-", _UNUSED, None),
        Field("stride_b0", "strideB0", 0xC0, 4, ab_unit, "set", ab_use),
        Field("stride_b1", "strideB1", 0xD0, 4, "-", _UNUSED, None),
        Field("m", "Mdim", 0xE0, 4, "rows", "set"),
        Field("n", "Ndim", 0xF0, 4, "columns", "set"),
        Field("k", "Kdim", 0x100, 4, "elements", "set"),
    )


LAYOUTS: dict[str, Layout] = {
    # The output row stride reaches the kernels as strideC0, doubled first: bf16 output elements. strideA0 and
    # strideB0 are halved first: fp4 elements (two per byte). The scale strides are used as they are: bytes.
    "f4gemm": Layout("Fp4GemmArgs", 372, 384, _common("bf16 elements", "shl1", "fp4 elements", "shr1") + (
        Field("ptr_scale_a", "ScaleA", 0x110, 8, "pointer", "set", None),
        Field("ptr_scale_b", "ScaleB", 0x120, 8, "pointer", "set", None),
        Field("stride_scale_a0", "strideScaleA0", 0x130, 4, "bytes", "set"),
        Field("stride_scale_a1", "strideScaleA1", 0x140, 4, "-", _UNUSED, None),
        Field("stride_scale_b0", "strideScaleB0", 0x150, 4, "bytes", "set"),
        Field("stride_scale_b1", "strideScaleB1", 0x160, 4, "-", _UNUSED, None),
        Field("log2_k_split", "log2_k_split", 0x170, 4, "log2 of the K splits", "set", split_only=True),
    )),
    # Every stride is used as it is: bytes.
    "bf16gemm": Layout("Bf16GemmArgs", 352, 352, _common("bytes", "raw", "bytes", "raw") + (
        Field("splitk", "splitk", 0x110, 4, "K splits", "set"),
        Field("is_out_b16", "is_out_b16", 0x120, 4, "flag", "set"),
        Field("ptr_bias", "Bias", 0x130, 8, "pointer", "zero: no bias (add_bias = 0)", None),
        Field("add_bias", "add_bias", 0x140, 4, "flag", "zero: no bias"),
        Field("ptr_semaphore", "ptr_semaphore", 0x150, 8, "pointer",
              "set for split-K launches; zero otherwise, as AITER passes", None, split_only=True),
    )),
}

# The tables the bridge loads (csrc/aiter/gemm_fp4.cc, gemm.cc) and the architectures it loads them for.
TABLES = {
    "f4gemm": ("f4gemm_bf16_per1x32Fp4.csv", ("gfx950",)),
    "bf16gemm": ("bf16gemm_fp32bf16.csv", ("gfx942", "gfx950")),
}
# Columns (normalized: lower case, no underscores) csrc/aiter/kernel_table.cc reads, which must all be present,
# and the ones it knowingly ignores. Any other column is a change the bridge has not been checked against.
REQUIRED_COLUMNS = {
    "f4gemm": ("tilem", "tilen", "splitk", "bpreshuffle", "knlname", "coname"),
    "bf16gemm": ("knlname", "coname", "tilem", "tilen", "bpreshuffle", "splitk", "subk", "bias"),
}
IGNORED_COLUMNS = {"f4gemm": ("persistent",), "bf16gemm": ("tn", "pf")}
_INT_COLUMNS = ("tilem", "tilen", "splitk", "subk", "bpreshuffle", "bias", "persistent")


def normalize(column: str) -> str:
    return re.sub(r"[\s_]", "", column).lower()


# --- checks on extracted metadata ---------------------------------------------------------------------------


def _expand(artifacts: dict) -> tuple[dict[str, dict], dict[str, dict]]:
    """Code objects with their argument lists and loads inline (fixtures store shared ones once), and tables."""
    abis, load_sets = artifacts.get("abis", {}), artifacts.get("load_sets", {})
    code_objects = {}
    for path, entry in artifacts.get("code_objects", {}).items():
        entry = dict(entry)
        if isinstance(entry.get("abi"), str):
            entry.update(abis[entry.pop("abi")])
        if isinstance(entry.get("loads"), str):
            entry["loads"] = load_sets[entry["loads"]]
        code_objects[path] = entry
    return code_objects, artifacts.get("tables", {})


def check_code_object(where: str, family: str, entry: dict, split_k: bool = True) -> list[str]:
    """Problems of one code object's argument list and kernarg loads against the family's layout; ``split_k``:
    its table row says it splits K."""
    layout = LAYOUTS[family]
    kernel = entry.get("kernel", "?")
    at = f"{where} ({kernel})"
    problems = []
    size = entry["kernarg_segment_size"]
    if size > layout.max_kernarg:
        problems.append(f"{at}: declares a {size}-byte kernarg segment, {layout.struct} is {layout.size} bytes and "
                        f"segments up to {layout.max_kernarg} are known")
    by_arg, by_offset = layout.by_arg(), layout.by_offset()
    declared = {}
    for name, offset, arg_size, kind in entry["args"]:
        if name == "pad":
            continue
        declared[name] = offset
        field = by_arg.get(name)
        if field is None:
            ours = by_offset.get(offset)
            hint = f" where {layout.struct}::{ours.member} ('{ours.arg}') lies" if ours else ""
            problems.append(f"{at}: argument '{name}' at offset {offset:#x}{hint} is not in {layout.struct} "
                            f"(renamed or new)")
        elif (offset, arg_size) != (field.offset, field.size):
            problems.append(f"{at}: argument '{name}' is at offset {offset:#x} size {arg_size}, "
                            f"{layout.struct}::{field.member} at {field.offset:#x} size {field.size} (moved)")
        if offset + arg_size > layout.size:
            problems.append(f"{at}: argument '{name}' ends at byte {offset + arg_size}, beyond the "
                            f"{layout.size} bytes of {layout.struct}")
        if kind == "global_buffer" and arg_size != 8:
            problems.append(f"{at}: pointer argument '{name}' is {arg_size} bytes")
    for field in layout.fields:
        # Kernels that do not split K may end before the split-K fields (AITER passes them the same block).
        if field.arg not in declared and not (field.split_only and not split_k and field.offset >= size):
            problems.append(f"{at}: has no argument '{field.arg}' at offset {field.offset:#x} "
                            f"({layout.struct}::{field.member}; renamed or removed)")
    for offset, width, uses in entry.get("loads", []):
        for i, use in enumerate(uses):
            dword = offset + 4 * i
            field = next((f for f in layout.fields if f.offset <= dword < f.offset + f.size), None)
            if field is None:
                problems.append(f"{at}: loads kernarg offset {dword:#x}, which is padding in {layout.struct}")
            elif field.launcher == _UNUSED:
                problems.append(f"{at}: loads '{field.arg}' at {dword:#x}, which the launcher leaves zero "
                                f"({layout.struct}::{field.member})")
            elif field.first_use is not None and use in ("raw", "shr1", "shl1") and use != field.first_use:
                problems.append(f"{at}: uses '{field.arg}' at {dword:#x} as {use}, the bridge passes "
                                f"{field.unit} (expects {field.first_use}): the unit changed")
    for dynamic in entry.get("dynamic_loads", []):
        problems.append(f"{at}: loads its kernarg segment at a computed offset ({dynamic})")
    if entry.get("kernarg_preload_dwords"):
        problems.append(f"{at}: preloads {entry['kernarg_preload_dwords']} kernarg dwords into SGPRs")
    return problems


# What the launcher accepts as a code-object name (csrc/aiter/kernel_table.cc): a relative path of these
# characters without empty, "." or ".." parts.
_ASSET_NAME = re.compile(r"[A-Za-z0-9_.\-/]+")


def asset_name_problem(co_name: str) -> str | None:
    """Why the launcher refuses a kernel table's code-object name, which it joins to the asset folder (it must
    stay inside it); None when it accepts it. The build tool (tools/aiter_build.py) checks the names with this
    too."""
    if _ASSET_NAME.fullmatch(co_name) and not any(p in ("", ".", "..") for p in co_name.split("/")):
        return None
    return f"co_name {co_name!r} is not a relative path inside the asset folder (the launcher refuses it)"


def check_table(where: str, family: str, table: dict) -> tuple[list[str], list[dict]]:
    """Problems of one kernel table's header and rows, and its rows as dicts by normalized column."""
    columns = [normalize(c) for c in table["columns"]]
    problems = []
    missing = [c for c in REQUIRED_COLUMNS[family] if c not in columns]
    if missing:
        problems.append(f"{where}: lacks columns {missing} (header {table['columns']})")
    unknown = [raw for raw, c in zip(table["columns"], columns)
               if c not in REQUIRED_COLUMNS[family] and c not in IGNORED_COLUMNS[family]]
    if unknown:
        problems.append(f"{where}: has columns {unknown} the bridge does not know")
    rows = []
    for line, fields in enumerate(table["rows"], start=2):
        if len(fields) > len(columns):
            problems.append(f"{where}:{line}: {len(fields)} fields, the header has {len(columns)}")
            continue
        row = dict(zip(columns, (f.strip() for f in fields)))
        bad = [c for c in _INT_COLUMNS if row.get(c) and not row[c].isdigit()]
        if bad or not row.get("knlname") or not row.get("coname"):
            problems.append(f"{where}:{line}: unreadable row {fields}")
            continue
        if refused := asset_name_problem(row["coname"]):
            problems.append(f"{where}:{line}: {refused}")
            continue
        rows.append(row)
    return problems, rows


def check_artifacts(artifacts: dict, archs: tuple[str, ...] = ("gfx942", "gfx950")) -> list[str]:
    """Every problem of the tables the bridge loads for ``archs`` and the code objects their rows name. A code
    object listed in ``artifacts["unreadable"]`` is present: its own problem is reported there, not here."""
    code_objects, tables = _expand(artifacts)
    unreadable = artifacts.get("unreadable", {})
    problems = []
    for family, (table_name, family_archs) in TABLES.items():
        for arch in archs:
            if arch not in family_archs:
                continue
            where = f"hsa/{arch}/{family}/{table_name}"
            table = tables.get(f"{arch}/{family}/{table_name}")
            if table is None:
                problems.append(f"{where}: missing")
                continue
            table_problems, rows = check_table(where, family, table)
            problems += table_problems
            if not rows and not table_problems:
                problems.append(f"{where}: has no kernels")
            for row in rows:
                co_where = f"hsa/{arch}/{family}/{row['coname']}"
                entry = code_objects.get(f"{arch}/{family}/{row['coname']}")
                if entry is None and f"{arch}/{family}/{row['coname']}" in unreadable:
                    continue
                if entry is None:
                    problems.append(f"{co_where}: missing (named by {table_name} for {row['knlname']})")
                    continue
                if entry.get("kernel") != row["knlname"]:
                    problems.append(f"{co_where}: holds kernel {entry.get('kernel')}, {table_name} names "
                                    f"{row['knlname']}")
                problems += check_code_object(co_where, family, entry, split_k=row.get("splitk", "0") != "0")
    return problems


# --- reading a real tree --------------------------------------------------------------------------------------

NT_AMDGPU_METADATA = 32


class ArtifactError(ValueError):
    """A code object that cannot be read."""


def _msgpack(data: bytes, pos: int = 0) -> tuple[Any, int]:
    """Decode one msgpack value (the subset AMDGPU metadata uses) at ``pos``; returns it and the next position."""
    b = data[pos]
    pos += 1
    if b <= 0x7F:
        return b, pos
    if b >= 0xE0:
        return b - 0x100, pos
    if 0x80 <= b <= 0x8F or b in (0xDE, 0xDF):
        n, pos = (b & 0x0F, pos) if b <= 0x8F else _uint(data, pos, 2 if b == 0xDE else 4)
        out = {}
        for _ in range(n):
            key, pos = _msgpack(data, pos)
            out[key], pos = _msgpack(data, pos)
        return out, pos
    if 0x90 <= b <= 0x9F or b in (0xDC, 0xDD):
        n, pos = (b & 0x0F, pos) if b <= 0x9F else _uint(data, pos, 2 if b == 0xDC else 4)
        out = []
        for _ in range(n):
            value, pos = _msgpack(data, pos)
            out.append(value)
        return out, pos
    if 0xA0 <= b <= 0xBF or b in (0xD9, 0xDA, 0xDB, 0xC4, 0xC5, 0xC6):
        if b <= 0xBF:
            n = b & 0x1F
        else:
            n, pos = _uint(data, pos, {0xD9: 1, 0xDA: 2, 0xDB: 4, 0xC4: 1, 0xC5: 2, 0xC6: 4}[b])
        raw = data[pos:pos + n]
        return (raw.decode() if b < 0xC4 or b > 0xC6 else bytes(raw)), pos + n
    if b in (0xC0, 0xC2, 0xC3):
        return {0xC0: None, 0xC2: False, 0xC3: True}[b], pos
    if b in (0xCC, 0xCD, 0xCE, 0xCF):
        return _uint(data, pos, {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}[b])
    if b in (0xD0, 0xD1, 0xD2, 0xD3):
        n = {0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8}[b]
        return int.from_bytes(data[pos:pos + n], "big", signed=True), pos + n
    if b in (0xCA, 0xCB):
        n = 4 if b == 0xCA else 8
        return struct.unpack(">f" if n == 4 else ">d", data[pos:pos + n])[0], pos + n
    raise ArtifactError(f"unsupported msgpack type byte {b:#x}")


def _uint(data: bytes, pos: int, n: int) -> tuple[int, int]:
    return int.from_bytes(data[pos:pos + n], "big"), pos + n


def _sections(data: bytes) -> list[dict]:
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ArtifactError("not a little-endian ELF64 file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    sections = []
    for i in range(shnum):
        name, kind, _, addr, offset, size, link, _, _, entsize = struct.unpack_from("<IIQQQQIIQQ", data,
                                                                                  shoff + i * shentsize)
        sections.append({"name_off": name, "type": kind, "addr": addr, "offset": offset, "size": size,
                         "link": link, "entsize": entsize})
    names = sections[shstrndx]
    for s in sections:
        end = data.index(b"\0", names["offset"] + s["name_off"])
        s["name"] = data[names["offset"] + s["name_off"]:end].decode()
    return sections


def read_elf(data: bytes) -> dict:
    """The AMDGPU metadata note (decoded) and the symbols (name -> (value, file offset or None)) of a code
    object."""
    sections = _sections(data)
    metadata = None
    for s in sections:
        if s["type"] != 7:  # SHT_NOTE
            continue
        pos, end = s["offset"], s["offset"] + s["size"]
        while pos + 12 <= end:
            namesz, descsz, kind = struct.unpack_from("<III", data, pos)
            name = data[pos + 12:pos + 12 + namesz].rstrip(b"\0")
            desc = pos + 12 + (namesz + 3) // 4 * 4
            if name == b"AMDGPU" and kind == NT_AMDGPU_METADATA:
                metadata = _msgpack(data[desc:desc + descsz])[0]
            pos = desc + (descsz + 3) // 4 * 4
    if metadata is None:
        raise ArtifactError("no NT_AMDGPU_METADATA note")
    symbols = {}
    for s in sections:
        if s["type"] not in (2, 11):  # SHT_SYMTAB, SHT_DYNSYM
            continue
        strtab = sections[s["link"]]
        for i in range(s["size"] // 24):
            name_off, _, _, shndx, value, _ = struct.unpack_from("<IBBHQQ", data, s["offset"] + 24 * i)
            end = data.index(b"\0", strtab["offset"] + name_off)
            name = data[strtab["offset"] + name_off:end].decode()
            home = next((t for t in sections if t["type"] == 1 and t["addr"] <= value < t["addr"] + t["size"]), None)
            symbols.setdefault(name, (value, None if home is None else home["offset"] + value - home["addr"]))
    return {"metadata": metadata, "symbols": symbols}


# kernel_code_properties (kernel descriptor byte 56): the user SGPRs set up before the kernarg pointer.
_SGPRS_BEFORE_KERNARG = ((0, 4), (1, 2), (2, 2))  # private segment buffer, dispatch ptr, queue ptr
_KERNARG_PTR_BIT = 3


def kernarg_sgpr(descriptor: bytes) -> tuple[int | None, int]:
    """The first SGPR of the kernarg pointer pair (None when the kernel takes none) and the number of kernarg
    dwords preloaded into SGPRs, from a 64-byte kernel descriptor."""
    props = int.from_bytes(descriptor[56:58], "little")
    preload = int.from_bytes(descriptor[58:60], "little") & 0x7F
    if not props >> _KERNARG_PTR_BIT & 1:
        return None, preload
    return sum(n for bit, n in _SGPRS_BEFORE_KERNARG if props >> bit & 1), preload


_INSN = re.compile(r"^\s+([a-z][a-z0-9_]*)(?:\s+(.*?))?\s*(?://.*)?$")
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


def scan_loads(disassembly: str, base: int) -> dict:
    """The kernarg loads in ``disassembly`` (llvm-objdump text from the kernel's entry on) through the SGPR pair
    at ``base`` or a 64-bit copy of it: ``loads`` [[offset, bytes, [first use of each dword]]] and ``dynamic``
    (loads at a computed offset). The first use is that of the first later instruction reading the register:
    ``shr1``/``shl1`` when it shifts the register in place by one, ``raw`` otherwise; ``unread`` when nothing
    reads it, ``overwritten`` when it is written first."""
    insns = []
    for line in disassembly.splitlines():
        match = _INSN.match(line)
        if match:
            text = match.group(2) or ""
            insns.append((match.group(1), [o.strip() for o in text.split(",")] if text else []))
    aliases = {(base, base + 1)}
    loads, dynamic = [], []
    for i, (mnemonic, ops) in enumerate(insns):
        load = _LOAD.match(mnemonic)
        if load and len(ops) >= 3:
            pair = _regs(ops[1])
            if len(pair) == 2 and (min(pair), max(pair)) in aliases:
                offset_text = ops[2].split()[0]
                if re.fullmatch(r"0x[0-9a-fA-F]+|\d+", offset_text):
                    loads.append((i, int(offset_text, 0), _WIDTH[load.group(1)], min(_regs(ops[0]))))
                else:
                    dynamic.append(f"{mnemonic} {', '.join(ops)}")
        elif mnemonic == "s_mov_b64" and len(ops) == 2:
            src, dst = _regs(ops[1]), _regs(ops[0])
            if len(src) == 2 and (min(src), max(src)) in aliases and len(dst) == 2:
                aliases.add((min(dst), max(dst)))
    result = []
    for index, offset, width, first in loads:
        uses = []
        for reg in range(first, first + width // 4):
            use = "unread"
            for mnemonic, ops in insns[index + 1:]:
                has_dest = not mnemonic.startswith(_NO_DEST)
                if any(reg in _regs(o) for o in (ops[1:] if has_dest else ops)):
                    shift = re.fullmatch(r"s_(lshr|lshl)_b32", mnemonic)
                    if shift and len(ops) == 3 and _regs(ops[0]) == _regs(ops[1]) == {reg} and ops[2].isdigit():
                        use = ("shr" if shift.group(1) == "lshr" else "shl") + ops[2]
                    else:
                        use = "raw"
                    break
                if has_dest and ops and reg in _regs(ops[0]):
                    use = "overwritten"
                    break
            uses.append(use)
        result.append([offset, width, uses])
    return {"loads": sorted(result), "dynamic": dynamic}


class DisassemblyError(ArtifactError):
    """llvm-objdump did not disassemble a code object."""


def _disassemble(objdump: str, arch: str, path: Path) -> str:
    """``llvm-objdump -d --mcpu=arch`` of a code object. An llvm-objdump too old for the architecture either
    fails (LLVM 14 on gfx942: "can't find target ... 'unknown--'") or warns that it ignores the processor."""
    try:
        result = subprocess.run([objdump, "-d", f"--mcpu={arch}", str(path)], capture_output=True, text=True)
    except OSError as err:
        raise DisassemblyError(f"cannot run it: {err}") from err
    complaints = [line.strip() for line in result.stderr.splitlines() if line.strip()]
    ignored = [line for line in complaints if "not a recognized processor" in line]
    if result.returncode != 0 or ignored:
        raise DisassemblyError((ignored or complaints or [f"exit status {result.returncode}"])[0][:300])
    return result.stdout


def read_code_object(path: Path, arch: str, objdump: str | None = None) -> dict:
    """One code object's kernel, target, kernarg size, arguments and (with ``objdump``) kernarg loads. Raises
    ArtifactError when the file cannot be read, DisassemblyError (a subclass) when only its disassembly failed."""
    data = path.read_bytes()
    try:
        elf = read_elf(data)
    except (ArtifactError, IndexError, ValueError, struct.error) as err:
        raise ArtifactError(f"{path}: {err}") from err
    kernels = elf["metadata"].get("amdhsa.kernels", [])
    if len(kernels) != 1:
        raise ArtifactError(f"{path}: holds {len(kernels)} kernels, the bridge expects one")
    kernel = kernels[0]
    entry = {
        "kernel": kernel.get(".name", ""),
        "target": elf["metadata"].get("amdhsa.target", ""),
        "kernarg_segment_size": kernel.get(".kernarg_segment_size", 0),
        "args": [[a.get(".name", ""), a[".offset"], a[".size"], a.get(".value_kind", "")]
                 for a in kernel.get(".args", [])],
    }
    if objdump:
        _, kd_offset = elf["symbols"].get(kernel.get(".symbol", ""), (None, None))
        if kd_offset is None:
            raise ArtifactError(f"{path}: no kernel descriptor {kernel.get('.symbol')}")
        base, preload = kernarg_sgpr(data[kd_offset:kd_offset + 64])
        entry["kernarg_preload_dwords"] = preload
        entry["kernarg_sgpr"] = base
        entry["loads"], entry["dynamic_loads"] = [], []
        if base is not None:
            out = _disassemble(objdump, arch, path)
            start = out.find(f"<{entry['kernel']}>:")
            if start < 0:
                raise DisassemblyError(f"it printed no code for {entry['kernel']}")
            # One kernel per code object: from its entry to the end (its branch targets are local labels).
            scanned = scan_loads(out[start:], base)
            entry["loads"], entry["dynamic_loads"] = scanned["loads"], scanned["dynamic"]
    return entry


# The upstream LLVM release that first disassembles each architecture (ROCm's own LLVM has them earlier).
LLVM_FOR_ARCH = {"gfx942": 17, "gfx950": 20}
ROCM_OBJDUMP = "/opt/rocm/llvm/bin/llvm-objdump"


def objdump_version(objdump: str) -> str | None:
    """The LLVM version ``objdump --version`` states (``14.0.6``), None when it states none."""
    try:
        out = subprocess.run([objdump, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"LLVM version (\S+)", out)
    return match.group(1) if match else None


def disassembler_problem(objdump: str, refused: dict[str, str]) -> str:
    """The one problem that says ``objdump`` cannot disassemble the architectures in ``refused`` (arch -> what
    it said on the first code object of that architecture), what is needed, and how to go on."""
    version = objdump_version(objdump)
    archs = sorted(refused)
    needs = ", ".join(f"LLVM {LLVM_FOR_ARCH[a]} or newer for {a}" if a in LLVM_FOR_ARCH else a for a in archs)
    return (f"{objdump} ({f'LLVM {version}' if version else 'LLVM version unknown'}) cannot disassemble "
            f"{', '.join(archs)} code objects ({refused[archs[0]]}), so their kernarg loads were not checked. "
            f"Disassembling them needs {needs}, or ROCm's {ROCM_OBJDUMP}: point check-aiter at one with "
            "--objdump PATH, or check without disassembly with --no-disassembly")


def hsa_root(path: Path) -> Path:
    """``path`` when it holds gfx*/ folders, else its ``hsa/`` (a checkout or a stage) or ``aiter_meta/hsa``."""
    for candidate in (path, path / "hsa", path / "aiter_meta" / "hsa"):
        if candidate.is_dir() and any(p.is_dir() and p.name.startswith("gfx") for p in candidate.iterdir()):
            return candidate
    raise ArtifactError(f"{path}: no hsa tree (gfx*/ folders) found")


def read_table(path: Path) -> dict:
    lines = [line for line in path.read_text(encoding="utf-8-sig").splitlines() if line.strip()]
    rows = [[f.strip() for f in line.split(",")] for line in lines]
    return {"columns": rows[0] if rows else [], "rows": rows[1:]}


def read_tree(path: Path, objdump: str | None = None, archs: tuple[str, ...] = ("gfx942", "gfx950"),
              families: tuple[str, ...] = tuple(TABLES)) -> dict:
    """The metadata :func:`check_artifacts` checks, read from the code objects and tables under ``path``.

    ``unreadable``: code objects present but not readable (path -> problem), which check_artifacts does not
    report missing. ``disassembly``: problems of the disassembly alone, the metadata of those code objects being
    read and checked all the same: when ``objdump`` fails on the first code object of an architecture it is
    taken to be unable to disassemble that architecture, and one problem (:func:`disassembler_problem`) says so
    for all of them; a later failure is that code object's problem."""
    root = hsa_root(Path(path))
    code_objects, tables, unreadable, disassembly = {}, {}, {}, []
    refused: dict[str, str] = {}
    for arch in archs:
        disassembled = False
        for family in families:
            folder = root / arch / family
            if not folder.is_dir():
                continue
            for csv_path in sorted(folder.glob("*.csv")):
                tables[f"{arch}/{family}/{csv_path.name}"] = read_table(csv_path)
            for co in sorted(folder.glob("*.co")):
                key = f"{arch}/{family}/{co.name}"
                try:
                    try:
                        code_objects[key] = read_code_object(co, arch, None if arch in refused else objdump)
                        disassembled = disassembled or objdump is not None
                    except DisassemblyError as err:
                        if disassembled:
                            disassembly.append(f"hsa/{key}: {objdump} did not disassemble it ({err}); its kernarg "
                                               "loads were not checked")
                        else:
                            refused[arch] = str(err)
                        code_objects[key] = read_code_object(co, arch)
                except (ArtifactError, OSError) as err:
                    unreadable[key] = f"hsa/{key}: unreadable: {err}"
    if refused:
        disassembly.insert(0, disassembler_problem(objdump, refused))
    return {"code_objects": code_objects, "tables": tables, "unreadable": unreadable, "disassembly": disassembly}


def find_objdump() -> str | None:
    """An llvm-objdump that knows AMDGPU: ROCm's, else one on PATH."""
    for candidate in ("/opt/rocm/llvm/bin/llvm-objdump", shutil.which("llvm-objdump")):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


def check_tree(path: Path, objdump: str | None = None, archs: tuple[str, ...] = ("gfx942", "gfx950")) -> list[str]:
    """Every problem the bridge would have with the AITER tree at ``path`` (see the module docstring)."""
    artifacts = read_tree(Path(path), objdump, archs)
    return artifacts["disassembly"] + list(artifacts["unreadable"].values()) + check_artifacts(artifacts, archs)
