"""A test oracle: AITER's ASM GEMM kernel selection at the pinned commit, restated in Python from reading
AITER's ``get_heuristic_kernel`` (csrc/py_itfs_cu/asm_gemm_a4w4.cu, asm_gemm_a16w16.cu) and the Python that
calls it (aiter/ops/gemm_op_a4w4.py, gemm_op_a16w16.py, tuned_gemm.py). Independent of csrc/aiter/gemm_select.cc.

What AITER does, as read at e4048607:

* a4w4 (``gemm_a4w4``): a tuned row (a4w4_blockscale_tuned_gemm.csv, keyed by gfx, CU count, M, N, K) names the
  kernel when there is one; otherwise the heuristic runs with ``log2_k_split = 0``: every pre-shuffled row (the
  128x512 tile only when N % 512 == 0) with K unsplit. Splits {2, 4, 8, 16} are tried only when a caller passes
  a negative ``log2_k_split``, which AITER's own Python never does.
* a16w16 (``gemm_a16w16_asm`` without a kernel name): rows with the requested B layout, N % tileN == 0 and, when
  no bias is added, any bias setting; split-capable rows with K / subK >= 2 run
  ``max(2, min(num_cu / tiles, 16, K / subK))`` splits; a split launch with more than 16 * 64 tiles is refused
  after the choice. (tuned_gemm.py only reaches this path through its tuned CSV, or for pre-shuffled B.)
* Both walk the rows of an ``std::unordered_map`` keyed by arch + kernel name; a row replaces the current
  choice under comparisons that are not a strict order, so the walk order can matter. :func:`unordered_map_order`
  gives libstdc++'s order for a given key sequence; the functions below take the order as the row list.
* The arithmetic is AITER's: 32-bit unsigned CU and round counts, integer ``tileM*tileN/(tileM+tileN)`` for a4w4,
  float for a16w16.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

U32 = 0xFFFFFFFF


def _ceil(a: int, b: int) -> int:
    return (a + b - 1) // b


def _norm(row: dict) -> dict:
    return {k.replace("_", "").lower(): v for k, v in row.items()}


def a4w4(rows: list[dict], m: int, n: int, k: int, num_cu: int, log2_k_split: int = 0):
    """(index into ``rows``, log2 of the K split, grid z) AITER's heuristic picks, or None."""
    empty_cu, rnd, eff = num_cu, U32, 1.0
    split_en = 1 if log2_k_split >= 0 and log2_k_split != 0 else 0
    chosen = None
    for index, raw in enumerate(rows):
        row = _norm(raw)
        tm, tn, split_k = int(row["tilem"]), int(row["tilen"]), int(row.get("splitk") or 0)
        if int(row.get("bpreshuffle") or 0) != 1 or split_k < split_en:
            continue
        if tm == 128 and tn == 512 and n % tn != 0:
            continue
        if log2_k_split >= 0 and split_k:
            splits = [1 << log2_k_split]
        else:
            splits = [2, 4, 8, 16] if split_k else [1]
        for split in splits:
            groups = (_ceil(m, tm) * _ceil(n, tn) * split) & U32
            local_round = (groups + num_cu - 1) // num_cu
            local_eff = float(tm * tn // (tm + tn))
            idle = (local_round * num_cu - groups) & U32
            if local_round < rnd or (local_round == rnd and (empty_cu > idle or local_eff > eff)):
                rnd, empty_cu, eff = local_round, idle, local_eff
                chosen = (index, split)
    if chosen is None:
        return None
    index, split = chosen
    row = _norm(rows[index])
    log2, z = split.bit_length() - 1, 1
    if int(row.get("splitk") or 0):
        per_block = _ceil(k // split, 256) * 256
        z = _ceil(k, per_block)
    return index, log2, z


def a16w16(rows: list[dict], m: int, n: int, k: int, num_cu: int, bpreshuffle: int = 0, add_bias: int = 0):
    """(index into ``rows``, split) AITER's heuristic picks; or a string saying why AITER stops."""
    if k % 64:
        return "K % 64 != 0"
    empty_cu, rnd, eff, oob = num_cu, U32, 1.0, m
    chosen = None
    for index, raw in enumerate(rows):
        row = _norm(raw)
        tm, tn = int(row["tilem"]), int(row["tilen"])
        split_k, sub_k = int(row.get("splitk") or 0), int(row.get("subk") or 0)
        if not (n % tn == 0 and int(row.get("bpreshuffle") or 0) == bpreshuffle
                and (add_bias == 0 or int(row.get("bias") or 0) == 1)):
            continue
        split = 1
        pure = (_ceil(m, tm) * (n // tn)) & U32
        if split_k == 1 and k // sub_k >= 2:
            split = max(2, min(min(num_cu // pure, 16), k // sub_k))
        groups = (pure * split) & U32
        local_round = (groups + num_cu - 1) // num_cu
        local_eff = (tm * tn) / (tm + tn)
        idle = (local_round * num_cu - groups) & U32
        rest = m % tm
        less_oob = (oob > 0) if rest == 0 else (tm - rest < oob)
        same_oob = (tm - rest) == oob
        if (local_round < rnd or (local_round == rnd and (empty_cu > idle or less_oob))
                or (local_round == rnd and empty_cu == idle and same_oob and local_eff > eff)):
            rnd, empty_cu, eff = local_round, idle, local_eff
            oob = 0 if rest == 0 else tm - rest
            chosen = (index, split)
    if chosen is None:
        return "no kernel"
    index, split = chosen
    tm, tn = int(_norm(rows[index])["tilem"]), int(_norm(rows[index])["tilen"])
    if split > 1 and _ceil(m, tm) * _ceil(n, tn) > 1024:
        return "split launch with more than 16*64 tiles"
    return index, split


_ORDER_PROGRAM = r"""
#include <iostream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>
int main() {
  std::vector<std::pair<std::string, int>> items;
  std::string key;
  while (std::getline(std::cin, key)) items.emplace_back(key, static_cast<int>(items.size()));
  std::unordered_map<std::string, int> map(items.begin(), items.end());  // as an initializer list builds it
  for (const auto& [k, index] : map) std::cout << index << "\n";
}
"""


def unordered_map_order(cxx: str, workdir: Path, keys: list[str]) -> list[int]:
    """The order libstdc++'s unordered_map, built from ``keys`` in that order, walks them (indices)."""
    exe = workdir / "map_order"
    if not exe.exists():
        source = workdir / "map_order.cc"
        source.write_text(_ORDER_PROGRAM)
        subprocess.run([cxx, "-std=c++17", "-O1", str(source), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], input="".join(k + "\n" for k in keys), capture_output=True, text=True,
                         check=True).stdout
    return [int(line) for line in out.split()]
