"""A writer of minimal AMDGPU code objects for the tests: an ELF64 file with an NT_AMDGPU_METADATA note (our own
msgpack encoder) and nothing else, enough for jax_aiter.aiter.validate's reader."""

from __future__ import annotations

import struct
from pathlib import Path


def _msgpack(value) -> bytes:
    """A msgpack encoder for the types AMDGPU metadata uses."""
    if isinstance(value, bool):
        return b"\xc3" if value else b"\xc2"
    if isinstance(value, int):
        return bytes([value]) if 0 <= value < 128 else b"\xcd" + value.to_bytes(2, "big")
    if isinstance(value, str):
        raw = value.encode()
        return (bytes([0xA0 | len(raw)]) if len(raw) < 32 else b"\xd9" + bytes([len(raw)])) + raw
    if isinstance(value, list):
        return bytes([0x90 | len(value)]) + b"".join(map(_msgpack, value)) if len(value) < 16 else \
            b"\xdc" + len(value).to_bytes(2, "big") + b"".join(map(_msgpack, value))
    if isinstance(value, dict):
        return bytes([0x80 | len(value)]) + b"".join(_msgpack(k) + _msgpack(v) for k, v in value.items())
    raise TypeError(value)


def write_code_object(path: Path, kernel: str, args: list, kernarg_size: int) -> None:
    """A minimal ELF64 AMDGPU code object: a note section with NT_AMDGPU_METADATA, the kernel's 64-byte descriptor
    (kernarg pointer in s[0:1], nothing preloaded) in .rodata under the symbol ``<kernel>.kd``, its symbol and
    string tables, and the section-name table. No machine code."""
    meta = {"amdhsa.version": [1, 2], "amdhsa.target": "amdgcn-amd-amdhsa--gfx950",
            "amdhsa.kernels": [{".name": kernel, ".symbol": kernel + ".kd", ".kernarg_segment_size": kernarg_size,
                                ".args": [{".name": n, ".offset": o, ".size": s, ".value_kind": k}
                                          for n, o, s, k in args]}]}
    desc = _msgpack(meta)
    note = struct.pack("<III", 7, len(desc), 32) + b"AMDGPU\0\0" + desc + b"\0" * (-len(desc) % 4)
    descriptor_addr = 0x1000
    descriptor = bytearray(64)
    descriptor[56:58] = (1 << 3).to_bytes(2, "little")  # kernel_code_properties: the kernarg segment pointer
    strtab = b"\0" + (kernel + ".kd").encode() + b"\0"
    symtab = b"\0" * 24 + struct.pack("<IBBHQQ", 1, 0x11, 0, 2, descriptor_addr, 64)  # in section 2 (.rodata)
    # name, type, address, contents, link, entry size
    sections = [(".note", 7, 0, note, 0, 0), (".rodata", 1, descriptor_addr, bytes(descriptor), 0, 0),
                (".strtab", 3, 0, strtab, 0, 0), (".symtab", 2, 0, symtab, 3, 24)]
    names = b"\0" + b"".join(name.encode() + b"\0" for name, *_ in sections) + b".shstrtab\0"
    sections.append((".shstrtab", 3, 0, names, 0, 0))
    body, offsets = b"", []
    for _, _, _, contents, _, _ in sections:
        body += b"\0" * (-(64 + len(body)) % 8)
        offsets.append(64 + len(body))
        body += contents
    body += b"\0" * (-(64 + len(body)) % 8)
    shoff = 64 + len(body)
    header = b"\x7fELF" + bytes([2, 1, 1, 64, 3]) + b"\0" * 7 + struct.pack(
        "<HHIQQQIHHHHHH", 3, 224, 1, 0, 0, shoff, 0, 64, 0, 0, 64, len(sections) + 1, len(sections))
    table = struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    name_off = 1
    for (name, kind, addr, contents, link, entsize), offset in zip(sections, offsets):
        table += struct.pack("<IIQQQQIIQQ", name_off, kind, 0, addr, offset, len(contents), link, 0, 8, entsize)
        name_off += len(name) + 1
    path.write_bytes(header + body + table)
