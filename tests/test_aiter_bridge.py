"""The AITER bridge, checked without an AMD GPU: argument-block layouts and kernel selection (the plain-C++ parts
of csrc/aiter, built for the host), the build's interface checks, staging and manifest gating against a fake
AITER checkout, registration and ``supports`` reasons, lowering of every op for ROCm with the aiter backend
forced, and ``jax.export`` of an MXFP4 training step for ROCm."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_aiter
from aiter_code_objects import write_code_object
from jax_aiter import _backend, _native
from jax_aiter.aiter import _support, manifest, validate
from jax_aiter.aiter import gemm_fp4 as aiter_gemm_fp4
from jax_aiter.gemm import gemm
from jax_aiter.gemm_fp4 import gemm_fp4, gemm_fp4_bf16
from jax_aiter.gemm_fp4._gemm import gemm_fp4_plain_b
from jax_aiter.mha import flash_attn_func, flash_attn_varlen
from jax_aiter.mha._contract import AttentionOptions
from jax_aiter.ref import mxfp4 as mxfp4_ref
from jax_aiter.rmsnorm import rms_norm, rms_norm_with_add

REPO = Path(__file__).resolve().parents[1]
# The AITER build tool lives in the checkout's tools/, outside the package.
_build_spec = importlib.util.spec_from_file_location("aiter_build", REPO / "tools" / "aiter_build.py")
build = importlib.util.module_from_spec(_build_spec)
_build_spec.loader.exec_module(build)


@pytest.fixture(autouse=True)
def _run_from_checkout(monkeypatch):
    """The AITER build tool works on the source checkout it is started in, as scripts/build-aiter.sh does."""
    monkeypatch.chdir(REPO)


FIXTURES = REPO / "tests" / "fixtures" / "aiter"
CXX = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
needs_cxx = pytest.mark.skipif(CXX is None, reason="needs a host C++ compiler")
needs_git = pytest.mark.skipif(shutil.which("git") is None or shutil.which("nm") is None, reason="needs git and nm")


# --- plain-C++ parts of csrc/aiter, built for the host ----------------------------------------------------------




def select(driver: Path, family: str, table: Path, queries: list[tuple[int, int, int, int]]) -> list[dict]:
    text = "".join(f"{m} {n} {k} {cu}\n" for m, n, k, cu in queries)
    out = subprocess.run([str(driver), "select", family, str(table)], input=text, capture_output=True, text=True,
                         check=True).stdout
    return [json.loads(line) for line in out.splitlines()]


def test_argument_blocks_have_the_documented_layout(host_driver):
    # Compiling the driver already checked asm_kernel_args.h's static_asserts; these are aiter-abi.md's offsets.
    layout = json.loads(subprocess.run([str(host_driver), "layout"], capture_output=True, text=True,
                                       check=True).stdout)
    common = {"ptr_d": 0x00, "ptr_a": 0x20, "ptr_b": 0x30, "stride_a0": 0xA0, "m": 0xE0, "k": 0x100}
    assert layout["fp4"] == {**common, "ptr_c": 0x10, "alpha": 0x40, "beta": 0x50, "stride_d0": 0x60,
                             "stride_c0": 0x80, "stride_b0": 0xC0, "n": 0xF0, "ptr_scale_a": 0x110,
                             "ptr_scale_b": 0x120, "stride_scale_a0": 0x130, "stride_scale_b0": 0x150,
                             "log2_k_split": 0x170, "sizeof": 372}
    assert layout["bf16"] == {**common, "splitk": 0x110, "is_out_b16": 0x120, "ptr_bias": 0x130, "add_bias": 0x140,
                              "ptr_semaphore": 0x150, "sizeof": 352}


def _choice(tile, split, grid, out_rows):
    return {"tile": list(tile), "split": split, "grid": list(grid), "out_rows": out_rows}


def _summary(result: dict) -> dict:
    return {k: result[k] for k in ("tile", "split", "grid", "out_rows")} if "tile" in result else result


def test_fp4_selection(host_driver):
    # AITER's heuristic as gemm_a4w4 runs it: K is never split; the rows are walked in file order here (no arch).
    got = select(host_driver, "fp4", FIXTURES / "f4gemm_fixture.csv", [
        (8192, 8192, 8192, 256),  # 128x512: 1024 tiles = 4 full rounds; every other tile needs more rounds
        (8192, 8320, 8192, 256),  # N % 512 != 0 rules out 128x512; 192x256: 43*33 tiles = 6 rounds
        (32, 512, 16384, 256),  # one round for all; 192x256 comes later with fewer idle CUs than 32x128 and 64x256
        (33, 128, 256, 256),  # M = 33 -> 64 output rows; one tile of 192x256 idles the most CUs but is the most
        #                       efficient tile of the round, which AITER also accepts
        (4096, 4096, 4096, 80),  # an 80-CU part: 256 tiles of 128x512 = 4 rounds
    ])
    assert [_summary(r) for r in got] == [
        _choice((128, 512), 1, (16, 64, 1), 8192),
        _choice((192, 256), 1, (33, 43, 1), 8192),
        _choice((192, 256), 1, (2, 1, 1), 32),
        _choice((192, 256), 1, (1, 1, 1), 64),
        _choice((128, 512), 1, (8, 32, 1), 4096),
    ]
    # The non-pre-shuffled and the persistent rows are never taken.
    assert not any("noshuffle" in r["kernel"] or "persistent" in r["kernel"] for r in got)


def test_bf16_selection(host_driver):
    got = select(host_driver, "bf16", FIXTURES / "bf16gemm_fixture.csv", [
        (64, 64, 100, 304),  # K % 64 != 0
        (64, 96, 128, 304),  # no tile_N divides N
        (8192, 8192, 8192, 304),  # split-capable rows would need > 16*64 tiles: 256x256 without split
        (64, 256, 4096, 304),  # 8 tiles of 32x64: split = max(2, min(304/8, 16, 4096/64)) = 16
        (1, 64, 64, 304),  # K/subK = 1: no split; 32x64 pads M less than 64x64
        (65536, 32768, 64, 304),  # M*N = 2^31
        (48640, 64, 64, 304),  # 304 tiles of 160x64 fill one round: a bias-capable row serves a call without bias
    ])
    assert "multiple of 64" in got[0]["error"]
    assert "no BF16 GEMM kernel" in got[1]["error"]
    assert [_summary(r) for r in got[2:5]] == [
        _choice((256, 256), 1, (32, 32, 1), 8192),
        _choice((32, 64), 16, (4, 2, 16), 64),
        _choice((32, 64), 1, (1, 1, 1), 1),
    ]
    assert "2^31" in got[5]["error"]
    assert _summary(got[6]) == _choice((160, 64), 1, (1, 304, 1), 48640)
    # Pre-shuffled-B rows are never taken.
    assert not any("bshuffle" in r.get("kernel", "") for r in got)
    # A table from before subK existed: split-capable rows run unsplit.
    legacy = select(host_driver, "bf16", FIXTURES / "bf16gemm_legacy_fixture.csv", [(64, 256, 4096, 304)])
    assert _summary(legacy[0]) == _choice((32, 64), 1, (4, 2, 1), 64)


@pytest.mark.parametrize("text, message", [
    ("knl_name,co_name,tileM\nk,c.co,32\n", "no tile_N column"),
    ("knl_name,co_name,tileM,tileN\nk,c.co,32,x64\n", "must be a non-negative integer"),
    ("knl_name,co_name,tileM,tileN\nk,c.co,32,64,1\n", "fields but the header has 4"),
    ("knl_name,co_name,tileM,tileN\n,c.co,32,64\n", "must not be empty"),
    ("", "empty kernel table"),
    ("knl_name,co_name,tileM,tileN\nk,../../../outside.co,32,64\n", "must be a relative path inside"),
    ("knl_name,co_name,tileM,tileN\nk,/abs/k.co,32,64\n", "must be a relative path inside"),
    ("knl_name,co_name,tileM,tileN\nk,bf16gemm/./k.co,32,64\n", "must be a relative path inside"),
])
def test_malformed_tables_are_reported(host_driver, tmp_path, text, message):
    table = tmp_path / "table.csv"
    table.write_text(text)
    assert message in select(host_driver, "bf16", table, [])[0]["table_error"]


# --- manifest gating -------------------------------------------------------------------------------------------


def test_parse_archs():
    assert manifest.parse_archs("gfx950; gfx942,gfx942") == ("gfx942", "gfx950")
    for bad in ("", "sm_90", "gfx942;;x"):
        with pytest.raises(manifest.ManifestError):
            manifest.parse_archs(bad)


def test_config_hash_covers_files_and_settings(tmp_path):
    (tmp_path / "a.sh").write_text("one")
    first = manifest.config_hash(tmp_path, ["a.sh"], {"modules": ["x"]})
    assert first == manifest.config_hash(tmp_path, ["a.sh"], {"modules": ["x"]})
    assert first != manifest.config_hash(tmp_path, ["a.sh"], {"modules": ["y"]})
    (tmp_path / "a.sh").write_text("two")
    assert first != manifest.config_hash(tmp_path, ["a.sh"], {"modules": ["x"]})
    with pytest.raises(manifest.ManifestError, match="does not exist"):
        manifest.config_hash(tmp_path, ["missing.sh"], {})


@pytest.mark.parametrize("text, message", [
    ('{"schema": 1, "files": null}', "'files' must be an object"),
    ('{"schema": 1, "files": "x"}', "'files' must be an object"),
    ('{"schema": 1, "files": 3}', "'files' must be an object"),
    ('{"schema": 1, "files": {"a": 1}}', "'files' must be an object mapping paths to sha256 strings"),
    ('{"schema": 1, "gpu_archs": "gfx942"}', "'gpu_archs' must be a list of strings"),
    ('{"schema": 1, "provenance": [1]}', "'provenance' must be an object"),
    ("[" * 100000 + "]" * 100000, "unreadable: RecursionError"),
    ("{not json", "unreadable"),
])
def test_hostile_manifests_raise_manifest_errors(tmp_path, text, message):
    (tmp_path / manifest.FILE_NAME).write_text(text)
    with pytest.raises(manifest.ManifestError, match=re.escape(message)):
        manifest.read(tmp_path)


def test_a_symlink_in_the_stage_is_refused(tmp_path):
    """Files behind a symbolic link would escape the hashes: a stage must hold regular files only."""
    stage = tmp_path / "stage"
    (stage / "hsa").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "k.co").write_bytes(b"x")
    (stage / "hsa" / "gfx950").symlink_to(outside)
    with pytest.raises(manifest.ManifestError, match="is a symbolic link"):
        manifest.hash_tree(stage)


def test_manifest_gates_reuse(tmp_path):
    stage = tmp_path / "stage"
    (stage / "hsa/gfx950").mkdir(parents=True)
    (stage / "hsa/gfx950/k.co").write_bytes(b"code")
    (stage / "libmha_fwd.so").write_bytes(b"lib")
    key = manifest.BuildKey("a" * 40, ("gfx942", "gfx950"), "sha256:1")
    assert manifest.mismatches(stage, key) == [f"no manifest.json in {stage}"]
    written = manifest.write(stage, key, {"rocm_version": "7.1"})
    assert set(written["files"]) == {"hsa/gfx950/k.co", "libmha_fwd.so"}
    assert manifest.mismatches(stage, key) == []
    assert manifest.read(stage)["provenance"] == {"rocm_version": "7.1"}

    other_archs = manifest.BuildKey("a" * 40, ("gfx942",), "sha256:1")
    assert any(p.startswith("gpu_archs") for p in manifest.mismatches(stage, other_archs))
    other_commit = manifest.BuildKey("b" * 40, key.gpu_archs, "sha256:1")
    assert any(p.startswith("aiter_commit") for p in manifest.mismatches(stage, other_commit))
    other_config = manifest.BuildKey("a" * 40, key.gpu_archs, "sha256:2")
    assert any(p.startswith("config_hash") for p in manifest.mismatches(stage, other_config))

    (stage / "hsa/gfx950/k.co").write_bytes(b"patched")
    (stage / "extra.so").write_bytes(b"")
    (stage / "libmha_fwd.so").unlink()
    assert manifest.mismatches(stage, key) == ["extra.so: present but not recorded",
                                               "hsa/gfx950/k.co: contents changed since staging",
                                               "libmha_fwd.so: recorded but missing"]
    assert manifest.mismatches(stage, key, verify_files=False) == []
    (stage / manifest.FILE_NAME).write_text("{not json")
    assert "unreadable" in manifest.mismatches(stage, key)[0]


# --- a fake AITER checkout: interface checks, staging, reuse ----------------------------------------------------

_FAKE_CORE = textwrap.dedent('''
    """Stands in for aiter/jit/core.py: builds dummy libraries; the RMSNorm module exports the opus entry points."""
    import json, os, subprocess
    from pathlib import Path

    def get_user_jit_dir():
        return os.environ["AITER_JIT_DIR"]

    def get_args_of_build(name):
        return {"md_name": "", "srcs": [name], "verbose": False, "an_option_build_module_lacks": 1}

    def build_module(md_name, srcs, verbose):
        out = Path(os.environ["AITER_JIT_DIR"]) / (md_name + ".so")
        log = Path(os.environ["AITER_JIT_DIR"]) / "builds.jsonl"
        with open(log, "a") as f:
            f.write(json.dumps({"module": md_name, "archs": os.environ["GPU_ARCHS"],
                                "visible": os.environ.get("AITER_SYMBOL_VISIBLE")}) + "\\n")
        if md_name == "module_rmsnorm_opus":
            src = out.with_suffix(".c")
            src.write_text("void rms_norm_opus(void) {}\\nvoid add_rms_norm_opus(void) {}\\n")
            subprocess.run(["cc", "-shared", "-fPIC", str(src), "-o", str(out)], check=True)
        else:
            out.write_bytes(md_name.encode())
    ''')


def _opus_definition(name: str, params: tuple[str, ...]) -> str:
    types = {"epsilon": "float", "rows": "int", "hidden": "int", "in_s": "int", "dtype": "int",
             "model_sensitive": "int", "gemma": "int"}
    declared = [f"{types.get(p, 'size_t')} {p}" for p in params]
    # Comments with parentheses inside the parameter list, as AITER's entry file has them.
    declared[0] += " /* a pointer (as size_t) */"
    return f"OPUS_EXPORT void {name}({', '.join(declared)} // the stream (last)\n)\n{{\n}}\n"


def _pinned_abis() -> dict:
    """The argument lists of the pinned AITER's split-K code objects (tests/fixtures/aiter/e4048607.json)."""
    data = json.loads((FIXTURES / "e4048607.json").read_text())
    code_objects = data["code_objects"]
    return {"f4gemm": data["abis"][code_objects["gfx950/f4gemm/f4gemm_bf16_per1x32Fp4_BpreShuffle_256x256.co"]["abi"]],
            "bf16gemm": data["abis"][code_objects["gfx950/bf16gemm/bf16gemm_fp32bf16_tn_32x64_splitk_clean.co"]["abi"]]}


_PINNED_ABIS = _pinned_abis()


def _table_kernels(csv_path: Path) -> list[tuple[str, str]]:
    lines = [line.split(",") for line in csv_path.read_text().splitlines() if line.strip()]
    columns = [re.sub(r"[\s_]", "", c).lower() for c in lines[0]]
    return [(row[columns.index("coname")], row[columns.index("knlname")]) for row in lines[1:]]


def make_fake_aiter(root: Path, archs=("gfx942", "gfx950")) -> Path:
    (root / "aiter/jit").mkdir(parents=True)
    (root / "aiter/jit/core.py").write_text(_FAKE_CORE)
    config = {m: {"srcs": [f"f'{{AITER_CSRC_DIR}}/cpp_itfs/{m}.cu'"]} for m in build.MHA_MODULES}
    config["module_rmsnorm_opus"] = {"srcs": ["f'{AITER_CSRC_DIR}/kernels/rmsnorm_opus_entry.cu'"]}
    (root / "aiter/jit/optCompilerConfig.json").write_text(json.dumps(config))
    (root / "csrc/include").mkdir(parents=True)
    for header, struct, members in (("mha_fwd.h", "mha_fwd_args", build.MHA_FWD_MEMBERS),
                                    ("mha_bwd.h", "mha_bwd_args", build.MHA_BWD_MEMBERS)):
        body = "".join(f"    int {m};\n" for m in members)
        (root / "csrc/include" / header).write_text(f"namespace aiter {{\nstruct {struct}\n{{\n{body}}};\n}}\n")
    (root / "csrc/kernels").mkdir()
    (root / "csrc/kernels/rmsnorm_opus_entry.cu").write_text(
        "".join(_opus_definition(n, p) for n, p in build.RMSNORM_SIGNATURES.items()))
    tables = {"bf16gemm": FIXTURES / "bf16gemm_fixture.csv", "f4gemm": FIXTURES / "f4gemm_fixture.csv"}
    for family, (table, family_archs, _) in build.GEMM_FAMILIES.items():
        for arch in set(archs) & set(family_archs):
            folder = root / "hsa" / arch / family
            folder.mkdir(parents=True)
            shutil.copy(tables[family], folder / table)
            for co, kernel in _table_kernels(folder / table):
                abi = _PINNED_ABIS[family]
                write_code_object(folder / co, kernel, abi["args"], abi["kernarg_segment_size"])
            (folder / "src").mkdir()
            (folder / "src/build.sh").write_text("# kernel sources are not staged\n")
    for arch in archs:
        (root / "hsa" / arch / "fmha_v3_fwd").mkdir(parents=True)
        (root / "hsa" / arch / "fmha_v3_fwd" / "fwd_hd128_bf16.co").write_bytes(b"mha")
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "fake aiter"], check=True)
    return root


@needs_git
def test_interface_check_accepts_the_documented_interface_and_names_each_difference(tmp_path):
    aiter = make_fake_aiter(tmp_path / "aiter")
    assert build.check_interface(aiter, ("gfx942", "gfx950")) == []

    header = aiter / "csrc/include/mha_bwd.h"
    header.write_text(header.read_text().replace("    int workspace_alloc;\n", ""))
    entry = aiter / "csrc/kernels/rmsnorm_opus_entry.cu"
    entry.write_text(entry.read_text().replace("size_t in,", "size_t input,", 1))
    table = aiter / "hsa/gfx950/f4gemm/f4gemm_bf16_per1x32Fp4.csv"
    table.write_text(table.read_text().replace("bpreshuffle", "b_shuffled"))
    (aiter / "hsa/gfx942/bf16gemm/bf16gemm_fixture_256x256.co").unlink()
    problems = build.check_interface(aiter, ("gfx942", "gfx950"))
    assert len(problems) == 4, problems
    assert "mha_bwd_args lacks members ['workspace_alloc']" in problems
    assert any(p.startswith("rms_norm_opus takes ('out', 'input',") for p in problems)
    assert any("f4gemm_bf16_per1x32Fp4.csv lacks columns ['bpreshuffle']" in p for p in problems)
    assert any("names bf16gemm_fixture_256x256.co, which does not exist" in p for p in problems)


@needs_git
@pytest.mark.parametrize("co_name", ["../../../outside.co", "/abs/outside.co", "bf16gemm/./k.co"])
def test_interface_check_refuses_code_object_names_outside_the_tree(tmp_path, co_name):
    """A table row whose co_name leaves the asset folder is refused by the build's interface check with the
    validator's own check (jax-aiter check-aiter; the launcher refuses it too), even when the file it would
    name exists."""
    aiter = make_fake_aiter(tmp_path / "aiter")
    table = aiter / "hsa/gfx942/bf16gemm/bf16gemm_fp32bf16.csv"
    first_co = _table_kernels(table)[0][0]
    table.write_text(table.read_text().replace(first_co, co_name, 1))
    (tmp_path / "outside.co").write_bytes(b"x")  # what ../../../outside.co resolves to from the table's folder
    assert (table.parent.parent / "../../../outside.co").resolve() == (tmp_path / "outside.co").resolve()
    refused = validate.asset_name_problem(co_name)
    assert refused == f"co_name {co_name!r} is not a relative path inside the asset folder (the launcher refuses it)"
    problems = build.check_interface(aiter, ("gfx942", "gfx950"))
    assert problems == [f"hsa/gfx942/bf16gemm/bf16gemm_fp32bf16.csv: {refused}"]
    assert validate.check_table("t.csv", "bf16gemm", validate.read_table(table))[0] == [f"t.csv:2: {refused}"]


@needs_git
def test_stage_builds_reuses_and_refuses(tmp_path, monkeypatch):
    monkeypatch.setattr(validate, "find_objdump", lambda: None)  # the written code objects carry no machine code
    aiter = make_fake_aiter(tmp_path / "aiter")
    stage_dir, jit_dir = tmp_path / "stage", tmp_path / "jit"
    archs = ("gfx942", "gfx950")
    head = subprocess.run(["git", "-C", str(aiter), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()

    assert build.stage(aiter, stage_dir, jit_dir, archs, pinned=head, reuse_only=False) == "built"
    data = manifest.read(stage_dir)
    assert data["aiter_commit"] == head and data["gpu_archs"] == list(archs)
    assert data["validated"] == {"aiter_commit": head, "problems": 0, "kernarg_loads_checked": False}
    assert {"libmha_fwd.so", "libmha_bwd.so", "libaiter_rmsnorm.so", "hsa/gfx950/f4gemm/f4gemm_bf16_per1x32Fp4.csv",
            "hsa/gfx942/bf16gemm/bf16gemm_fixture_32x64_splitk.co",
            "hsa/gfx950/fmha_v3_fwd/fwd_hd128_bf16.co"} <= set(data["files"])
    assert not any("/src/" in f or f.startswith("hsa/gfx942/f4gemm") for f in data["files"])
    builds = [json.loads(line) for line in (jit_dir / "builds.jsonl").read_text().splitlines()]
    assert [b["module"] for b in builds] == ["libmha_fwd", "libmha_bwd", "module_rmsnorm_opus"]
    assert all(b["archs"] == "gfx942;gfx950" and b["visible"] == "1" for b in builds)
    assert set(build.RMSNORM_SIGNATURES) <= build._exported_symbols(stage_dir / "libaiter_rmsnorm.so")

    assert build.stage(aiter, stage_dir, jit_dir, archs, pinned=head, reuse_only=True) == "reused"
    assert build.check(aiter, stage_dir, archs, pinned=head) == []
    with pytest.raises(build.BuildError, match="gpu_archs"):
        build.stage(aiter, stage_dir, jit_dir, ("gfx950",), pinned=head, reuse_only=True)
    with pytest.raises(build.BuildError, match="the project pins " + "0" * 40):
        build.stage(aiter, stage_dir, jit_dir, archs, pinned="0" * 40, reuse_only=False)

    # A locally modified checkout is a different build input, and so is a tampered stage.
    config = aiter / "aiter/jit/optCompilerConfig.json"
    config.write_text(config.read_text() + " ")
    assert [p.split(":")[0] for p in build.check(aiter, stage_dir, archs, pinned=head)] == ["aiter_commit"]
    subprocess.run(["git", "-C", str(aiter), "checkout", "-q", "--", "."], check=True)
    (stage_dir / "libmha_bwd.so").write_bytes(b"tampered")
    assert build.check(aiter, stage_dir, archs, pinned=head) == ["libmha_bwd.so: contents changed since staging"]
    assert build.stage(aiter, stage_dir, jit_dir, archs, pinned=head, reuse_only=False) == "built"
    assert build.check(aiter, stage_dir, archs, pinned=head) == []


def test_every_build_entry_skips_without_the_checkout(tmp_path, capsys):
    assert build.main(["stage", "--aiter", str(tmp_path / "absent")]) == 0
    assert "AITER bridge skipped" in capsys.readouterr().out
    if not build.checkout_present(REPO / build.SUBMODULE):
        script = subprocess.run(["bash", str(REPO / "scripts/build-aiter.sh")], capture_output=True, text=True)
        assert script.returncode == 0 and "AITER bridge skipped" in script.stdout


def test_standin_headers_and_build_check_list_exactly_what_mha_cc_sets():
    source = (REPO / "csrc/aiter/mha.cc").read_text()
    forward, backward = source.split("ffi::Error MhaBackward(")
    for part, members, header in ((forward, build.MHA_FWD_MEMBERS, "mha_fwd.h"),
                                  (backward, build.MHA_BWD_MEMBERS, "mha_bwd.h")):
        assigned = set(re.findall(r"\bargs\.(\w+)\s*=", part))
        assert assigned == set(members)
        declared = (FIXTURES / "api_standin" / header).read_text()
        assert all(re.search(rf"\b{m}\b", declared) for m in members)


def _layout_tool():
    spec = importlib.util.spec_from_file_location("aiter_api_layout", REPO / "tools" / "aiter_api_layout.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@needs_cxx
def test_standin_declarations_have_the_real_layout_at_the_pin():
    # The stand-ins, compiled on the host, against the layout tools/aiter_api_layout.py recorded from AITER's own
    # headers at the pinned commit: every member mha.cc sets (offset, size, type), every stream_config member
    # (and its default), the structs' sizes and the entry points' types.
    tool = _layout_tool()
    recorded = json.loads(tool.FIXTURE.read_text())
    assert recorded["provenance"]["aiter_commit"] == tool.AITER_COMMIT
    assert tool.differences(tool.standin_layout(CXX), recorded) == []
    fwd, bwd = tool.used_members()
    assert set(recorded["structs"]["aiter::mha_fwd_args"]["members"]) == set(fwd) == set(build.MHA_FWD_MEMBERS)
    assert set(recorded["structs"]["aiter::mha_bwd_args"]["members"]) == set(bwd) == set(build.MHA_BWD_MEMBERS)


# --- registration, supports, lowering for ROCm ------------------------------------------------------------------


def _aiter(op: str) -> _backend.Implementation:
    return next(i for i in _backend.implementations(op) if i.name == "aiter")


@pytest.mark.parametrize("op, library", [("gemm", "aiter"), ("gemm_fp4", "aiter"), ("rms_norm", "aiter"),
                                         ("rms_norm_with_add", "aiter"), ("flash_attn", "aiter_mha"),
                                         ("flash_attn_varlen", "aiter_mha")])
def test_registered_for_rocm_first(op, library):
    impls = _backend.implementations(op)
    assert impls[0].name == "aiter" and impls[0].platforms == ("rocm",) and impls[0].library_for("rocm") == library


def test_registration_does_not_depend_on_import_order():
    code = ("import importlib, sys\n"
            "for m in sys.argv[1:]: importlib.import_module(m)\n"
            "from jax_aiter import _backend\n"
            "print(sorted(op for op in _backend.defined_ops()\n"
            "             if any(i.name == 'aiter' for i in _backend.implementations(op))))")
    out = subprocess.run([sys.executable, "-c", code, "jax_aiter.aiter.gemm", "jax_aiter.mha._aiter", "jax_aiter.mha",
                          "jax_aiter.gemm", "jax_aiter.aiter.rmsnorm", "jax_aiter.rmsnorm"],
                         capture_output=True, text=True, cwd=REPO, check=True).stdout
    assert out.split("\n")[-2] == str(sorted(["flash_attn", "flash_attn_varlen", "gemm", "rms_norm",
                                              "rms_norm_with_add"]))


def _sds(shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype)


def test_supports_reasons():
    bf16, f16 = jnp.bfloat16, jnp.float16
    gemm_ok = _aiter("gemm").supports
    assert gemm_ok(_sds((8, 128), bf16), _sds((64, 128), bf16)) is None
    assert "bfloat16 only" in gemm_ok(_sds((8, 128), f16), _sds((64, 128), f16))
    assert "multiple of 64" in gemm_ok(_sds((8, 96), bf16), _sds((64, 96), bf16))
    assert "N = 96" in gemm_ok(_sds((8, 128), bf16), _sds((96, 128), bf16))
    assert "2^31" in gemm_ok(_sds((2**16, 64), bf16), _sds((2**15, 64), bf16))
    norm_ok = _aiter("rms_norm").supports
    assert "gamma" in norm_ok(_sds((4, 64), bf16), _sds((64,), jnp.float32), epsilon=1e-6)
    attn = _aiter("flash_attn").supports
    q = _sds((1, 16, 4, 128), bf16)
    options = AttentionOptions(softmax_scale=0.1, window=(-1, -1), has_bias=False, has_alibi=False, dropout_p=0.0,
                               deterministic=True, return_lse=False)
    assert attn(q, q, q, options=options) is None
    assert "float16" in attn(_sds((1, 16, 4, 128), jnp.float32), q, q, options=options)
    assert "bias" in attn(q, q, q, options=dataclasses.replace(options, has_bias=True))
    assert "Philox" in attn(q, q, q, options=dataclasses.replace(options, dropout_p=0.1))
    assert "head dim 320" in attn(_sds((1, 16, 4, 320), bf16), _sds((1, 16, 4, 320), bf16), q, options=options)


def test_supports_judges_the_local_device(monkeypatch):
    monkeypatch.setattr(_support, "local_arch", lambda: "gfx942")
    monkeypatch.setattr(_support, "staged_archs", lambda: ("gfx942",))
    fp4 = _aiter("gemm_fp4").supports
    assert fp4(None, None, None, None) == "AITER has these kernels for gfx950 only, this device is gfx942"
    assert _aiter("gemm").supports(_sds((8, 128), jnp.bfloat16), _sds((64, 128), jnp.bfloat16)) is None
    monkeypatch.setattr(_support, "local_arch", lambda: "gfx950")
    assert "built for gfx942, this device is gfx950" in fp4(None, None, None, None)
    monkeypatch.setattr(_support, "local_arch", lambda: "gfx90a")
    assert "gfx942, gfx950 only" in _support.arch_problem()


def test_device_arch_from_jax_device_attributes():
    class Device:
        def __init__(self, **attrs):
            self.__dict__.update(attrs)

    assert _support.arch_of(Device(compute_capability="gfx950", device_kind="AMD Instinct MI355X")) == "gfx950"
    assert _support.arch_of(Device(compute_capability="", device_kind="AMD Instinct MI300X")) == "gfx942"
    assert _support.arch_of(Device(device_kind="gfx942:sramecc+:xnack-")) == "gfx942"
    assert _support.arch_of(Device(device_kind="Radeon")) is None


@pytest.fixture
def aiter_loaded(monkeypatch):
    """This process as if the AITER bridge library had loaded on a gfx942 machine."""
    targets = tuple(value for name, value in vars(jax_aiter.aiter).items() if name.isupper() and "LIBRARY" not in name)
    loaded = _native.LoadedLibrary("aiter", Path("/fake/libjax_aiter_aiter.so"), targets=targets)
    real_load = _native.load
    monkeypatch.setattr(_native, "load", lambda name: loaded if name.startswith("aiter") else real_load(name))
    monkeypatch.setattr(_support, "local_arch", lambda: "gfx942")
    monkeypatch.setattr(_support, "staged_archs", lambda: ("gfx942", "gfx950"))


@pytest.mark.usefixtures("automatic_selection")
def test_info_reports_aiter_choices_and_reasons(aiter_loaded):
    assert "ja_aiter_mha_varlen_bwd" in vars(jax_aiter.aiter).values()
    choices = {(c.op, c.platform): c for c in _backend.report(("rocm",))}
    for op in ("gemm", "flash_attn", "flash_attn_varlen"):
        assert choices[(op, "rocm")].selected == "aiter", op
    fp4 = choices[("gemm_fp4", "rocm")]
    assert fp4.selected == "xla"
    assert ("aiter", "AITER has these kernels for gfx950 only, this device is gfx942") in fp4.rejected
    for op in ("rms_norm", "rms_norm_with_add"):  # the typical call is bfloat16: see the test below
        assert choices[(op, "rocm")].selected != "aiter"
        assert choices[(op, "rocm")].rejected[0] == ("aiter", _aiter(op).forced_only(
            _sds((8, 64), jnp.bfloat16), _sds((64,), jnp.bfloat16), epsilon=1e-6))


@pytest.mark.usefixtures("automatic_selection")
@pytest.mark.parametrize("op", ["rms_norm", "rms_norm_with_add"])
def test_aiter_rms_norm_is_taken_unforced_for_float16_only(aiter_loaded, op):
    """AITER's RMSNorm sums a row's squares in float32 unscaled: a bfloat16 or float32 row whose sum overflows
    (elements around 2^64 / sqrt(H) and beyond) would come out as zeros, where the op's contract is exact for every
    finite input. Unforced, the selection gives such calls to the next implementation and says why; float16
    (65504^2 * 2^31 < 2^128) keeps AITER. Forced, AITER runs any dtype (test_lower_rms_norm)."""
    fn = {"rms_norm": functools.partial(rms_norm, epsilon=1e-6),
          "rms_norm_with_add": functools.partial(rms_norm_with_add, epsilon=1e-6)}[op]
    for dtype in (jnp.float16, jnp.bfloat16, jnp.float32):
        x, g = _sds((4, 256), dtype), _sds((256,), dtype)
        args = (x, g) if op == "rms_norm" else (x, x, g)
        chosen = _backend.select(op, "rocm", args, {"epsilon": 1e-6})
        targets = [c["target"] for c in lower_for_rocm(fn, *args)]
        if dtype == jnp.float16:
            assert chosen.name == "aiter" and targets and all(t.startswith("ja_aiter_") for t in targets)
            assert _aiter(op).forced_only(*args, epsilon=1e-6) is None
        else:
            assert chosen.name != "aiter" and not any(t.startswith("ja_aiter_") for t in targets), (dtype, targets)
            reason = _aiter(op).forced_only(*args, epsilon=1e-6)
            assert f"{jnp.dtype(dtype).name} rows whose sum of squares overflows" in reason
            assert "only when forced" in reason


def test_forcing_aiter_on_an_unsupported_call_names_the_reason():
    a = _sds((8, 128), jnp.float16)
    with jax_aiter.use_backend(gemm="aiter"), pytest.raises(ValueError, match="bfloat16 only"):
        jax.jit(gemm).trace(a, _sds((64, 128), jnp.float16)).lower(lowering_platforms=("rocm",))


_CALL = re.compile(r"stablehlo\.custom_call @(\w+)\((.*?)\) \{(.*?)\} : \((.*?)\) -> (.*)")


def lower_for_rocm(fn, *args, **forced) -> list[dict]:
    """The custom calls of ``fn`` lowered for ROCm with ``forced`` implementations."""
    with jax_aiter.use_backend(**forced):
        text = jax.jit(fn).trace(*args).lower(lowering_platforms=("rocm",)).as_text()
    calls = []
    for line in text.splitlines():
        if match := _CALL.search(line):
            target, _, attrs, operands, results = match.groups()
            config = re.search(r"mhlo\.backend_config = \{(.*?)\}", attrs)
            calls.append({"target": target, "attrs": config.group(1) if config else "", "operands": operands,
                          "results": results})
    return calls


def test_lower_gemm():
    a, b = _sds((2, 4, 128), jnp.bfloat16), _sds((64, 128), jnp.bfloat16)
    # M = 8 < 256: A travels zero-padded to 256 rows; out is float32, rounded by XLA; the semaphore is scratch.
    (call,) = lower_for_rocm(gemm, a, b, gemm="aiter")
    assert call["target"] == "ja_aiter_gemm_bf16"
    assert call["operands"] == "tensor<256x128xbf16>, tensor<64x128xbf16>"
    assert call["results"] == "(tensor<8x64xf32>, tensor<16x64xui32>)"
    big = lower_for_rocm(gemm, _sds((512, 128), jnp.bfloat16), b, gemm="aiter")[0]
    assert big["operands"] == "tensor<512x128xbf16>, tensor<64x128xbf16>"
    # Differentiable: the forward is AITER's, the backward XLA's dots.
    loss = lambda a, b: gemm(a, b).astype(jnp.float32).sum()  # noqa: E731
    targets = [c["target"] for c in lower_for_rocm(jax.value_and_grad(loss, argnums=(0, 1)), a, b, gemm="aiter")]
    assert targets == ["ja_aiter_gemm_bf16"]


def test_lower_rms_norm():
    x, g = _sds((3, 5, 256), jnp.bfloat16), _sds((256,), jnp.bfloat16)
    (call,) = lower_for_rocm(functools.partial(rms_norm, epsilon=1e-5), x, g, rms_norm="aiter")
    assert call["target"] == "ja_aiter_rms_norm_fwd"
    assert call["attrs"] == "epsilon = 9.99999974E-6 : f32"
    assert call["results"] == "tensor<3x5x256xbf16>"
    (call,) = lower_for_rocm(rms_norm_with_add, x, x, g, rms_norm_with_add="aiter")
    assert call["target"] == "ja_aiter_add_rms_norm_fwd"
    assert call["results"] == "(tensor<3x5x256xbf16>, tensor<3x5x256xbf16>)"
    # Differentiable: the forward is AITER's, the backward the reference's autodiff.
    loss = lambda x, g: (rms_norm(x, g).astype(jnp.float32) ** 2).sum()  # noqa: E731
    assert [c["target"] for c in lower_for_rocm(jax.value_and_grad(loss, argnums=(0, 1)), x, g,
                                                rms_norm="aiter")] == ["ja_aiter_rms_norm_fwd"]


def test_lower_gemm_fp4():
    m, n, k = 40, 64, 128
    a = jnp.zeros((m, k // 2), jnp.uint8)
    b = jnp.zeros((n, k // 2), jnp.uint8)
    a_scale, b_scale = jnp.zeros((256, 8), jnp.uint8), jnp.zeros((256, 8), jnp.uint8)
    (call,) = lower_for_rocm(gemm_fp4, a, b, a_scale, b_scale, gemm_fp4="aiter")
    assert call["target"] == "ja_aiter_gemm_fp4"
    assert call["operands"] == "tensor<40x64xui8>, tensor<64x64xui8>, tensor<256x8xui8>, tensor<256x8xui8>"
    assert call["results"] == "tensor<64x64xbf16>"  # ceil(40/32)*32 rows, sliced to 40 afterwards


def test_lower_gemm_fp4_with_a_plain_b_hands_aiter_the_shuffled_b(monkeypatch):
    """The linear's residual copies reach gemm_fp4_plain_b unshuffled; AITER's kernel gets them shuffled and
    padded: the same operand shapes as gemm_fp4's, and (the FFI call replaced by one that records its operands,
    run on the CPU) the bytes of the reference's shuffle."""
    m, n, k = 40, 64, 128
    rng = np.random.default_rng(5)
    a, a_scale = jnp.zeros((m, k // 2), jnp.uint8), jnp.zeros((256, 8), jnp.uint8)
    b = jnp.asarray(rng.integers(0, 256, (n, k // 2), dtype=np.uint8))
    b_scale = jnp.asarray(rng.integers(100, 150, (n, k // 32), dtype=np.uint8))
    (call,) = lower_for_rocm(gemm_fp4_plain_b, a, b, a_scale, b_scale, gemm_fp4="aiter")
    assert call["target"] == "ja_aiter_gemm_fp4"
    assert call["operands"] == "tensor<40x64xui8>, tensor<64x64xui8>, tensor<256x8xui8>, tensor<256x8xui8>"

    handed = []

    def recording_call(target, out, **_):
        def call(*operands):
            handed.extend(operands)
            return jnp.zeros(out.shape, out.dtype)
        return call

    monkeypatch.setattr(jax.ffi, "ffi_call", recording_call)
    aiter_gemm_fp4.gemm_fp4(a, b, a_scale, b_scale, b_layout="plain")
    np.testing.assert_array_equal(handed[1], mxfp4_ref.shuffle_fp4(b))
    np.testing.assert_array_equal(handed[3], mxfp4_ref.shuffle_scales(b_scale))


def _attention_calls(fn, *args):
    return lower_for_rocm(fn, *args, flash_attn="aiter", flash_attn_varlen="aiter")


def test_lower_flash_attn_forward_and_backward():
    q, kv = _sds((2, 64, 8, 128), jnp.bfloat16), _sds((2, 80, 2, 128), jnp.bfloat16)

    def loss(q, k, v):
        return flash_attn_func(q, k, v, causal=True, window_size=(32, -1),
                               deterministic=True).astype(jnp.float32).sum()

    fwd, bwd = _attention_calls(jax.value_and_grad(loss, argnums=(0, 1, 2)), q, kv, kv)
    assert fwd["target"] == "ja_aiter_mha_fwd"
    assert fwd["attrs"] == "softmax_scale = 0.0883883461 : f32, window_left = 32 : i32, window_right = 0 : i32"
    assert fwd["results"] == "(tensor<2x64x8x128xbf16>, tensor<2x8x64xf32>)"
    assert bwd["target"] == "ja_aiter_mha_bwd"
    assert bwd["attrs"] == ("deterministic = true, softmax_scale = 0.0883883461 : f32, window_left = 32 : i32, "
                            "window_right = 0 : i32")
    # GQA: dK and dV come back per query head (8), summed over each group of 4 afterwards.
    assert bwd["results"] == ("(tensor<2x64x8x128xbf16>, tensor<2x80x8x128xbf16>, tensor<2x80x8x128xbf16>, "
                              "tensor<2x8x64xf32>)")


def test_lower_flash_attn_varlen_forward_and_backward():
    q, kv, cu = _sds((100, 8, 64), jnp.float16), _sds((120, 8, 64), jnp.float16), _sds((4,), jnp.int32)

    def loss(q, k, v, cu_q, cu_k):
        out, lse = flash_attn_varlen(q, k, v, cu_q, cu_k, 48, 64, return_lse=True)  # default: deterministic=False
        return out.astype(jnp.float32).sum() + jnp.where(jnp.isfinite(lse), lse, 0).sum()

    calls = _attention_calls(jax.value_and_grad(loss, argnums=(0, 1, 2)), q, kv, kv, cu, cu)
    fwd = next(c for c in calls if c["target"] == "ja_aiter_mha_varlen_fwd")
    bwd = next(c for c in calls if c["target"] == "ja_aiter_mha_varlen_bwd")
    assert fwd["attrs"] == ("max_seqlen_k = 64 : i32, max_seqlen_q = 48 : i32, softmax_scale = 1.250000e-01 : f32, "
                            "window_left = -1 : i32, window_right = -1 : i32")
    assert fwd["results"] == "(tensor<100x8x64xf16>, tensor<8x100xf32>)"
    assert "deterministic = false" in bwd["attrs"]
    assert bwd["operands"].count("tensor<4xi32>") == 2


def test_export_mxfp4_training_step_for_rocm():
    x, w = _sds((100, 256), jnp.bfloat16), _sds((128, 256), jnp.bfloat16)

    def step(x, w):
        def loss(x, w):
            return jnp.mean(gemm_fp4_bf16(x, w).astype(jnp.float32) ** 2)

        value, (dx, dw) = jax.value_and_grad(loss, argnums=(0, 1))(x, w)
        return value, dx, w - 0.01 * dw

    with jax_aiter.use_backend(gemm_fp4="aiter"):
        exported = jax_aiter.export(step, platforms=["rocm"])(x, w)
    assert exported.platforms == ("rocm",)
    text = exported.mlir_module()
    assert len(re.findall(r"custom_call @ja_aiter_gemm_fp4\b", text)) == 3  # fprop, dgrad, wgrad
    restored = jax.export.deserialize(exported.serialize())
    assert restored.platforms == ("rocm",)
    assert [a.shape for a in restored.out_avals] == [(), (100, 256), (128, 256)]
