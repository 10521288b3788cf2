// Which ASM GEMM kernel (a row of AITER's kernel table) and which split of K serve a problem, and the launch
// grid. Plain C++ over KernelTable rows and the device's compute-unit count, so the CPU tests exercise exactly
// the code the ROCm handlers run (docs/aiter-bridge.md, "Kernel selection").
#pragma once

#include <cstdint>
#include <string>

#include "kernel_table.h"

namespace jax_aiter::aiter {

struct GemmProblem {
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
};

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

// FP4 (a4w4) with B pre-shuffled. Candidates: pre-shuffled, non-persistent rows; the 128x512 tile only when
// N % 512 == 0. Split-capable rows try 2^s in {1, 2, 4, 8, 16} dividing K; a split of K is rounded up to a
// multiple of 256, which fixes the number of z-blocks. The choice minimises (rounds, idle CUs in the last round,
// -tileM*tileN/(tileM+tileN)) with rounds = ceil(blocks / num_cu); the first row wins a full tie.
// Returns an empty string on success, else why nothing fits.
std::string select_fp4_kernel(const KernelTable& table, const GemmProblem& problem, int num_cu, Fp4Choice* choice);

// BF16 (a16w16), B not shuffled, no bias. Needs K % 64 == 0 and N % tileN == 0 (the kernels do not pad).
// A split-capable row with K / subK >= 2 runs split = max(2, min(num_cu / tiles, 16, K / subK)) and only while
// the output tiles fit the [16, 64] semaphore (tiles <= 1024). The choice minimises (rounds, idle CUs, rows
// of M padding, -tileM*tileN/(tileM+tileN)). M * N must stay below 2^31 (the kernels' 32-bit offsets).
std::string select_bf16_kernel(const KernelTable& table, const GemmProblem& problem, int num_cu,
                               Bf16Choice* choice);

}  // namespace jax_aiter::aiter
