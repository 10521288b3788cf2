// Which ASM GEMM kernel (a row of AITER's kernel table) and which split of K serve a problem, and the launch
// grid. Plain C++ over KernelTable rows and the device's compute-unit count, so the CPU tests exercise exactly
// the code the ROCm handlers run (docs/aiter-bridge.md, "Kernel selection").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernel_table.h"

namespace jax_aiter::aiter {

struct GemmProblem {
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  // The device architecture ("gfx950"). AITER walks the table rows in the order of an std::unordered_map keyed
  // by arch + kernel name, and its comparisons make the walk order matter; with the arch the selection walks
  // the same order (AITER built for this architecture), without it file order.
  std::string arch;
};

// The order in which AITER's selection visits the rows of `table` on `arch` (file order when arch is empty).
std::vector<int> aiter_walk_order(const KernelTable& table, const std::string& arch);

struct LaunchGrid {
  unsigned x = 0;  // tiles along N
  unsigned y = 0;  // tiles along M
  unsigned z = 0;  // K splits actually launched
};

struct Fp4Choice {
  int row = -1;          // index into KernelTable::rows
  int log2_k_split = 0;  // the kernel argument: K is split into 2^log2_k_split parts
  LaunchGrid grid;
};

struct Bf16Choice {
  int row = -1;
  int split_k = 1;  // the kernel argument `splitk`
  LaunchGrid grid;
};

// Rows the FP4 GEMM kernel writes: ceil(M / 32) * 32. The output buffer must have that many.
int64_t fp4_output_rows(int64_t m);

// FP4 (a4w4) with B pre-shuffled: AITER's heuristic as gemm_a4w4 runs it (log2_k_split = 0, so K is never
// split). Candidates: pre-shuffled, non-persistent rows; the 128x512 tile only when N % 512 == 0. A row replaces
// the current choice when it needs fewer rounds (ceil(tiles / num_cu)), or as many with fewer idle CUs or a
// larger integer tileM*tileN/(tileM+tileN). Returns an empty string on success, else why nothing fits.
std::string select_fp4_kernel(const KernelTable& table, const GemmProblem& problem, int num_cu, Fp4Choice* choice);

// BF16 (a16w16), B not shuffled, no bias: AITER's heuristic (bias-capable rows serve too). Needs K % 64 == 0
// and N % tileN == 0 (the kernels do not pad N). A split-capable row with K / subK >= 2 runs
// split = max(2, min(num_cu / tiles, 16, K / subK)) and is passed over when its tiles exceed the [16, 64]
// semaphore (AITER would refuse the launch). A row replaces the current choice when it needs fewer rounds, or
// as many with fewer idle CUs or less M padding, or as many with equal idle CUs and padding and a larger
// tileM*tileN/(tileM+tileN). M * N must stay below 2^31 (the kernels' 32-bit offsets).
std::string select_bf16_kernel(const KernelTable& table, const GemmProblem& problem, int num_cu,
                               Bf16Choice* choice);

}  // namespace jax_aiter::aiter
