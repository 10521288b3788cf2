#include "gemm_select.h"

#include <algorithm>
#include <limits>
#include <unordered_map>
#include <utility>

#include "asm_kernel_args.h"

namespace jax_aiter::aiter {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

constexpr int64_t kMaxU32 = std::numeric_limits<uint32_t>::max();

std::string check_problem(const GemmProblem& p, int num_cu) {
  if (p.m <= 0 || p.n <= 0 || p.k <= 0) return "M, N and K must be positive";
  if (p.m > kMaxU32 || p.n > kMaxU32 || p.k > kMaxU32) return "M, N and K must fit in 32 bits";
  if (num_cu <= 0) return "the device reports no compute units";
  return {};
}

}  // namespace

std::vector<int> aiter_walk_order(const KernelTable& table, const std::string& arch) {
  std::vector<int> order;
  if (arch.empty()) {
    for (int i = 0; i < static_cast<int>(table.rows.size()); ++i) order.push_back(i);
    return order;
  }
  // AITER's generated configuration (hsa/codegen.py) is an unordered_map<std::string, config> initialized from
  // the rows in file order; an initializer list builds it as this range does, so the walk order is the same.
  std::vector<std::pair<std::string, int>> items;
  for (int i = 0; i < static_cast<int>(table.rows.size()); ++i) items.emplace_back(arch + table.rows[i].knl_name, i);
  const std::unordered_map<std::string, int> map(items.begin(), items.end());
  for (const auto& item : map) order.push_back(item.second);
  return order;
}

int64_t fp4_output_rows(int64_t m) { return ceil_div(m, 32) * 32; }

// Both selections are AITER's heuristics at the pinned commit (csrc/py_itfs_cu/asm_gemm_a4w4.cu and
// asm_gemm_a16w16.cu, get_heuristic_kernel), comparison for comparison and in AITER's integer types, over the
// rows in the order AITER walks them (aiter_walk_order). AITER's comparisons are not a strict order, so that
// order decides between rows that tie on rounds (docs/aiter-bridge.md, "Kernel selection").

std::string select_fp4_kernel(const KernelTable& table, const GemmProblem& p, int num_cu, Fp4Choice* choice) {
  if (std::string err = check_problem(p, num_cu); !err.empty()) return err;
  *choice = Fp4Choice{};
  const uint32_t cus = static_cast<uint32_t>(num_cu);
  uint32_t empty_cu = cus;
  uint32_t round = 0xffffffffu;
  float efficiency = 1.0f;
  for (const int i : aiter_walk_order(table, p.arch)) {
    const KernelRow& row = table.rows[i];
    // B arrives pre-shuffled; persistent-grid kernels take a launch contract AITER does not document.
    if (!row.b_preshuffle || row.persistent) continue;
    // AITER: the 128x512 tile does not handle a partial N tile; the others mask it.
    if (row.tile_m == 128 && row.tile_n == 512 && p.n % 512 != 0) continue;
    // AITER's gemm_a4w4 asks for log2_k_split = 0, so every row runs with K unsplit.
    const uint32_t groups = static_cast<uint32_t>(ceil_div(p.m, row.tile_m) * ceil_div(p.n, row.tile_n));
    const uint32_t local_round = (groups + cus - 1) / cus;
    const float local_efficiency = static_cast<float>(row.tile_m * row.tile_n / (row.tile_m + row.tile_n));
    const bool earlier_round = local_round < round;
    const bool same_round = local_round == round;
    const bool fewer_empty = empty_cu > local_round * cus - groups;
    const bool more_efficient = local_efficiency > efficiency;
    if (earlier_round || (same_round && (fewer_empty || more_efficient))) {
      round = local_round;
      empty_cu = local_round * cus - groups;
      efficiency = local_efficiency;
      choice->row = i;
      choice->log2_k_split = 0;
      choice->grid = LaunchGrid{static_cast<unsigned>(ceil_div(p.n, row.tile_n)),
                                static_cast<unsigned>(ceil_div(p.m, row.tile_m)), 1u};
    }
  }
  if (choice->row < 0)
    return "no pre-shuffled FP4 GEMM kernel in " + table.source + " serves M=" + std::to_string(p.m) +
           " N=" + std::to_string(p.n) + " K=" + std::to_string(p.k);
  return {};
}

std::string select_bf16_kernel(const KernelTable& table, const GemmProblem& p, int num_cu, Bf16Choice* choice) {
  if (std::string err = check_problem(p, num_cu); !err.empty()) return err;
  *choice = Bf16Choice{};
  if (p.k % 64 != 0)
    return "K must be a multiple of 64 (the kernels load 128-bit K slices), got " + std::to_string(p.k);
  if (p.m * p.n >= (int64_t{1} << 31))
    return "M*N must be below 2^31 (the kernels use 32-bit output offsets), got " + std::to_string(p.m * p.n);
  const uint32_t cus = static_cast<uint32_t>(num_cu);
  uint32_t empty_cu = cus;
  uint32_t round = 0xffffffffu;
  float efficiency = 1.0f;
  int64_t oob = p.m;  // rows of M padding of the current choice
  for (const int i : aiter_walk_order(table, p.arch)) {
    const KernelRow& row = table.rows[i];
    // B is not shuffled; no bias is added, so bias-capable rows serve too (AITER: add_bias == 0 || bias).
    if (row.b_preshuffle || p.n % row.tile_n != 0) continue;
    const int64_t gx = p.n / row.tile_n;
    const int64_t gy = ceil_div(p.m, row.tile_m);
    const uint32_t groups = static_cast<uint32_t>(gx * gy);
    int64_t split = 1;
    if (row.split_k && row.sub_k > 0 && p.k / row.sub_k >= 2) {
      split = std::max<int64_t>(2, std::min<int64_t>(std::min<int64_t>(cus / groups, 16), p.k / row.sub_k));
      // One semaphore word per output tile: AITER refuses such a launch after choosing it; the bridge passes
      // over the row instead.
      if (gx * gy > kBf16SemaphoreWords) continue;
    }
    const uint32_t blocks = groups * static_cast<uint32_t>(split);
    const uint32_t local_round = (blocks + cus - 1) / cus;
    const float local_efficiency =
        static_cast<float>(row.tile_m * row.tile_n) / static_cast<float>(row.tile_m + row.tile_n);
    const int64_t rest = p.m % row.tile_m;
    const bool earlier_round = local_round < round;
    const bool same_round = local_round == round;
    const bool fewer_empty = empty_cu > local_round * cus - blocks;
    const bool same_empty = empty_cu == local_round * cus - blocks;
    const bool more_efficient = local_efficiency > efficiency;
    const bool less_oob = rest == 0 ? oob > 0 : row.tile_m - rest < oob;
    const bool same_oob = row.tile_m - rest == oob;  // AITER's test, also when rest == 0
    if (earlier_round || (same_round && (fewer_empty || less_oob)) ||
        (same_round && same_empty && same_oob && more_efficient)) {
      round = local_round;
      empty_cu = local_round * cus - blocks;
      efficiency = local_efficiency;
      oob = rest == 0 ? 0 : row.tile_m - rest;
      choice->row = i;
      choice->split_k = static_cast<int>(split);
      choice->grid = LaunchGrid{static_cast<unsigned>(gx), static_cast<unsigned>(gy), static_cast<unsigned>(split)};
    }
  }
  if (choice->row < 0)
    return "no BF16 GEMM kernel in " + table.source + " serves M=" + std::to_string(p.m) + " N=" +
           std::to_string(p.n) + " K=" + std::to_string(p.k) + " (N must be a multiple of some tile_N)";
  return {};
}

}  // namespace jax_aiter::aiter
