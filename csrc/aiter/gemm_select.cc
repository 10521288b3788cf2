#include "gemm_select.h"

#include <algorithm>
#include <limits>

#include "asm_kernel_args.h"

namespace jax_aiter::aiter {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// What the heuristic minimises, compared in order. Reuse (tileM*tileN/(tileM+tileN), larger is better) is kept
// as a fraction so ties compare exactly.
struct Cost {
  int64_t rounds = 0;
  int64_t idle_cus = 0;
  int64_t m_padding = 0;
  int64_t reuse_num = 0;
  int64_t reuse_den = 1;

  bool better_than(const Cost& o) const {
    if (rounds != o.rounds) return rounds < o.rounds;
    if (idle_cus != o.idle_cus) return idle_cus < o.idle_cus;
    if (m_padding != o.m_padding) return m_padding < o.m_padding;
    return reuse_num * o.reuse_den > o.reuse_num * reuse_den;
  }
};

Cost cost_of(int64_t blocks, int num_cu, const KernelRow& row, int64_t m_padding) {
  Cost c;
  c.rounds = ceil_div(blocks, num_cu);
  c.idle_cus = c.rounds * num_cu - blocks;
  c.m_padding = m_padding;
  c.reuse_num = static_cast<int64_t>(row.tile_m) * row.tile_n;
  c.reuse_den = static_cast<int64_t>(row.tile_m) + row.tile_n;
  return c;
}

constexpr int64_t kMaxU32 = std::numeric_limits<uint32_t>::max();

std::string check_problem(const GemmProblem& p, int num_cu) {
  if (p.m <= 0 || p.n <= 0 || p.k <= 0) return "M, N and K must be positive";
  if (p.m > kMaxU32 || p.n > kMaxU32 || p.k > kMaxU32) return "M, N and K must fit in 32 bits";
  if (num_cu <= 0) return "the device reports no compute units";
  return {};
}

}  // namespace

int64_t fp4_output_rows(int64_t m) { return ceil_div(m, 32) * 32; }

std::string select_fp4_kernel(const KernelTable& table, const GemmProblem& p, int num_cu, Fp4Choice* choice) {
  if (std::string err = check_problem(p, num_cu); !err.empty()) return err;
  *choice = Fp4Choice{};
  Cost best;
  for (int i = 0; i < static_cast<int>(table.rows.size()); ++i) {
    const KernelRow& row = table.rows[i];
    // B arrives pre-shuffled; persistent-grid kernels take a launch contract AITER does not document.
    if (!row.b_preshuffle || row.persistent) continue;
    // AITER: the 128x512 tile does not handle a partial N tile; the others mask it.
    if (row.tile_m == 128 && row.tile_n == 512 && p.n % 512 != 0) continue;
    const int64_t tiles = ceil_div(p.m, row.tile_m) * ceil_div(p.n, row.tile_n);
    const int max_log2 = row.split_k ? 4 : 0;
    for (int log2 = 0; log2 <= max_log2; ++log2) {
      const int64_t split = int64_t{1} << log2;
      if (p.k % split != 0) continue;
      // Each split covers K / split rounded up to 256, so fewer z-blocks than splits may be launched.
      const int64_t k_per_block = ceil_div(p.k / split, 256) * 256;
      const int64_t z = ceil_div(p.k, k_per_block);
      const Cost cost = cost_of(tiles * z, num_cu, row, 0);
      if (choice->row < 0 || cost.better_than(best)) {
        best = cost;
        choice->row = i;
        choice->log2_k_split = log2;
        choice->grid = LaunchGrid{static_cast<unsigned>(ceil_div(p.n, row.tile_n)),
                                  static_cast<unsigned>(ceil_div(p.m, row.tile_m)), static_cast<unsigned>(z)};
      }
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
  Cost best;
  for (int i = 0; i < static_cast<int>(table.rows.size()); ++i) {
    const KernelRow& row = table.rows[i];
    if (row.b_preshuffle || row.bias || p.n % row.tile_n != 0) continue;
    const int64_t gx = p.n / row.tile_n;
    const int64_t gy = ceil_div(p.m, row.tile_m);
    const int64_t tiles = gx * gy;
    int64_t split = 1;
    if (row.split_k && row.sub_k > 0 && p.k / row.sub_k >= 2) {
      split = std::max<int64_t>(2, std::min({static_cast<int64_t>(num_cu) / tiles, int64_t{16}, p.k / row.sub_k}));
      // One semaphore word per output tile: a split launch cannot have more tiles than the semaphore holds.
      if (tiles > kBf16SemaphoreWords) continue;
    }
    const int64_t m_padding = (row.tile_m - p.m % row.tile_m) % row.tile_m;
    const Cost cost = cost_of(tiles * split, num_cu, row, m_padding);
    if (choice->row < 0 || cost.better_than(best)) {
      best = cost;
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
