// Launch shape of the row-wise kernels (RMSNorm forward and backward): one block walks one row at a time,
// each thread owning `items` accesses of `vec` elements at a stride of `threads` accesses, so a row of up to
// threads * items * vec elements stays in registers between the reduction and the write.
#pragma once

#include <cstdint>

#include "jax_aiter/gpu.h"

namespace jax_aiter::kernels {

// Register-resident rows take at most this many threads per block; longer rows run the streaming path of
// the same kernel (two passes, the second re-reading the row, mostly from L2).
inline constexpr int kRowMaxThreads = 512;
// Prefer this many threads and more items per thread while the row allows; the largest item count may use
// kRowMaxThreads. On an H200 (docs/performance.md) 256 x 2 for 4096 bf16 columns and 256 x 4 for 8192
// beat 512 x 1 and 512 x 2: more independent loads per thread hide latency better than more warps.
inline constexpr int kRowPreferredThreads = 256;
inline constexpr int kRowMaxItems = 8;
// The backward holds three or four operands and the dgamma sums per access; more than 2 accesses per
// thread spill. Rows beyond 2 x 512 accesses (8192 bf16) take the streaming path.
inline constexpr int kRowMaxItemsBackward = 2;
// Rows that allow no 16-byte access (odd lengths) load element by element; more items would only spill.
inline constexpr int kRowScalarMaxItems = 2;

// Rows longer than threads * items accesses take the kernels' streaming path.
struct RowConfig {
  int threads = 64;  // a multiple of gpu::kMaxWaveSize, so every wave is whole on any architecture
  int items = 1;     // accesses per thread per pass: a power of two up to the kernel's maximum
};

inline int round_up(int64_t value, int multiple) {
  return static_cast<int>((value + multiple - 1) / multiple * multiple);
}

// `vec` elements per access (16 bytes' worth when vectorized, else 1).
inline RowConfig row_config(int64_t cols, int vec, int max_items) {
  RowConfig config;
  const int64_t accesses = cols / vec;
  for (int items = 1; items <= max_items; items *= 2) {
    const int limit = items == max_items ? kRowMaxThreads : kRowPreferredThreads;
    const int64_t per_item = (accesses + items - 1) / items;
    if (per_item <= limit) {
      config.items = items;
      config.threads = round_up(per_item < 1 ? 1 : per_item, gpu::kMaxWaveSize);
      return config;
    }
  }
  config.items = max_items;
  config.threads = kRowMaxThreads;
  return config;
}

}  // namespace jax_aiter::kernels
