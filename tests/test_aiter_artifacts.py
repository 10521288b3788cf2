"""The AITER bridge against AITER's real artifacts at the pinned commit, through the facts tools/aiter_fixtures.py
extracted from them (tests/fixtures/aiter/e4048607.json): code-object argument lists and the kernarg loads of
their machine code against csrc/aiter/asm_kernel_args.h and what the launchers set; kernel_table.cc and
gemm_select.cc on the real tables, and the selection against an oracle of AITER's own rules; the validator
(jax_aiter.aiter.validate, ``jax-aiter check-aiter``) on the fixture, on mutated copies, on the older wheel's
artifacts and on a code object written here. CPU only, no network; needs a host C++ compiler for the C++ parts.

Units (what the launcher passes, and the first use the kernels make of the loaded value, from the fixture):

| family | argument | offset | bridge passes | kernels' first use |
|---|---|---|---|---|
| f4gemm | strideA0, strideB0 | 0xA0, 0xC0 | K, in fp4 elements | halve it (shr 1): bytes |
| f4gemm | strideC0 | 0x80 | N, in bf16 output elements | double it (shl 1): bytes |
| f4gemm | strideD0 | 0x60 | N (AITER leaves it unset) | never loaded |
| f4gemm | strideScaleA0/B0 | 0x130, 0x150 | ceil(K/256)*8, bytes | as is |
| f4gemm | log2_k_split | 0x170 | 0 | loaded only by the split-K kernels (256x256, 128x512) |
| f4gemm | alpha, beta, C | 0x40, 0x50, 0x10 | 1, 0, null | loaded; read only by the split-K kernels |
| bf16gemm | strideA0, strideB0 | 0xA0, 0xC0 | K*2, bytes | as is |
| bf16gemm | strideC0 | 0x80 | N * output element size, bytes | as is (strideD0 is never loaded) |
| bf16gemm | splitk, is_out_b16, add_bias | 0x110, 0x120, 0x140 | split, out dtype flag, 0 | as is |
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jax_aiter.aiter import validate

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "aiter"
PINNED = json.loads((FIXTURES / "e4048607.json").read_text())
WHEEL = json.loads((FIXTURES / "wheel-0.1.7.post2.dev18.json").read_text())
sys.path.insert(0, str(Path(__file__).resolve().parent))
import aiter_selection_oracle as oracle  # noqa: E402
from aiter_code_objects import write_code_object  # noqa: E402

CODE_OBJECTS, TABLES = validate._expand(PINNED)
USED_TABLES = {"gfx950/f4gemm/f4gemm_bf16_per1x32Fp4.csv": "f4gemm",
               "gfx942/bf16gemm/bf16gemm_fp32bf16.csv": "bf16gemm",
               "gfx950/bf16gemm/bf16gemm_fp32bf16.csv": "bf16gemm"}


def test_fixture_covers_every_table_and_code_object_the_bridge_uses():
    assert PINNED["source"]["aiter"] == "e4048607a535ace3a2b51ded31b1c8c2d45c0879"
    assert set(USED_TABLES) <= set(TABLES)
    named = set()
    for table, family in USED_TABLES.items():
        arch = table.split("/")[0]
        columns = [validate.normalize(c) for c in TABLES[table]["columns"]]
        for row in TABLES[table]["rows"]:
            values = dict(zip(columns, row))
            path = f"{arch}/{family}/{values['coname']}"
            assert CODE_OBJECTS[path]["kernel"] == values["knlname"], path
            named.add(path)
    # Every code object in those folders is named by a table, and AITER ships f4gemm for gfx950 only.
    assert named == {p for p in CODE_OBJECTS if not p.startswith("gfx942/f4gemm")}
    assert TABLES["gfx942/f4gemm/f4gemm_bf16_per1x32Fp4.csv"]["rows"] == []
    # The kernarg pointer is s[0:1] in every kernel and nothing is preloaded or loaded at a computed offset.
    assert {(e["kernarg_sgpr"], e["kernarg_preload_dwords"]) for e in CODE_OBJECTS.values()} == {(0, 0)}
    assert not any(e.get("dynamic_loads") for e in CODE_OBJECTS.values())


# --- argument blocks: C++ structs == validate.LAYOUTS == the code objects ---------------------------------------


@pytest.fixture(scope="module")
def cxx_layout(tmp_path_factory, host_cxx) -> dict:
    """offsetof/sizeof of every member validate.LAYOUTS names, and every non-padding member the structs have,
    compiled from csrc/aiter/asm_kernel_args.h with the host compiler."""
    lines = []
    for layout in validate.LAYOUTS.values():
        for f in layout.fields:
            lines.append(f'  std::cout << "{layout.struct} {f.member} " << offsetof({layout.struct}, {f.member}) '
                         f'<< " " << sizeof({layout.struct}::{f.member}) << "\\n";')
        lines.append(f'  std::cout << "{layout.struct} sizeof " << sizeof({layout.struct}) << " 0\\n";')
    source = tmp_path_factory.mktemp("layout") / "layout.cc"
    source.write_text('#include <cstddef>\n#include <iostream>\n#include "asm_kernel_args.h"\n'
                      "using namespace jax_aiter::aiter;\nint main() {\n" + "\n".join(lines) + "\n}\n")
    exe = source.with_suffix("")
    subprocess.run([host_cxx, "-std=c++17", "-Wall", "-Werror", f"-I{REPO / 'csrc/aiter'}", str(source), "-o", str(exe)],
                   check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    return {(s, m): (int(o), int(z)) for s, m, o, z in (line.split() for line in out.splitlines())}


def _struct_members(struct_name: str) -> list[str]:
    text = (REPO / "csrc/aiter/asm_kernel_args.h").read_text()
    common = re.search(r"#define JA_AITER_GEMM_COMMON_FIELDS(.*?)\n\n", text, re.S).group(1)
    body = re.search(rf"struct __attribute__\(\(packed\)\) {struct_name} \{{(.*?)\}};", text, re.S).group(1)
    body = body.replace("JA_AITER_GEMM_COMMON_FIELDS", common)
    members = re.findall(r"\b(\w+);", body)
    return [m for m in members if not m.startswith("pad")]


@pytest.mark.parametrize("family", list(validate.LAYOUTS))
def test_python_layout_equals_the_cxx_struct(cxx_layout, family):
    layout = validate.LAYOUTS[family]
    assert cxx_layout[(layout.struct, "sizeof")][0] == layout.size
    for f in layout.fields:
        assert cxx_layout[(layout.struct, f.member)] == (f.offset, f.size), f.member
    assert sorted(_struct_members(layout.struct)) == sorted(f.member for f in layout.fields)


def test_every_named_argument_is_our_field_of_the_same_meaning():
    for path, entry in CODE_OBJECTS.items():
        family = path.split("/")[1]
        layout = validate.LAYOUTS[family]
        by_arg = layout.by_arg()
        named = [(n, o, s) for n, o, s, _ in entry["args"] if n != "pad"]
        for name, offset, size in named:
            assert (by_arg[name].offset, by_arg[name].size) == (offset, size), (path, name)
        # Our block covers every explicit argument; what lies past it is padding.
        assert max(o + s for _, o, s in named) <= layout.size, path
        assert entry["kernarg_segment_size"] <= layout.max_kernarg, path


def _launcher_assignments(source: str) -> set[str]:
    text = (REPO / "csrc/aiter" / source).read_text()
    return set(re.findall(r"\bargs\.(\w+)\s*=", text))


def test_every_loaded_offset_is_a_field_the_launcher_sets_in_the_kernels_unit():
    assigned = {"f4gemm": _launcher_assignments("gemm_fp4.cc"), "bf16gemm": _launcher_assignments("gemm.cc")}
    for family, layout in validate.LAYOUTS.items():
        # validate.LAYOUTS says "set" exactly for what the launcher assigns (the rest is memset to zero).
        assert {f.member for f in layout.fields if f.launcher.startswith("set")} == assigned[family]
    loaded = {}
    for path, entry in CODE_OBJECTS.items():
        family = path.split("/")[1]
        fields = validate.LAYOUTS[family].by_offset()
        for offset, width, uses in entry["loads"]:
            field = fields[offset]
            assert width == field.size, (path, hex(offset))
            assert field.launcher != validate._UNUSED, (path, field.member)
            for use in uses:
                if field.first_use is not None and use in ("raw", "shr1", "shl1"):
                    assert use == field.first_use, (path, field.member, use)
            loaded.setdefault(family, set()).add(field.arg)
    # What the table in the module docstring states.
    assert {"strideD0", "strideD1", "strideC1", "strideA1", "strideB1", "strideScaleA1",
            "strideScaleB1"}.isdisjoint(loaded["f4gemm"])
    assert "strideD0" not in loaded["bf16gemm"]
    split_f4 = {p for p, e in CODE_OBJECTS.items() if p.startswith("gfx950/f4gemm") and
                any(o == 0x170 for o, _, _ in e["loads"])}
    assert split_f4 == {"gfx950/f4gemm/f4gemm_bf16_per1x32Fp4_BpreShuffle_256x256.co",
                        "gfx950/f4gemm/f4gemm_bf16_per1x32Fp4_BpreShuffle_128x512.co"}


# --- the real tables through kernel_table.cc and gemm_select.cc --------------------------------------------------




def _write_table(directory: Path, table: str) -> Path:
    data = TABLES[table]
    path = directory / table.replace("/", "_")
    path.write_text("\n".join(",".join(r) for r in [data["columns"], *data["rows"]]) + "\n")
    return path


def _select(driver: Path, family: str, table: Path, arch: str, queries) -> list[dict]:
    text = "".join(f"{m} {n} {k} {cu}\n" for m, n, k, cu in queries)
    out = subprocess.run([str(driver), "select", family, str(table), arch], input=text, capture_output=True,
                         text=True, check=True).stdout
    return [json.loads(line) for line in out.splitlines()]


@pytest.mark.parametrize("table", list(USED_TABLES))
def test_real_tables_parse_and_every_row_is_reachable(host_driver, tmp_path, table):
    path = _write_table(tmp_path, table)
    family = "fp4" if "f4gemm" in table else "bf16"
    got = _select(host_driver, family, path, table.split("/")[0], [(256, 256, 1024, 256)])
    assert "table_error" not in got[0] and "error" not in got[0], got
    assert any(got[0]["co"] == f"{row[TABLES[table]['columns'].index('co_name')]}" for row in TABLES[table]["rows"])


M_GRID = [*range(1, 65), 96, 128, 200, 256, 512, 1000, 2048, 4096, 8192, 16384]
NK_GRID = [(4096, 4096), (14336, 4096), (4096, 14336), (8192, 8192), (28672, 8192), (8192, 28672), (10240, 8192),
           (4160, 4096), (1088, 1024), (576, 512), (6144, 4096)]  # LLaMA-8B/70B projections, then ragged N
CUS = {"gfx950": (256,), "gfx942": (304, 80)}  # MI355X; MI300X and MI308X


@pytest.mark.parametrize("table", list(USED_TABLES))
def test_selection_equals_aiters_heuristic(host_driver, host_cxx, tmp_path, table):
    """gemm_select.cc with the arch walks AITER's unordered_map order and must pick AITER's kernel and split
    everywhere on the grid; without it (file order) it must still follow AITER's rules over that order."""
    arch = table.split("/")[0]
    family = "fp4" if "f4gemm" in table else "bf16"
    path = _write_table(tmp_path, table)
    columns, raw_rows = TABLES[table]["columns"], TABLES[table]["rows"]
    rows = [dict(zip(columns, r)) for r in raw_rows]
    queries = [(m, n, k, cu) for cu in CUS[arch] for m in M_GRID for n, k in NK_GRID]
    map_order = oracle.unordered_map_order(host_cxx, tmp_path, [arch + r["knl_name"] for r in rows])
    for order, driver_arch in ((map_order, arch), (list(range(len(rows))), "")):
        walked = [rows[i] for i in order]
        ours = _select(host_driver, family, path, driver_arch, queries)
        for (m, n, k, cu), got in zip(queries, ours):
            if family == "fp4":
                index, log2, z = oracle.a4w4(walked, m, n, k, cu)
                want = (walked[index]["knl_name"], 1 << log2, z, (m + 31) // 32 * 32)
                assert (got["kernel"], got["split"], got["grid"][2], got["out_rows"]) == want, (m, n, k, cu)
            else:
                result = oracle.a16w16(walked, m, n, k, cu)
                assert not isinstance(result, str), (m, n, k, cu, result)
                assert (got["kernel"], got["split"]) == (walked[result[0]]["knl_name"], result[1]), (m, n, k, cu)
                # Padding: the launcher zero-pads A to tile_M rows when M < tile_M.
                assert got["grid"][1] == -(-m // got["tile"][0])


def test_walk_order_matters_for_aiters_fp4_choice(host_driver, tmp_path):
    """Why gemm_select.cc reproduces AITER's unordered_map walk: over file order AITER's comparisons pick other
    kernels for most decode shapes (M=1, N=K=4096 on 256 CUs: 256x128 in file order, 192x128 in AITER's)."""
    table = "gfx950/f4gemm/f4gemm_bf16_per1x32Fp4.csv"
    path = _write_table(tmp_path, table)
    (walked,) = _select(host_driver, "fp4", path, "gfx950", [(1, 4096, 4096, 256)])
    (filed,) = _select(host_driver, "fp4", path, "", [(1, 4096, 4096, 256)])
    assert walked["tile"] == [192, 128] and filed["tile"] == [256, 128]


# --- the validator ------------------------------------------------------------------------------------------------


def test_validator_accepts_the_pinned_artifacts():
    assert validate.check_artifacts(PINNED) == []


def _mutable():
    data = copy.deepcopy(PINNED)
    # Inline the argument lists so one code object can be changed alone.
    code_objects, _ = validate._expand(data)
    data["code_objects"] = copy.deepcopy(code_objects)
    return data


def test_validator_names_a_renamed_argument():
    data = _mutable()
    entry = data["code_objects"]["gfx950/f4gemm/f4gemm_bf16_per1x32Fp4_BpreShuffle_32x128.co"]
    entry["args"] = [["strideA_bytes" if a[0] == "strideA0" else a[0], *a[1:]] for a in entry["args"]]
    problems = validate.check_artifacts(data)
    assert len(problems) == 2, problems
    assert all("f4gemm_bf16_per1x32Fp4_BpreShuffle_32x128" in p for p in problems)
    assert any("'strideA_bytes' at offset 0xa0 where Fp4GemmArgs::stride_a0" in p for p in problems)
    assert any("has no argument 'strideA0'" in p for p in problems)


def test_validator_names_a_moved_argument_and_a_changed_unit():
    data = _mutable()
    entry = data["code_objects"]["gfx942/bf16gemm/bf16gemm_fp32bf16_tn_32x64_splitk_clean.co"]
    entry["args"] = [[a[0], 0x160 if a[0] == "ptr_semaphore" else a[1], *a[2:]] for a in entry["args"]]
    entry["loads"] = [[o, w, ["shr1"] if o == 0xA0 else u] for o, w, u in entry["loads"]]
    problems = validate.check_artifacts(data)
    assert any("'ptr_semaphore' is at offset 0x160" in p and "(moved)" in p for p in problems), problems
    assert any("uses 'strideA0' at 0xa0 as shr1" in p for p in problems), problems


def test_validator_names_a_missing_code_object_and_kernel():
    data = _mutable()
    del data["code_objects"]["gfx950/bf16gemm/bf16gemm_bf16_tn_256x256.co"]
    data["code_objects"]["gfx942/bf16gemm/bf16gemm_fp32bf16_tn_64x64_pf3_splitk.co"]["kernel"] = "_ZN5aiter3fooE"
    problems = validate.check_artifacts(data)
    assert problems == [
        "hsa/gfx942/bf16gemm/bf16gemm_fp32bf16_tn_64x64_pf3_splitk.co: holds kernel _ZN5aiter3fooE, "
        "bf16gemm_fp32bf16.csv names _ZN5aiter37bf16gemm_fp32bf16_tn_64x64_pf3_splitkE",
        "hsa/gfx950/bf16gemm/bf16gemm_bf16_tn_256x256.co: missing (named by bf16gemm_fp32bf16.csv for "
        "_ZN5aiter24bf16gemm_bf16_tn_256x256E)"]


def test_validator_names_changed_columns():
    data = _mutable()
    table = data["tables"]["gfx950/f4gemm/f4gemm_bf16_per1x32Fp4.csv"]
    table["columns"] = ["tile_M", "tile_N", "splitK", "b_shuffled", "knl_name", "co_name", "flat"]
    problems = validate.check_artifacts(data)
    assert "hsa/gfx950/f4gemm/f4gemm_bf16_per1x32Fp4.csv: lacks columns ['bpreshuffle']" in problems[0]
    assert "has columns ['b_shuffled', 'flat'] the bridge does not know" in problems[1]


def test_validator_names_a_bigger_kernarg_segment():
    data = _mutable()
    entry = data["code_objects"]["gfx950/f4gemm/f4gemm_bf16_per1x32Fp4_BpreShuffle_128x512.co"]
    entry["kernarg_segment_size"] = 400
    entry["args"] = entry["args"] + [["swizzle", 384, 4, "by_value"]]
    entry["loads"] = entry["loads"] + [[384, 4, ["raw"]]]
    problems = validate.check_artifacts(data)
    assert all("BpreShuffle_128x512" in p for p in problems) and len(problems) == 4, problems
    assert any("declares a 400-byte kernarg segment" in p for p in problems)
    assert any("'swizzle' ends at byte 388, beyond the 372 bytes of Fp4GemmArgs" in p for p in problems)
    assert any("loads kernarg offset 0x180, which is padding" in p for p in problems)


def test_validator_rejects_the_older_wheel():
    problems = validate.check_artifacts(WHEEL, archs=("gfx942",))
    assert problems == ["hsa/gfx942/bf16gemm/bf16gemm_fp32bf16.csv: missing"]
    # Its table under our name: the old columns; its code objects: the old, shorter argument block.
    renamed = copy.deepcopy(WHEEL)
    renamed["tables"]["gfx942/bf16gemm/bf16gemm_fp32bf16.csv"] = renamed["tables"].pop(
        "gfx942/bf16gemm/bf16gemm_outf32.csv")
    problems = validate.check_artifacts(renamed, archs=("gfx942",))
    assert "lacks columns ['coname', 'bpreshuffle', 'splitk', 'subk', 'bias']" in problems[0]
    assert "has columns ['knl_file'] the bridge does not know" in problems[1]
    table = renamed["tables"]["gfx942/bf16gemm/bf16gemm_fp32bf16.csv"]
    table["columns"] = ["knl_name", "co_name", "tn", "tileM", "tileN", "pf", "bPreshuffle", "splitK", "subK", "bias"]
    table["rows"] = [r + ["0", "0", "64", "0"] for r in table["rows"]]
    problems = validate.check_artifacts(renamed, archs=("gfx942",))
    assert len(problems) == 12, problems  # 4 kernels x is_out_b16, Bias, add_bias
    assert ("hsa/gfx942/bf16gemm/bf16gemm_outf32_tn_32x64_pf3.co (_ZN5aiter28bf16gemm_outf32_tn_32x64_pf3E): has no "
            "argument 'is_out_b16' at offset 0x120 (Bf16GemmArgs::is_out_b16; renamed or removed)") in problems


# --- the ELF reader, on a code object written here -------------------------------------------------------------


def _tree_from_fixture(root: Path, data: dict) -> None:
    code_objects, tables = validate._expand(data)
    for rel, table in tables.items():
        (root / "hsa" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "hsa" / rel).write_text("\n".join(",".join(r) for r in [table["columns"], *table["rows"]]) + "\n")
    for rel, entry in code_objects.items():
        write_code_object(root / "hsa" / rel, entry["kernel"], entry["args"], entry["kernarg_segment_size"])


def test_elf_reader_and_check_tree_on_written_code_objects(tmp_path):
    _tree_from_fixture(tmp_path, PINNED)
    read = validate.read_tree(tmp_path)
    assert read["unreadable"] == {} and read["disassembly"] == []
    for rel, entry in read["code_objects"].items():
        assert (entry["kernel"], entry["args"], entry["kernarg_segment_size"]) == (
            CODE_OBJECTS[rel]["kernel"], CODE_OBJECTS[rel]["args"], CODE_OBJECTS[rel]["kernarg_segment_size"])
    assert validate.check_tree(tmp_path) == []
    # A code object that is not an ELF file is reported once, as unreadable: it is present, not missing.
    broken = tmp_path / "hsa/gfx950/f4gemm/f4gemm_bf16_per1x32Fp4_BpreShuffle_64x128.co"
    broken.write_bytes(b"not an elf")
    problems = validate.check_tree(tmp_path)
    assert len(problems) == 1, problems
    assert problems[0].startswith("hsa/gfx950/f4gemm/f4gemm_bf16_per1x32Fp4_BpreShuffle_64x128.co: unreadable")


# --- an llvm-objdump that cannot disassemble the architectures ---------------------------------------------------

# What Debian's llvm-objdump 14 prints: its version, and for a gfx942 or gfx950 code object (ELF machine flags it
# does not know) this error, exit status 1 (observed with llvm-objdump-14 on code objects clang-22 built).
_LLVM14_OBJDUMP = r"""#!/bin/sh
if [ "$1" = "--version" ]; then
  printf 'Debian LLVM version 14.0.6\n  Optimized build.\n  Default target: x86_64-pc-linux-gnu\n'
  exit 0
fi
for last; do :; done
printf "llvm-objdump: error: '%s': can't find target: : error: unable to get target for 'unknown--', %s\n" \
  "$last" "see --version and --triple." >&2
exit 1
"""

# One that knows gfx942 but not gfx950 (LLVM 17 to 19): for gfx950 it warns that it ignores the processor and
# prints no kernel; for gfx942 it prints the kernel's label and an s_endpgm (no kernarg loads), and it fails on the
# one code object named in FAIL_ON.
_LLVM18_OBJDUMP = r"""#!{python}
import importlib.util, sys
from pathlib import Path
spec = importlib.util.spec_from_file_location("validate", {validate!r})  # the module alone, without jax
validate = sys.modules["validate"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(validate)
if sys.argv[1] == "--version":
    print("Ubuntu LLVM version 18.1.3")
    sys.exit(0)
arch, path = sys.argv[2].removeprefix("--mcpu="), Path(sys.argv[3])
if arch == "gfx950":
    print(f"'{{arch}}' is not a recognized processor for this target (ignoring processor)", file=sys.stderr)
    sys.exit(0)
if path.name == {fail_on!r}:
    print(f"llvm-objdump: error: '{{path}}': truncated section", file=sys.stderr)
    sys.exit(1)
kernel = validate.read_elf(path.read_bytes())["metadata"]["amdhsa.kernels"][0][".name"]
print(f"0000000000001600 <{{kernel}}>:\n\ts_endpgm")
"""


def _fake_objdump(tmp_path: Path, text: str) -> str:
    path = tmp_path / "llvm-objdump"
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


def test_an_llvm_14_objdump_is_one_problem_and_nothing_is_missing(tmp_path, capsys):
    """Debian's default llvm-objdump knows neither gfx942 nor gfx950: one problem says so (the version found,
    the versions needed, --objdump / --no-disassembly), every code object's metadata is still checked, and no
    present code object is reported unreadable or missing."""
    from jax_aiter import cli

    _tree_from_fixture(tmp_path / "tree", PINNED)
    objdump = _fake_objdump(tmp_path, _LLVM14_OBJDUMP)
    read = validate.read_tree(tmp_path / "tree", objdump)
    assert read["unreadable"] == {} and set(read["code_objects"]) == set(CODE_OBJECTS)
    problems = validate.check_tree(tmp_path / "tree", objdump)
    assert len(problems) == 1, problems
    (problem,) = problems
    for part in (objdump, "(LLVM 14.0.6)", "cannot disassemble gfx942, gfx950 code objects",
                 "unable to get target for 'unknown--'", "LLVM 17 or newer for gfx942",
                 "LLVM 20 or newer for gfx950", validate.ROCM_OBJDUMP, "--objdump PATH", "--no-disassembly"):
        assert part in problem, part
    assert cli.main(["check-aiter", str(tmp_path / "tree"), "--objdump", objdump]) == 1
    captured = capsys.readouterr()
    assert captured.out == problem + "\n" and "check-aiter: 1 problem\n" in captured.err
    assert cli.main(["check-aiter", str(tmp_path / "tree"), "--objdump", objdump, "--no-disassembly"]) == 0
    assert "without disassembly (--no-disassembly)" in capsys.readouterr().out
    assert cli.main(["check-aiter", str(tmp_path / "tree"), "--objdump", str(tmp_path / "absent")]) == 2
    assert "no such executable" in capsys.readouterr().err


def test_an_objdump_without_gfx950_checks_gfx942_and_names_the_rest(tmp_path):
    """An llvm-objdump that disassembles gfx942 but ignores gfx950: the gfx942 kernels are disassembled (here:
    no loads), one problem names gfx950 and LLVM 20; a gfx942 code object it then fails on is that file's own
    problem, and still not missing."""
    _tree_from_fixture(tmp_path / "tree", PINNED)
    fail_on = "bf16gemm_fp32bf16_tn_64x64_pf3_splitk.co"
    assert f"gfx942/bf16gemm/{fail_on}" in CODE_OBJECTS
    objdump = _fake_objdump(tmp_path, _LLVM18_OBJDUMP.format(python=sys.executable, validate=validate.__file__,
                                                                  fail_on=fail_on))
    read = validate.read_tree(tmp_path / "tree", objdump)
    disassembled = {k for k, v in read["code_objects"].items() if "loads" in v}
    assert disassembled == {k for k in CODE_OBJECTS if k.startswith("gfx942/") and not k.endswith(fail_on)}
    problems = validate.check_tree(tmp_path / "tree", objdump)
    assert len(problems) == 2, problems
    assert "(LLVM 18.1.3) cannot disassemble gfx950 code objects ('gfx950' is not a recognized processor" in problems[0]
    assert "LLVM 20 or newer for gfx950" in problems[0] and "gfx942" not in problems[0]
    assert problems[1].startswith(f"hsa/gfx942/bf16gemm/{fail_on}: {objdump} did not disassemble it (")
    assert "truncated section" in problems[1] and not any("missing" in p for p in problems)


def test_cli_check_aiter(tmp_path, capsys):
    from jax_aiter import cli

    _tree_from_fixture(tmp_path, PINNED)
    assert cli.main(["check-aiter", str(tmp_path), "--no-disassembly"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "no problems" in out
    (tmp_path / "hsa/gfx950/bf16gemm/bf16gemm_bf16_tn_256x256.co").unlink()
    assert cli.main(["check-aiter", str(tmp_path), "--no-disassembly"]) == 1
    assert "bf16gemm_bf16_tn_256x256.co: missing" in capsys.readouterr().out


# --- manifest: assets are used only when validated for the pinned commit --------------------------------------


def test_pinned_commit_constant_is_the_gitlink():
    from jax_aiter.aiter import manifest

    assert PINNED["source"]["aiter"] == manifest.PINNED_AITER_COMMIT
    if shutil.which("git") and (REPO / ".git").exists():
        line = subprocess.run(["git", "-C", str(REPO), "ls-files", "--stage", "--", "third_party/aiter"],
                              capture_output=True, text=True).stdout.split()
        if line:
            assert line[:2] == ["160000", manifest.PINNED_AITER_COMMIT]


def test_manifest_validation_gates_the_assets(tmp_path, monkeypatch):
    from jax_aiter import _native
    from jax_aiter.aiter import _support, manifest

    pinned = manifest.PINNED_AITER_COMMIT
    assert manifest.validation_problem(None) is None
    assert "without validation" in manifest.validation_problem({"aiter_commit": pinned})
    assert "failed validation (3 problems)" in manifest.validation_problem(
        {"validated": {"aiter_commit": pinned, "problems": 3}})
    assert "validated for AITER 569ae9881f72" in manifest.validation_problem(
        {"validated": {"aiter_commit": "569ae9881f72e5d630d036172790fc90eb1592e8", "problems": 0}})
    assert manifest.validation_problem({"validated": {"aiter_commit": pinned, "problems": 0}}) is None

    stage = tmp_path / "aiter"
    stage.mkdir()
    key = manifest.BuildKey(pinned, ("gfx950",), "sha256:1")
    monkeypatch.setattr(_native, "library_dir", lambda: tmp_path)
    monkeypatch.setattr(_support, "local_arch", lambda: "gfx950")
    for validated, reason in ((None, "without validation"),
                              ({"aiter_commit": "0" * 40, "problems": 0}, "validated for AITER 000000000000"),
                              ({"aiter_commit": pinned, "problems": 0}, None)):
        manifest.write(stage, key, {}, validated)
        _support.assets_problem.cache_clear()
        _support.staged_archs.cache_clear()
        problem = _support.arch_problem()
        assert (problem is None) if reason is None else (reason in problem), problem
        # The aiter gemm implementation is not selected, with that reason.
        import jax
        import jax.numpy as jnp

        import jax_aiter.aiter.gemm  # noqa: F401
        from jax_aiter import _backend

        impl = next(i for i in _backend.implementations("gemm") if i.name == "aiter")
        a, b = jax.ShapeDtypeStruct((8, 128), jnp.bfloat16), jax.ShapeDtypeStruct((64, 128), jnp.bfloat16)
        assert impl.supports(a, b) == problem
    _support.assets_problem.cache_clear()
    _support.staged_archs.cache_clear()
