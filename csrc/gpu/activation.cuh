// SiLU-and-mul on the GPU (CUDA and HIP from this one source). x = [gate | up] along the last axis:
// forward out = silu(gate) * up; backward d_gate = dout * up * s * (1 + gate * (1 - s)), d_up = dout * gate * s
// with s = sigmoid(gate). Float32 math, as csrc/cpu/activation.cc.
#pragma once

#include <cstdint>

#include "jax_aiter/element.h"
#include "jax_aiter/gpu.h"

namespace jax_aiter::kernels {

template <typename S>
struct SiluAndMulArgs {
  const S* x;     // [rows, 2 * half]
  const S* dout;  // [rows, half]; backward only
  S* out;         // forward: [rows, half]; backward: dx, [rows, 2 * half]
  int64_t rows;
  int64_t half;
};

inline constexpr int kSiluThreads = 256;
// Accesses per thread: all its loads are issued before the first use, to keep enough bytes in flight.
inline constexpr int kSiluItems = 4;
// Accesses one block covers in a row; a row takes ceil(accesses / this) blocks. (Blocks sized to split a row
// exactly, e.g. 224 threads for 14336 bf16 columns, measured slower on an H200 than 256 threads with an
// idle tail.)
inline constexpr int64_t kSiluBlockAccesses = int64_t{kSiluThreads} * kSiluItems;

__device__ __forceinline__ float sigmoid(float v) { return 1.f / (1.f + expf(-v)); }

// Block b covers accesses [col_block * kSiluBlockAccesses, ...) of row b / col_blocks, each thread
// taking kSiluItems accesses of kVec outputs strided by the block size. Rows and column blocks come from one
// 32-bit division per block, not a 64-bit one per access.
template <typename E, int kVec, bool kBackward>
__global__ void __launch_bounds__(kSiluThreads) silu_and_mul_kernel(SiluAndMulArgs<typename E::Storage> a,
                                                                    uint32_t col_blocks) {
  using S = typename E::Storage;
  const int64_t per_row = a.half / kVec;
  const uint32_t row = blockIdx.x / col_blocks;
  const uint32_t col_block = blockIdx.x - row * col_blocks;
  const int64_t first = int64_t{col_block} * kSiluBlockAccesses + threadIdx.x;
  const S* gate_row = a.x + int64_t{row} * 2 * a.half;
  const int64_t out_row = int64_t{row} * a.half;

  gpu::Vec<S, kVec> gate[kSiluItems], up[kSiluItems], dout[kSiluItems];
#pragma unroll
  for (int i = 0; i < kSiluItems; ++i) {
    const int64_t j = first + i * kSiluThreads;
    if (j >= per_row) continue;
    gate[i] = gpu::load_vec<kVec>(gate_row + j * kVec);
    up[i] = gpu::load_vec<kVec>(gate_row + a.half + j * kVec);
    if (kBackward) dout[i] = gpu::load_vec<kVec>(a.dout + out_row + j * kVec);
  }
#pragma unroll
  for (int i = 0; i < kSiluItems; ++i) {
    const int64_t j = first + i * kSiluThreads;
    if (j >= per_row) continue;
    if (!kBackward) {
      gpu::Vec<S, kVec> o;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float g = E::load(gate[i].v[k]);
        o.v[k] = E::store(g * sigmoid(g) * E::load(up[i].v[k]));
      }
      gpu::store_vec<kVec>(a.out + out_row + j * kVec, o);
    } else {
      gpu::Vec<S, kVec> dg, du;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float g = E::load(gate[i].v[k]);
        const float u = E::load(up[i].v[k]);
        const float d = E::load(dout[i].v[k]);
        const float s = sigmoid(g);
        dg.v[k] = E::store(d * u * s * (1.f + g * (1.f - s)));
        du.v[k] = E::store(d * g * s);
      }
      S* dx_row = a.out + int64_t{row} * 2 * a.half;
      gpu::store_vec<kVec>(dx_row + j * kVec, dg);
      gpu::store_vec<kVec>(dx_row + a.half + j * kVec, du);
    }
  }
}

// Column blocks per row, and thread blocks one launch needs (the handler rejects more than a 1-D grid holds).
template <typename S>
int64_t silu_and_mul_col_blocks(int64_t half, bool wide) {
  const int64_t per_row = half / (wide ? gpu::kVec16<S> : 1);
  return (per_row + kSiluBlockAccesses - 1) / kSiluBlockAccesses;
}

template <typename S>
int64_t silu_and_mul_blocks(int64_t rows, int64_t half, bool wide) {
  return rows * silu_and_mul_col_blocks<S>(half, wide);
}

template <typename E, bool kBackward>
gpu::Status launch_silu_and_mul(const SiluAndMulArgs<typename E::Storage>& a, bool wide, gpu::Stream stream) {
  using S = typename E::Storage;
  constexpr int kWide = gpu::kVec16<S>;
  if (a.rows == 0 || a.half == 0) return gpu::kSuccess;
  const auto col_blocks = static_cast<uint32_t>(silu_and_mul_col_blocks<S>(a.half, wide));
  const auto blocks = static_cast<unsigned>(a.rows * col_blocks);
  if (wide)
    silu_and_mul_kernel<E, kWide, kBackward><<<blocks, kSiluThreads, 0, stream>>>(a, col_blocks);
  else
    silu_and_mul_kernel<E, 1, kBackward><<<blocks, kSiluThreads, 0, stream>>>(a, col_blocks);
  return gpu::last_error();
}

// 16-byte accesses need half % (16 / sizeof(S)) == 0 and aligned buffers.
template <typename S>
bool silu_and_mul_wide(const SiluAndMulArgs<S>& a) {
  return a.half % gpu::kVec16<S> == 0 && gpu::aligned16(a.x) && gpu::aligned16(a.out) &&
         (a.dout == nullptr || gpu::aligned16(a.dout));
}

}  // namespace jax_aiter::kernels
