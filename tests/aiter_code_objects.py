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
    """A minimal ELF64 AMDGPU code object: a note section with NT_AMDGPU_METADATA and a section-name table."""
    meta = {"amdhsa.version": [1, 2], "amdhsa.target": "amdgcn-amd-amdhsa--gfx950",
            "amdhsa.kernels": [{".name": kernel, ".symbol": kernel + ".kd", ".kernarg_segment_size": kernarg_size,
                                ".args": [{".name": n, ".offset": o, ".size": s, ".value_kind": k}
                                          for n, o, s, k in args]}]}
    desc = _msgpack(meta)
    note = struct.pack("<III", 7, len(desc), 32) + b"AMDGPU\0\0" + desc + b"\0" * (-len(desc) % 4)
    names = b"\0.note\0.shstrtab\0"
    note_off = 64
    names_off = note_off + len(note)
    shoff = names_off + len(names) + (-(names_off + len(names)) % 8)
    header = b"\x7fELF" + bytes([2, 1, 1, 64, 3]) + b"\0" * 7 + struct.pack(
        "<HHIQQQIHHHHHH", 3, 224, 1, 0, 0, shoff, 0, 64, 0, 0, 64, 3, 2)
    sections = struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    sections += struct.pack("<IIQQQQIIQQ", 1, 7, 0, 0, note_off, len(note), 0, 0, 4, 0)
    sections += struct.pack("<IIQQQQIIQQ", 7, 3, 0, 0, names_off, len(names), 0, 0, 1, 0)
    path.write_bytes(header + note + names + b"\0" * (shoff - names_off - len(names)) + sections)
