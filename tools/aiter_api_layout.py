#!/usr/bin/env python3
"""The layout of the AITER C++/C interface the bridge uses, from the real headers or from our stand-ins.

csrc/aiter/mha.cc fills ``aiter::mha_fwd_args`` / ``aiter::mha_bwd_args`` and passes a ``ck_tile::stream_config``;
csrc/aiter/rmsnorm.cc calls the opus RMSNorm C entry points through the types in csrc/aiter/rmsnorm_abi.h. This
tool compiles a small probe program against one side and prints, as JSON, for each struct its size and alignment
and for each member the bridge uses (every ``args.X =`` in mha.cc; every member of stream_config, with its
default) the offset, size and type; plus the types of ``aiter::mha_fwd``, ``aiter::mha_bwd`` and the two RMSNorm
entry points.

    real --aiter DIR   AITER's own headers in DIR/csrc/include (a checkout; needs clang with HIP, e.g. Debian's
                       clang-22 + libamdhip64-dev). Also proves, by static_assert in a second compile, that the
                       rmsnorm_abi.h types are those of AITER's definitions in
                       csrc/kernels/rmsnorm/rmsnorm_opus_norm_entry.cu. Writes the fixture with -o.
    standin            tests/fixtures/aiter/api_standin (any host C++17 compiler: $CXX, g++, c++ or clang++).
    check              standin, compared with the recorded real layout (FIXTURE) member for member; exit 1 and
                       the differences when they disagree. tests/test_aiter_bridge.py and
                       scripts/compile-check.sh aiter runs this where no AITER checkout exists.
    check --aiter DIR  standin, compared with the real layout of the checkout DIR (scripts/compile-check.sh aiter
                       with a checkout). After moving the pin: `real --aiter DIR -o <new fixture>`, update
                       AITER_COMMIT, the stand-ins and mha.cc until `check` passes.

The real side is compiled the way the bridge consumes AITER: ENABLE_CK unset, so AITER's headers use their own
ck_tile shim (csrc/include/ck_tile_shim.h) rather than Composable Kernel. Debian's HIP headers are 5.2, older
than AITER's headers assume; tools/aiter_hip_compat.h (force-included) declares the two HIP 6 names
aiter_hip_common.h uses in inline code the bridge never calls, and the one standard header it forgets.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
AITER_COMMIT = "e4048607a535ace3a2b51ded31b1c8c2d45c0879"  # the commit FIXTURE was generated from
FIXTURE = REPO / "tests/fixtures/aiter" / f"api_layout_{AITER_COMMIT[:8]}.json"
STANDIN_DIR = REPO / "tests/fixtures/aiter/api_standin"
COMPAT_HEADER = REPO / "tools/aiter_hip_compat.h"
RMSNORM_ENTRY = "csrc/kernels/rmsnorm/rmsnorm_opus_norm_entry.cu"  # relative to the AITER checkout

# Every member of ck_tile::stream_config: mha.cc value-initializes it from the stream, AITER reads all of them.
STREAM_CONFIG_MEMBERS = ("stream_id_", "time_kernel_", "log_level_", "cold_niters_", "nrepeat_", "is_gpu_timer_",
                         "flush_cache_", "rotating_count_")


def used_members(mha_cc: Path = REPO / "csrc/aiter/mha.cc") -> tuple[list[str], list[str]]:
    """The members mha.cc assigns (``args.X =``) in the forward and in the backward handler, in source order."""
    forward, backward = mha_cc.read_text().split("ffi::Error MhaBackward(")

    def assigned(text: str) -> list[str]:
        return list(dict.fromkeys(re.findall(r"\bargs\.(\w+)\s*=", text)))

    return assigned(forward), assigned(backward)


def probe_source(fwd: list[str], bwd: list[str]) -> str:
    headers = ["<cxxabi.h>", "<cstdio>", "<cstdlib>", "<sstream>", "<string>", "<type_traits>", "<typeinfo>",
               '"mha_fwd.h"', '"mha_bwd.h"', '"rmsnorm_abi.h"']
    lines = [f"#include {h}" for h in headers] + ["", _PROBE_HELPERS, "int main() {"]
    for struct, members in (("aiter::mha_fwd_args", fwd), ("aiter::mha_bwd_args", bwd),
                            ("ck_tile::stream_config", list(STREAM_CONFIG_MEMBERS))):
        lines.append(f'  record_struct<{struct}>("{struct}");')
        for m in members:
            lines.append(f'  record_member("{struct}", "{m}", &{struct}::{m});')
    for m in STREAM_CONFIG_MEMBERS:
        lines.append(f'  record_default("ck_tile::stream_config", "{m}", ck_tile::stream_config{{}}.{m});')
    for name, expr in (("aiter::mha_fwd", "decltype(&aiter::mha_fwd)"),
                       ("aiter::mha_bwd", "decltype(&aiter::mha_bwd)"),
                       ("rms_norm_opus", "jax_aiter::aiter::RmsNormOpus"),
                       ("add_rms_norm_opus", "jax_aiter::aiter::AddRmsNormOpus")):
        lines.append(f'  record_function("{name}", typeid({expr}));')
    lines += ["  return 0;", "}", ""]
    return "\n".join(lines)


_PROBE_HELPERS = r"""
namespace {
std::string type_name(const std::type_info& t) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(t.name(), nullptr, nullptr, &status);
  std::string name = (status == 0 && demangled != nullptr) ? demangled : t.name();
  std::free(demangled);
  return name;
}

template <typename S>
const S& instance() {
  static const S s{};
  return s;
}

template <typename S>
void record_struct(const char* name) {
  std::printf("struct\t%s\t%zu\t%zu\n", name, sizeof(S), alignof(S));
}

template <typename S, typename M>
void record_member(const char* s, const char* m, M S::*member) {
  const S& object = instance<S>();
  const auto offset = reinterpret_cast<const char*>(&(object.*member)) - reinterpret_cast<const char*>(&object);
  std::printf("member\t%s\t%s\t%td\t%zu\t%s\n", s, m, offset, sizeof(M), type_name(typeid(M)).c_str());
}

template <typename T>
void record_default(const char* s, const char* m, const T& value) {
  std::ostringstream text;
  if constexpr (std::is_pointer_v<T>) {
    text << (value == nullptr ? "null" : "non-null");
  } else {
    text << std::boolalpha << value;
  }
  std::printf("default\t%s\t%s\t%s\n", s, m, text.str().c_str());
}

void record_function(const char* name, const std::type_info& type) {
  std::printf("function\t%s\t%s\n", name, type_name(type).c_str());
}
}  // namespace
"""

# Compiled after AITER's RMSNorm entry file: its definitions must have exactly the types the bridge calls.
_RMSNORM_CHECK = """
#include <type_traits>
#include "rmsnorm_abi.h"
static_assert(std::is_same_v<decltype(&::rms_norm_opus), jax_aiter::aiter::RmsNormOpus>,
              "rms_norm_opus differs from csrc/aiter/rmsnorm_abi.h");
static_assert(std::is_same_v<decltype(&::add_rms_norm_opus), jax_aiter::aiter::AddRmsNormOpus>,
              "add_rms_norm_opus differs from csrc/aiter/rmsnorm_abi.h");
"""


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        raise SystemExit(f"aiter_api_layout: command failed ({result.returncode}): {' '.join(cmd)}\n"
                         f"{result.stdout}{result.stderr}")
    return result


def _parse(text: str) -> dict:
    layout: dict = {"structs": {}, "functions": {}}
    for line in text.splitlines():
        kind, *rest = line.split("\t")
        if kind == "struct":
            name, size, align = rest
            layout["structs"][name] = {"size": int(size), "align": int(align), "members": {}}
        elif kind == "member":
            struct, member, offset, size, type_ = rest
            layout["structs"][struct]["members"][member] = {"offset": int(offset), "size": int(size), "type": type_}
        elif kind == "default":
            struct, member, value = rest
            layout["structs"][struct]["members"][member]["default"] = value
        elif kind == "function":
            layout["functions"][rest[0]] = rest[1]
    return layout


def _compile_and_run(compiler: list[str], flags: list[str], work: Path) -> dict:
    fwd, bwd = used_members()
    source = work / "probe.cc"
    source.write_text(probe_source(fwd, bwd))
    exe = work / "probe"
    _run([*compiler, *flags, f"-I{REPO / 'csrc/aiter'}", str(source), "-o", str(exe)])
    return _parse(_run([str(exe)]).stdout)


def host_compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")


def standin_layout(cxx: str | None = None) -> dict:
    cxx = cxx or host_compiler()
    if cxx is None:
        raise SystemExit("aiter_api_layout: no host C++ compiler (set CXX)")
    with tempfile.TemporaryDirectory() as tmp:
        return _compile_and_run([cxx], ["-std=c++17", "-O0", "-Wall", "-Wextra", "-Werror", f"-I{STANDIN_DIR}"],
                                Path(tmp))


def real_layout(aiter: Path, clang: str) -> dict:
    include = aiter / "csrc/include"
    if not (include / "mha_fwd.h").is_file():
        raise SystemExit(f"aiter_api_layout: {include}/mha_fwd.h does not exist (an AITER checkout?)")
    hip = ["-x", "hip", "--cuda-host-only", "--offload-arch=gfx942", "-nogpulib", "-D__AMDGCN_WAVEFRONT_SIZE=64"]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        # The RMSNorm entry file is compiled as AITER's module_rmsnorm compiles it (-D__HIPCC_RTC__), checked only.
        check = work / "rmsnorm_check.cc"
        check.write_text(f'#include "{aiter / RMSNORM_ENTRY}"\n{_RMSNORM_CHECK}')
        _run([clang, *hip, "-std=c++17", "-D__HIPCC_RTC__", "-fsyntax-only", f"-isystem{include}",
              f"-I{aiter / Path(RMSNORM_ENTRY).parent}", f"-I{REPO / 'csrc/aiter'}", str(check)])
        layout = _compile_and_run(
            [clang], [*hip, "-std=c++17", "-O0", "-include", str(COMPAT_HEADER), f"-isystem{include}"],
            work)
    commit = subprocess.run(["git", "-C", str(aiter), "rev-parse", "HEAD"], capture_output=True, text=True)
    version = subprocess.run([clang, "--version"], capture_output=True, text=True).stdout.splitlines()
    layout["provenance"] = {
        "aiter_commit": commit.stdout.strip() if commit.returncode == 0 else "unknown",
        "headers": ["csrc/include/mha_fwd.h", "csrc/include/mha_bwd.h", "csrc/include/ck_tile_shim.h",
                    RMSNORM_ENTRY],
        "compiler": version[0] if version else clang,
        "generated_by": "python tools/aiter_api_layout.py real --aiter <checkout> -o <this file>",
    }
    return layout


def differences(got: dict, want: dict) -> list[str]:
    """Everything that differs between two layouts, ignoring provenance."""
    problems = []
    for struct in sorted(set(got["structs"]) | set(want["structs"])):
        g, w = got["structs"].get(struct), want["structs"].get(struct)
        if g is None or w is None:
            problems.append(f"{struct}: only in the {'recorded' if g is None else 'stand-in'} layout")
            continue
        for key in ("size", "align"):
            if g[key] != w[key]:
                problems.append(f"{struct}: {key} {g[key]} here, {w[key]} at AITER")
        for member in sorted(set(g["members"]) | set(w["members"])):
            gm, wm = g["members"].get(member), w["members"].get(member)
            if gm is None:
                problems.append(f"{struct}::{member}: recorded but mha.cc no longer sets it (regenerate the fixture)")
            elif wm is None:
                problems.append(f"{struct}::{member}: mha.cc sets it but the recorded layout lacks it "
                                "(regenerate the fixture from a checkout)")
            elif gm != wm:
                problems.append(f"{struct}::{member}: {gm} here, {wm} at AITER")
    for name in sorted(set(got["functions"]) | set(want["functions"])):
        if got["functions"].get(name) != want["functions"].get(name):
            problems.append(f"{name}: {got['functions'].get(name)} here, {want['functions'].get(name)} at AITER")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    real = sub.add_parser("real", help="the layout from AITER's headers")
    real.add_argument("--aiter", type=Path, required=True, help="an AITER checkout")
    real.add_argument("--clang", default=os.environ.get("CLANG", "/usr/lib/llvm-22/bin/clang++"))
    real.add_argument("-o", "--output", type=Path, help="write here instead of printing")
    standin = sub.add_parser("standin", help="the layout from tests/fixtures/aiter/api_standin")
    standin.add_argument("--cxx")
    check = sub.add_parser("check", help="stand-in layout == recorded real layout (or a checkout's, with --aiter)")
    check.add_argument("--cxx")
    check.add_argument("--fixture", type=Path, default=FIXTURE)
    check.add_argument("--aiter", type=Path, help="compare with this checkout's headers instead of the fixture")
    check.add_argument("--clang", default=os.environ.get("CLANG", "/usr/lib/llvm-22/bin/clang++"))
    args = parser.parse_args(argv)

    if args.command == "real":
        layout = real_layout(args.aiter.resolve(), args.clang)
        if layout["provenance"]["aiter_commit"] != AITER_COMMIT:
            print(f"aiter_api_layout: note: the checkout is {layout['provenance']['aiter_commit']}, "
                  f"FIXTURE names {AITER_COMMIT}", file=sys.stderr)
        text = json.dumps(layout, indent=1, sort_keys=True) + "\n"
        if args.output:
            args.output.write_text(text)
        else:
            sys.stdout.write(text)
        return 0
    if args.command == "standin":
        sys.stdout.write(json.dumps(standin_layout(args.cxx), indent=1, sort_keys=True) + "\n")
        return 0
    want = real_layout(args.aiter.resolve(), args.clang) if args.aiter else json.loads(args.fixture.read_text())
    source = args.aiter if args.aiter else args.fixture
    problems = differences(standin_layout(args.cxx), want)
    if problems:
        print(f"aiter_api_layout: the stand-ins differ from AITER {want['provenance']['aiter_commit'][:12]} "
              f"({source}):", *problems, sep="\n  ")
        return 1
    n = sum(len(s["members"]) for s in want["structs"].values())
    print(f"aiter_api_layout: stand-ins equal AITER {want['provenance']['aiter_commit'][:12]}: "
          f"{len(want['structs'])} structs, {n} members, {len(want['functions'])} function types")
    return 0


if __name__ == "__main__":
    sys.exit(main())
