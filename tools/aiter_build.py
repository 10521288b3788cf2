"""Build and stage what the AITER bridge needs from the pinned AITER checkout (``third_party/aiter``).

``python tools/aiter_build.py stage`` (run by ``scripts/build-aiter.sh`` on a ROCm machine):

1. finds the checkout and its commit, which must be the commit the project pins (the submodule gitlink);
2. checks the interfaces the bridge was written against, at that commit: kernel-table columns and code objects,
   the members of ``aiter::mha_fwd_args`` / ``mha_bwd_args`` that csrc/aiter/mha.cc sets, the opus RMSNorm C
   signatures, the JIT modules. A mismatch stops here with the list, before hours of compiling;
3. builds AITER's JIT modules ``libmha_fwd``, ``libmha_bwd`` and the module holding the opus RMSNorm with
   AITER's own build entry (``aiter/jit/core.py``: ``get_args_of_build`` + ``build_module``) for GPU_ARCHS;
4. stages the libraries and, per architecture, the ASM code objects and kernel tables the bridge loads, then
   writes the manifest (:mod:`jax_aiter.aiter.manifest`).

An existing stage whose manifest matches (commit, architectures, configuration hash, file hashes) is reused;
otherwise it is rebuilt, or, with ``--reuse-only``, the command fails. ``check`` answers whether a stage may be
used (CMake runs it). The tool is part of the source checkout, not of the installed package; manifests are read
and written by :mod:`jax_aiter.aiter.manifest`, which the runtime uses too. Layout of a stage, installed as
``jax_aiter/lib/aiter``::

    manifest.json  libmha_fwd.so  libmha_bwd.so  libaiter_rmsnorm.so
    hsa/<arch>/{bf16gemm,f4gemm,fmha_v3_*}/...
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

if __name__ == "__main__":
    # As a script, Python puts tools/ first on sys.path; the manifest module is the checkout's own.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jax_aiter.aiter import manifest, validate  # noqa: E402


def checkout_root() -> Path:
    """The jax-aiter source checkout the build runs in (scripts/build-aiter.sh starts from its top directory).

    The current directory, not this file's location: the tool works on the checkout it is started in."""
    return Path.cwd()


SUBMODULE = "third_party/aiter"
# What defines a staged build besides AITER's commit and the architectures; editing any of these rebuilds.
CONFIG_FILES = ("scripts/build-aiter.sh", "tools/aiter_build.py", "jax_aiter/aiter/manifest.py")

# AITER JIT modules -> the file name they are staged under.
MHA_MODULES = {"libmha_fwd": "libmha_fwd.so", "libmha_bwd": "libmha_bwd.so"}
RMSNORM_LIBRARY = "libaiter_rmsnorm.so"  # csrc/aiter/rmsnorm.cc opens this name
# The opus RMSNorm C entry points and their parameters, in order, as csrc/aiter/rmsnorm.cc declares them.
RMSNORM_SIGNATURES = {
    "rms_norm_opus": ("out", "in", "weight", "epsilon", "rows", "hidden", "in_s", "dtype", "model_sensitive",
                      "gemma", "stream"),
    "add_rms_norm_opus": ("out", "in", "residual_in", "residual_out", "weight", "epsilon", "rows", "hidden",
                          "in_s", "dtype", "model_sensitive", "gemma", "stream"),
}
# ASM GEMM families: kernel table, the architectures AITER ships them for, and the columns the selection cannot
# do without (normalized: lower case, no underscores; csrc/aiter/kernel_table.cc reads absent optional columns
# such as splitK or subK as 0, which only forgoes split-K). The FP4 handler needs pre-shuffled rows.
GEMM_FAMILIES = {
    "bf16gemm": ("bf16gemm_fp32bf16.csv", ("gfx942", "gfx950"), ("knlname", "coname", "tilem", "tilen")),
    "f4gemm": ("f4gemm_bf16_per1x32Fp4.csv", ("gfx950",), ("knlname", "coname", "tilem", "tilen", "bpreshuffle")),
}
MHA_ASM_PREFIX = "fmha_v3_"  # code-object families libmha_fwd / libmha_bwd load at run time
# Members csrc/aiter/mha.cc sets (tests/fixtures/aiter/api_standin declares exactly these).
MHA_FWD_MEMBERS = (
    "use_asm_v3", "v3_api_check", "how_v3_bf16_cvt", "data_type", "is_group_mode", "bias_type", "has_lse",
    "qscale_type", "q_ptr", "k_ptr", "v_ptr", "lse_ptr", "o_ptr", "seqstart_q_ptr", "seqstart_k_ptr", "seqlen_q",
    "seqlen_k", "batch", "max_seqlen_q", "hdim_q", "hdim_v", "nhead_q", "nhead_k", "scale_s", "logits_soft_cap",
    "stride_q", "stride_k", "stride_v", "stride_o", "nhead_stride_q", "nhead_stride_k", "nhead_stride_v",
    "nhead_stride_lse", "nhead_stride_o", "batch_stride_q", "batch_stride_k", "batch_stride_v",
    "batch_stride_lse", "batch_stride_o", "window_size_left", "window_size_right", "mask_type", "p_drop",
    "s_randval", "drop_seed_offset")
MHA_BWD_MEMBERS = (
    "use_asm_v3", "v3_atomic_fp32", "v3_bf16_cvt", "v3_api_check", "hdim_q", "hdim_v", "data_type",
    "is_group_mode", "mask_type", "bias_type", "has_dbias", "has_dropout", "is_store_randval", "is_deterministic",
    "q_ptr", "k_ptr", "v_ptr", "o_ptr", "lse_ptr", "do_ptr", "d_ptr", "dq_ptr", "dk_ptr", "dv_ptr",
    "seqstart_q_ptr", "seqstart_k_ptr", "seqlen_q", "seqlen_k", "batch", "max_seqlen_q", "max_seqlen_k", "nhead_q",
    "nhead_k", "scale", "stride_q", "stride_k", "stride_v", "stride_o", "stride_do", "stride_dq", "stride_dk",
    "stride_dv", "nhead_stride_q", "nhead_stride_k", "nhead_stride_v", "nhead_stride_o", "nhead_stride_do",
    "nhead_stride_lsed", "nhead_stride_dq", "nhead_stride_dk", "nhead_stride_dv", "batch_stride_q",
    "batch_stride_k", "batch_stride_v", "batch_stride_o", "batch_stride_do", "batch_stride_lsed",
    "batch_stride_dq", "batch_stride_dk", "batch_stride_dv", "window_size_left", "window_size_right", "p_drop",
    "p_undrop", "drop_seed_offset", "workspace_alloc", "pinned_host_alloc")
# Build settings that are part of the configuration hash.
BUILD_ENV = {"AITER_SYMBOL_VISIBLE": "1"}


class BuildError(RuntimeError):
    """The build cannot go on; the message says why and what to do."""


def settings() -> dict:
    return {"mha_modules": MHA_MODULES, "rmsnorm": [RMSNORM_LIBRARY, RMSNORM_SIGNATURES],
            "gemm_families": GEMM_FAMILIES, "mha_asm_prefix": MHA_ASM_PREFIX, "env": BUILD_ENV}


def checkout_present(aiter: Path) -> bool:
    return (aiter / "aiter" / "jit" / "core.py").is_file() and (aiter / "hsa").is_dir()


def _git(cwd: Path, *args: str) -> str:
    result = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise BuildError(f"git {' '.join(args)} in {cwd} failed: {result.stderr.strip()}")
    return result.stdout.strip()


def pinned_commit() -> str:
    """The commit this project pins for the submodule: its gitlink in a git checkout; in a source archive, which has
    none (the sdist the conda recipe builds from), the commit the runtime validates assets against,
    ``manifest.PINNED_AITER_COMMIT`` (tests keep the two equal)."""
    try:
        line = _git(checkout_root(), "ls-files", "--stage", "--", SUBMODULE)
    except BuildError:
        line = ""
    fields = line.split()
    return fields[1] if len(fields) >= 2 and fields[0] == "160000" else manifest.PINNED_AITER_COMMIT


def aiter_commit(aiter: Path, pinned: str | None) -> str:
    """The checkout's commit, refused when it is not the pinned one; local edits make it ``<sha>+dirty.<hash>``.

    A checkout without git metadata is taken to be the pinned commit: it is a copy made by a tool that fetched
    exactly that commit (the conda recipe's git source, whose ``rev`` is the pinned commit)."""
    if pinned is not None and not (aiter / ".git").exists():
        return pinned
    head = _git(aiter, "rev-parse", "HEAD")
    if pinned is not None and head != pinned:
        raise BuildError(f"{aiter} is at {head} but the project pins {pinned}: run "
                         f"`git submodule update --init --recursive {SUBMODULE}`")
    if _git(aiter, "status", "--porcelain", "--untracked-files=no"):
        diff = subprocess.run(["git", "-C", str(aiter), "diff", "HEAD"], capture_output=True).stdout
        return f"{head}+dirty.{hashlib.sha256(diff).hexdigest()[:16]}"
    return head


def build_key(aiter: Path, archs: Sequence[str], pinned: str | None) -> manifest.BuildKey:
    return manifest.BuildKey(aiter_commit(aiter, pinned), tuple(archs),
                             manifest.config_hash(checkout_root(), CONFIG_FILES, settings()))


# --- interface checks ---------------------------------------------------------------------------------------


def _normalized_columns(csv_path: Path) -> set[str]:
    header = csv_path.read_text().splitlines()[0] if csv_path.stat().st_size else ""
    return {re.sub(r"[\s_]", "", name).lower() for name in header.split(",")}


def _table_code_objects(csv_path: Path) -> list[str]:
    lines = [line for line in csv_path.read_text().splitlines() if line.strip()]
    names = [re.sub(r"[\s_]", "", n).lower() for n in lines[0].split(",")]
    column = names.index("coname")
    return [fields[column].strip() for fields in (line.split(",") for line in lines[1:]) if len(fields) > column]


def _without_comments(text: str) -> str:
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", "", text, flags=re.S))


def _struct_body(header: Path, struct: str) -> str | None:
    text = _without_comments(header.read_text())
    match = re.search(rf"struct\s+{struct}\s*\{{", text)
    if match is None:
        return None
    depth, i = 1, match.end()
    while depth and i < len(text):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    return text[match.end():i]


def _c_signatures(aiter: Path) -> dict[str, tuple[Path, tuple[str, ...]]]:
    """Where each opus RMSNorm entry point is defined, and its parameter names."""
    found = {}
    for path in sorted((aiter / "csrc").rglob("*")):
        if path.suffix not in (".cu", ".cc", ".cpp", ".hip") or not path.is_file():
            continue
        text = _without_comments(path.read_text(errors="replace"))
        for name in RMSNORM_SIGNATURES:
            match = re.search(rf"\bvoid\s+{name}\s*\(([^)]*)\)\s*\{{", text)
            if match and name not in found:
                params = match.group(1).split(",")
                found[name] = (path, tuple(p.split()[-1].lstrip("*&") for p in params if p.strip()))
    return found


def rmsnorm_module(aiter: Path, source: Path) -> str | None:
    """The JIT module of optCompilerConfig.json that compiles ``source``."""
    config = json.loads((aiter / "aiter" / "jit" / "optCompilerConfig.json").read_text())
    for module, spec in config.items():
        if any(source.name in str(src) for src in spec.get("srcs", [])):
            return module
    return None


def check_interface(aiter: Path, archs: Sequence[str]) -> list[str]:
    """Everything the bridge relies on in the checkout that differs from what it was written against."""
    problems = []
    for family, (table, family_archs, columns) in GEMM_FAMILIES.items():
        for arch in archs:
            csv_path = aiter / "hsa" / arch / family / table
            if arch not in family_archs:
                continue
            if not csv_path.is_file():
                problems.append(f"hsa/{arch}/{family}/{table} is missing")
                continue
            missing = sorted(set(columns) - _normalized_columns(csv_path))
            if missing:
                problems.append(f"hsa/{arch}/{family}/{table} lacks columns {missing}")
                continue
            for co in _table_code_objects(csv_path):
                if refused := validate.asset_name_problem(co):
                    problems.append(f"hsa/{arch}/{family}/{table}: {refused}")
                    continue
                co_path = csv_path.parent / co if "/" not in co else csv_path.parent.parent / co
                if not co_path.is_file():
                    problems.append(f"hsa/{arch}/{family}/{table} names {co}, which does not exist")
    for header, struct, members in (("mha_fwd.h", "mha_fwd_args", MHA_FWD_MEMBERS),
                                    ("mha_bwd.h", "mha_bwd_args", MHA_BWD_MEMBERS)):
        path = aiter / "csrc" / "include" / header
        body = _struct_body(path, struct) if path.is_file() else None
        if body is None:
            problems.append(f"csrc/include/{header} has no struct {struct}")
            continue
        missing = [m for m in members if not re.search(rf"\b{m}\b", body)]
        if missing:
            problems.append(f"{struct} lacks members {missing}")
    signatures = _c_signatures(aiter)
    for name, params in RMSNORM_SIGNATURES.items():
        if name not in signatures:
            problems.append(f"no definition of {name} under csrc/")
        elif signatures[name][1] != params:
            problems.append(f"{name} takes {signatures[name][1]}, the bridge passes {params}")
    config = aiter / "aiter" / "jit" / "optCompilerConfig.json"
    if not config.is_file():
        problems.append("aiter/jit/optCompilerConfig.json is missing")
    else:
        modules = json.loads(config.read_text())
        problems += [f"JIT module {m} is not in optCompilerConfig.json" for m in MHA_MODULES if m not in modules]
        if "rms_norm_opus" in signatures and rmsnorm_module(aiter, signatures["rms_norm_opus"][0]) is None:
            problems.append(f"no JIT module compiles {signatures['rms_norm_opus'][0].relative_to(aiter)}")
    return problems


# --- building and staging ----------------------------------------------------------------------------------

# Runs inside AITER's build environment. AITER's JIT core is imported from its directory (as a top-level
# module), which needs neither the aiter package's runtime imports nor torch. Only the keyword arguments the
# checkout's build_module accepts are passed: the set changed across AITER versions. The driver writes where
# the module landed (AITER's JIT directory, which AITER_JIT_DIR sets at most commits) to the file argv[3].
_BUILD_DRIVER = """
import inspect, sys
sys.path[:0] = [sys.argv[1] + "/aiter/jit", sys.argv[1] + "/aiter/jit/utils"]
import core
name = sys.argv[2]
args = dict(core.get_args_of_build(name))
params = inspect.signature(core.build_module).parameters
call = {k: v for k, v in args.items() if k in params}
if "md_name" in params and not call.get("md_name"):
    call["md_name"] = name
core.build_module(**call)
with open(sys.argv[3], "w") as f:
    f.write(str(core.get_user_jit_dir()))
"""


def _run_jit_build(aiter: Path, module: str, jit_dir: Path, archs: Sequence[str], jobs: int | None) -> Path:
    env = dict(os.environ, GPU_ARCHS=";".join(archs), AITER_JIT_DIR=str(jit_dir), **BUILD_ENV)
    if jobs:
        env["MAX_JOBS"] = str(jobs)
    print(f"build-aiter: building {module} for {';'.join(archs)} (AITER JIT)", flush=True)
    started = time.monotonic()
    where = jit_dir / f"{module}.location"
    result = subprocess.run([sys.executable, "-c", _BUILD_DRIVER, str(aiter), module, str(where)], env=env,
                            cwd=aiter)
    if result.returncode != 0 or not where.is_file():
        raise BuildError(f"AITER's build of {module} failed (exit {result.returncode}); see its output above")
    out_dir = Path(where.read_text().strip())
    built = out_dir / f"{module}.so"
    if not built.is_file():
        raise BuildError(f"AITER built {module} but {built} does not exist; {out_dir} holds "
                         f"{sorted(p.name for p in out_dir.glob('*.so'))}")
    print(f"build-aiter: {module} built in {time.monotonic() - started:.0f} s", flush=True)
    return built


def _exported_symbols(library: Path) -> set[str]:
    result = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True)
    if result.returncode != 0:
        raise BuildError(f"nm cannot read {library}: {result.stderr.strip()}")
    return {line.split()[-1] for line in result.stdout.splitlines() if line.strip()}


def _stage_assets(aiter: Path, stage: Path, archs: Sequence[str]) -> None:
    for arch in archs:
        source = aiter / "hsa" / arch
        families = [f for f, (_, family_archs, _) in GEMM_FAMILIES.items() if arch in family_archs]
        families += sorted(p.name for p in source.glob(MHA_ASM_PREFIX + "*") if p.is_dir())
        for family in families:
            shutil.copytree(source / family, stage / "hsa" / arch / family,
                            ignore=shutil.ignore_patterns("src", "*.py", "*.md"))


def _provenance() -> dict[str, str]:
    version_file = Path(os.environ.get("ROCM_PATH", "/opt/rocm")) / ".info" / "version"
    rocm = version_file.read_text().strip() if version_file.is_file() else "unknown"
    return {"rocm_version": rocm, "python": platform.python_version(),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def stage(aiter: Path, stage_dir: Path, jit_dir: Path, archs: Sequence[str], *, pinned: str | None,
          reuse_only: bool, jobs: int | None = None) -> str:
    """Make ``stage_dir`` a build of ``aiter`` (which must be at ``pinned``, when given) for ``archs``;
    returns "reused" or "built"."""
    key = build_key(aiter, archs, pinned)
    problems = manifest.mismatches(stage_dir, key)
    if not problems:
        print(f"build-aiter: {stage_dir} matches (AITER {key.aiter_commit[:12]}, {';'.join(archs)}); reusing it")
        return "reused"
    if reuse_only:
        raise BuildError(f"{stage_dir} cannot be reused and --reuse-only forbids building:\n  "
                         + "\n  ".join(problems))
    if stage_dir.exists():
        print("build-aiter: rebuilding because\n  " + "\n  ".join(problems), flush=True)
    interface = check_interface(aiter, archs)
    # The ASM GEMM code objects and tables against the bridge's argument blocks (and, with an llvm-objdump that
    # disassembles these architectures, the kernarg loads of their code). Its verdict goes into the manifest: the
    # runtime refuses assets without it.
    objdump = validate.find_objdump()
    artifacts = validate.read_tree(aiter, objdump, tuple(archs))
    for problem in artifacts["disassembly"]:
        print(f"build-aiter: {problem}", flush=True)
    loads_checked = objdump is not None and not artifacts["disassembly"]
    artifact_problems = list(artifacts["unreadable"].values()) + validate.check_artifacts(artifacts, tuple(archs))
    interface += artifact_problems
    if interface:
        raise BuildError(f"AITER at {key.aiter_commit} differs from what the bridge was written against:\n  "
                         + "\n  ".join(interface) + "\nUpdate csrc/aiter and tools/aiter_build.py together "
                         "with the pin (docs/aiter-bridge.md).")
    jit_dir.mkdir(parents=True, exist_ok=True)
    libraries = {staged: _run_jit_build(aiter, module, jit_dir, archs, jobs) for module, staged in MHA_MODULES.items()}
    module = rmsnorm_module(aiter, _c_signatures(aiter)["rms_norm_opus"][0])
    rmsnorm = _run_jit_build(aiter, module, jit_dir, archs, jobs)
    missing = sorted(set(RMSNORM_SIGNATURES) - _exported_symbols(rmsnorm))
    if missing:
        raise BuildError(f"{rmsnorm} does not export {missing} (AITER_SYMBOL_VISIBLE=1 should make it)")
    libraries[RMSNORM_LIBRARY] = rmsnorm

    fresh = stage_dir.with_name(stage_dir.name + ".new")
    shutil.rmtree(fresh, ignore_errors=True)
    fresh.mkdir(parents=True)
    for name, built in libraries.items():
        shutil.copy2(built, fresh / name)
    _stage_assets(aiter, fresh, archs)
    manifest.write(fresh, key, _provenance(),
                   validated={"aiter_commit": key.aiter_commit, "problems": len(artifact_problems),
                              "kernarg_loads_checked": loads_checked})
    # Swap in the complete stage only now: an interrupted build never leaves a half stage behind a manifest.
    shutil.rmtree(stage_dir, ignore_errors=True)
    fresh.rename(stage_dir)
    print(f"build-aiter: staged {stage_dir} (AITER {key.aiter_commit[:12]}, {';'.join(archs)})")
    return "built"


def check(aiter: Path, stage_dir: Path, archs: Sequence[str], *, pinned: str | None) -> list[str]:
    """Why the stage must not be used for this checkout and ``archs``; empty when it may be."""
    return manifest.mismatches(stage_dir, build_key(aiter, archs, pinned))


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] = os.environ) -> int:
    parser = argparse.ArgumentParser(prog="python tools/aiter_build.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("stage", "check"))
    parser.add_argument("--aiter", type=Path, default=checkout_root() / SUBMODULE, help="the AITER checkout")
    parser.add_argument("--stage", type=Path, default=checkout_root() / "build" / "aiter", help="the stage directory")
    parser.add_argument("--jit-dir", type=Path, default=checkout_root() / "build" / "aiter-jit",
                        help="AITER's JIT workspace (AITER_JIT_DIR)")
    parser.add_argument("--archs", default=environ.get("GPU_ARCHS", "gfx942;gfx950"), help="GPU_ARCHS")
    parser.add_argument("--reuse-only", action="store_true", help="fail instead of building on a mismatch")
    parser.add_argument("--jobs", type=int, default=None, help="MAX_JOBS for AITER's build")
    args = parser.parse_args(argv)
    if not checkout_present(args.aiter):
        print(f"build-aiter: AITER bridge skipped: {args.aiter} is not checked out "
              f"(git submodule update --init --recursive {SUBMODULE})")
        return 0 if args.command == "stage" else 1
    try:
        archs = manifest.parse_archs(args.archs)
        if args.command == "check":
            problems = check(args.aiter, args.stage, archs, pinned=pinned_commit())
            for problem in problems:
                print(f"build-aiter: {problem}")
            return 1 if problems else 0
        stage(args.aiter, args.stage, args.jit_dir, archs, pinned=pinned_commit(), reuse_only=args.reuse_only,
              jobs=args.jobs)
    except (BuildError, manifest.ManifestError) as err:
        print(f"build-aiter: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
