// RMSNorm on the GPU (CUDA and HIP from this one source): forward, optionally with the residual add fused in
// front, and backward (dx, and dgamma through per-block partial sums reduced by a second kernel).
// Numerics follow csrc/cpu/rmsnorm.cc and jax_aiter/ref/rmsnorm.py: float32 math, y = (x / rms) * gamma,
// exact for every finite input. A float32 square overflows from 2^64: a row whose sum of squares is not finite
// is summed again with its elements scaled by 2^-80 (exactly: a power of two), as the reference does; ordinary
// rows pay nothing for it but one test of the block's sum. The forward saves rms (always a normal float32 for
// finite x), and the backward works with x / rms, never with 1/rms^3.
#pragma once

#include <cfloat>
#include <cstdint>
#include <initializer_list>

#include "jax_aiter/element.h"
#include "jax_aiter/gpu.h"
#include "row_config.cuh"

namespace jax_aiter::kernels {

template <typename S>
struct RmsNormForwardArgs {
  const S* x;
  const S* residual;  // null: plain RMSNorm; else s = round(x + residual) is written to `sum` and normalized
  const S* gamma;
  S* y;
  S* sum;
  float* rms;  // [rows]
  int64_t rows;
  int64_t cols;
  float epsilon;
};

template <typename S>
struct RmsNormBackwardArgs {
  const S* dy;
  const S* x;
  const S* gamma;
  const float* rms;
  const S* d_sum;  // null, or the cotangent of the fused add's sum output, added to dx
  S* dx;
  float* dgamma_partial;  // [>= blocks, cols]: row b is block b's sum of dy * x / rms over its rows
  int64_t rows;
  int64_t cols;
};

namespace rms_norm_detail {

// Loads one access of the norm's input as floats. With the fused add the sum is rounded to the storage
// type, written, and the rounded value is what gets normalized (as in the reference).
template <typename E, int kVec>
__device__ __forceinline__ void load_input(const RmsNormForwardArgs<typename E::Storage>& a, int64_t at,
                                           float (&out)[kVec]) {
  using S = typename E::Storage;
  const gpu::Vec<S, kVec> xv = gpu::load_vec<kVec>(a.x + at);
  if (a.residual == nullptr) {
#pragma unroll
    for (int k = 0; k < kVec; ++k) out[k] = E::load(xv.v[k]);
    return;
  }
  const gpu::Vec<S, kVec> rv = gpu::load_vec<kVec>(a.residual + at);
  gpu::Vec<S, kVec> sv;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    sv.v[k] = E::store(E::load(xv.v[k]) + E::load(rv.v[k]));
    out[k] = E::load(sv.v[k]);
  }
  gpu::store_vec<kVec>(a.sum + at, sv);
}

template <typename E, int kVec>
__device__ __forceinline__ void store_output(const RmsNormForwardArgs<typename E::Storage>& a, int64_t at, int col,
                                             const float (&v)[kVec], float scale) {
  using S = typename E::Storage;
  const gpu::Vec<S, kVec> gv = gpu::load_vec<kVec>(a.gamma + col);
  gpu::Vec<S, kVec> yv;
#pragma unroll
  for (int k = 0; k < kVec; ++k) yv.v[k] = E::store(v[k] * scale * E::load(gv.v[k]));
  gpu::store_vec<kVec>(a.y + at, yv);
}

template <typename E, int kVec>
__device__ __forceinline__ void load_floats(const typename E::Storage* p, float (&out)[kVec]) {
  const auto v = gpu::load_vec<kVec>(p);
#pragma unroll
  for (int k = 0; k < kVec; ++k) out[k] = E::load(v.v[k]);
}

// The scale of a row whose float32 sum of squares overflowed: (2^128 * 2^-80)^2 times 2^31 elements stays
// finite. Such a row has an element above 2^48; the squares pushed below float32's normal range are those of
// elements under 2^17, together less than 2^-32 of the sum.
inline constexpr float kOverflowScale = 0x1p-80f;

// Whether a block's sum of squares needs the scaled pass: it overflowed, or the row holds Inf or NaN (which the
// scaled pass propagates as the plain one would). Uniform over the block: block_sum gives every thread the same.
__device__ __forceinline__ bool needs_scaling(float sum_sq) { return !(sum_sq <= FLT_MAX); }

struct RowScale {
  float inv;  // 1 / rms of the row scaled by `pre`: y = (x * pre) * inv * gamma
  float rms;  // rms of the row itself, what the forward saves
};

// sum_sq: the row's sum of squares, its elements scaled by pre (1 or kOverflowScale).
__device__ __forceinline__ RowScale row_scale(float sum_sq, int64_t cols, float epsilon, float pre) {
  const float u = sum_sq / static_cast<float>(cols) + epsilon * pre * pre;
  float rms = sqrtf(u) / pre;
  if (rms > FLT_MAX && u <= FLT_MAX) rms = FLT_MAX;  // a row at float32's largest values may round past it
  return {rsqrtf(u), rms};
}

}  // namespace rms_norm_detail

namespace rms_norm_detail {

// A compensated (Kahan) float sum: its error stays a few ulp however many terms it takes, where a plain serial
// float sum loses digits with its length (a thread's share of a row of millions, or a block's share of millions
// of rows for dgamma).
struct CompensatedSum {
  float sum = 0.f;
  float carry = 0.f;
  __device__ __forceinline__ void add(float x) {
    const float y = x - carry;
    const float t = sum + y;
    carry = (t - sum) - y;
    sum = t;
  }
};

}  // namespace rms_norm_detail

template <typename E, int kVec, int kItems>
__global__ void __launch_bounds__(kRowMaxThreads) rms_norm_forward_kernel(RmsNormForwardArgs<typename E::Storage> a) {
  using namespace rms_norm_detail;
  __shared__ float scratch[gpu::kMaxWaves];
  const int64_t row_start = static_cast<int64_t>(blockIdx.x) * a.cols;
  const int accesses = static_cast<int>(a.cols / kVec);
  const int stride = static_cast<int>(blockDim.x);
  const int t = static_cast<int>(threadIdx.x);
  float sum_sq = 0.f;

  if (accesses <= kItems * stride) {
    float v[kItems][kVec];
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int j = t + i * stride;
      if (j < accesses) {
        load_input<E, kVec>(a, row_start + int64_t{j} * kVec, v[i]);
#pragma unroll
        for (int k = 0; k < kVec; ++k) sum_sq += v[i][k] * v[i][k];
      }
    }
    float total = gpu::block_sum(sum_sq, scratch);
    float pre = 1.f;
    if (needs_scaling(total)) {
      pre = kOverflowScale;
      float scaled_sum_sq = 0.f;
#pragma unroll
      for (int i = 0; i < kItems; ++i) {
        if (t + i * stride < accesses) {
#pragma unroll
          for (int k = 0; k < kVec; ++k) {
            v[i][k] *= kOverflowScale;
            scaled_sum_sq += v[i][k] * v[i][k];
          }
        }
      }
      total = gpu::block_sum(scaled_sum_sq, scratch);
    }
    const RowScale scale = row_scale(total, a.cols, a.epsilon, pre);
    if (t == 0) a.rms[blockIdx.x] = scale.rms;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int j = t + i * stride;
      if (j < accesses) store_output<E, kVec>(a, row_start + int64_t{j} * kVec, j * kVec, v[i], scale.inv);
    }
    return;
  }

  // Streaming path for rows longer than the registers hold: later passes re-read the input (the fused sum
  // from `sum`, which this same thread wrote in the first pass).
  CompensatedSum row_sum_sq;
  for (int j = t; j < accesses; j += stride) {
    float v[kVec];
    load_input<E, kVec>(a, row_start + int64_t{j} * kVec, v);
    float access_sum_sq = 0.f;
#pragma unroll
    for (int k = 0; k < kVec; ++k) access_sum_sq += v[k] * v[k];
    row_sum_sq.add(access_sum_sq);
  }
  using S = typename E::Storage;
  const S* normalized = a.residual == nullptr ? a.x : a.sum;
  float total = gpu::block_sum(row_sum_sq.sum, scratch);
  float pre = 1.f;
  if (needs_scaling(total)) {
    pre = kOverflowScale;
    CompensatedSum scaled_sum_sq;
    for (int j = t; j < accesses; j += stride) {
      float v[kVec];
      load_floats<E, kVec>(normalized + row_start + int64_t{j} * kVec, v);
      float access_sum_sq = 0.f;
#pragma unroll
      for (int k = 0; k < kVec; ++k) access_sum_sq += (v[k] * kOverflowScale) * (v[k] * kOverflowScale);
      scaled_sum_sq.add(access_sum_sq);
    }
    total = gpu::block_sum(scaled_sum_sq.sum, scratch);
  }
  const RowScale scale = row_scale(total, a.cols, a.epsilon, pre);
  if (t == 0) a.rms[blockIdx.x] = scale.rms;
  for (int j = t; j < accesses; j += stride) {
    float v[kVec];
    load_floats<E, kVec>(normalized + row_start + int64_t{j} * kVec, v);
#pragma unroll
    for (int k = 0; k < kVec; ++k) v[k] *= pre;
    store_output<E, kVec>(a, row_start + int64_t{j} * kVec, j * kVec, v, scale.inv);
  }
}

namespace rms_norm_detail {

// One term of mean(dy * gamma * n), n = x / rms, as (dy * gamma) * (n / cols): the sum of these is at most
// max |dy * gamma| (mean(n^2) <= 1), so it overflows only where dx does. 1/rms is a float32 subnormal for rms
// above 2^126, with 21 or more significant bits there: GPU kernels keep subnormals (XLA's CPU runtime does not,
// hence the CPU kernel's double).
__device__ __forceinline__ float mean_dot_term(float dy, float g, float x, float inv_rms, float inv_cols) {
  return dy * g * (x * inv_rms * inv_cols);
}

// Writes dx = (dy * gamma - n * mean_dot) / rms (+ d_sum) for one access, n = x / rms; `mean_dot` holds the
// row's mean(dy * gamma * n) and d_sum the fused add's cotangent (zeros without it).
template <typename E, int kVec>
__device__ __forceinline__ void backward_store(const RmsNormBackwardArgs<typename E::Storage>& a, int64_t at,
                                               const float (&dy)[kVec], const float (&n)[kVec],
                                               const float (&g)[kVec], const float (&d_sum)[kVec], float inv_rms,
                                               float mean_dot) {
  using S = typename E::Storage;
  gpu::Vec<S, kVec> out;
#pragma unroll
  for (int k = 0; k < kVec; ++k) out.v[k] = E::store((dy[k] * g[k] - n[k] * mean_dot) * inv_rms + d_sum[k]);
  gpu::store_vec<kVec>(a.dx + at, out);
}

}  // namespace rms_norm_detail

// With n = x / rms: dx = (dy * gamma - n * mean(dy * gamma * n)) / rms (+ d_sum); dgamma = sum over rows of dy * n.
// No 1/rms^3 (which overflows for rows far below sqrt(epsilon) with a tiny epsilon, and underflows for huge rows).
// Blocks stride over rows; each thread keeps its columns' dgamma sums in registers (or, for streaming rows,
// in its block's row of dgamma_partial) and writes them once at the end.
// kFused: d_sum is present (a template argument, so that the plain backward holds no registers for it).
// At least one block per multiprocessor: without that bound ptxas spills the scalar (kVec = 1) kernels' few
// extra registers to stay at its 32- and 40-register occupancy steps.
template <typename E, int kVec, int kItems, bool kFused>
__global__ void __launch_bounds__(kRowMaxThreads, 1)
    rms_norm_backward_kernel(RmsNormBackwardArgs<typename E::Storage> a) {
  using namespace rms_norm_detail;
  __shared__ float scratch[gpu::kMaxWaves];
  const int accesses = static_cast<int>(a.cols / kVec);
  const int stride = static_cast<int>(blockDim.x);
  const int t = static_cast<int>(threadIdx.x);
  const float inv_cols = 1.f / static_cast<float>(a.cols);
  float* partial = a.dgamma_partial + static_cast<int64_t>(blockIdx.x) * a.cols;

  if (accesses <= kItems * stride) {
    // dy, x and gamma stay in their storage type (half the registers of floats for 16-bit types) and are
    // widened where used; only the dgamma sums are float.
    using S = typename E::Storage;
    gpu::Vec<S, kVec> g[kItems];
    CompensatedSum acc[kItems][kVec];
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int j = t + i * stride;
      if (j < accesses) g[i] = gpu::load_vec<kVec>(a.gamma + j * kVec);
    }
    for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
      const int64_t row_start = row * a.cols;
      gpu::Vec<S, kVec> dy[kItems];
      gpu::Vec<S, kVec> x[kItems];
      // With the fused add, d_sum is loaded with dy and x (no load waits after the reduction) when one item
      // leaves room for it; with two, the dgamma sums' compensation takes those registers and d_sum is loaded
      // after the reduction.
      constexpr bool kEarlyDSum = kFused && kItems == 1;
      gpu::Vec<S, kVec> d_sum[kEarlyDSum ? kItems : 1];
      float dot = 0.f;
#pragma unroll
      for (int i = 0; i < kItems; ++i) {
        const int j = t + i * stride;
        if (j < accesses) {
          dy[i] = gpu::load_vec<kVec>(a.dy + row_start + int64_t{j} * kVec);
          x[i] = gpu::load_vec<kVec>(a.x + row_start + int64_t{j} * kVec);
          if constexpr (kEarlyDSum) d_sum[i] = gpu::load_vec<kVec>(a.d_sum + row_start + int64_t{j} * kVec);
        }
      }
#pragma unroll
      for (int i = 0; i < kItems; ++i) {
        if (t + i * stride < accesses) {
#pragma unroll
          for (int k = 0; k < kVec; ++k) dot += E::load(dy[i].v[k]) * E::load(g[i].v[k]) * E::load(x[i].v[k]);
        }
      }
      // The plain dot product sum(dy * gamma * x) overflows for x near float32's largest values (a row whose
      // block sum is not finite, which also holds for Inf or NaN inputs): such a row is summed again as
      // mean_dot_term's, from the registers.
      const float row_dot = gpu::block_sum(dot, scratch);
      const float inv_rms = 1.f / a.rms[row];
      float mean_dot = row_dot * inv_cols * inv_rms;
      if (!(fabsf(row_dot) <= FLT_MAX)) {
        float terms = 0.f;
#pragma unroll
        for (int i = 0; i < kItems; ++i) {
          if (t + i * stride < accesses) {
#pragma unroll
            for (int k = 0; k < kVec; ++k)
              terms += mean_dot_term(E::load(dy[i].v[k]), E::load(g[i].v[k]), E::load(x[i].v[k]), inv_rms, inv_cols);
          }
        }
        mean_dot = gpu::block_sum(terms, scratch);
      }
#pragma unroll
      for (int i = 0; i < kItems; ++i) {
        const int j = t + i * stride;
        if (j < accesses) {
          float dyf[kVec], nf[kVec], gf[kVec], dsf[kVec];
          gpu::Vec<S, kVec> late_d_sum;
          if constexpr (kFused && !kEarlyDSum) late_d_sum = gpu::load_vec<kVec>(a.d_sum + row_start + int64_t{j} * kVec);
#pragma unroll
          for (int k = 0; k < kVec; ++k) {
            dyf[k] = E::load(dy[i].v[k]);
            nf[k] = E::load(x[i].v[k]) * inv_rms;
            gf[k] = E::load(g[i].v[k]);
            if constexpr (kEarlyDSum) dsf[k] = E::load(d_sum[i].v[k]);
            else if constexpr (kFused) dsf[k] = E::load(late_d_sum.v[k]);
            else dsf[k] = 0.f;
            acc[i][k].add(dyf[k] * nf[k]);
          }
          backward_store<E, kVec>(a, row_start + int64_t{j} * kVec, dyf, nf, gf, dsf, inv_rms, mean_dot);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int j = t + i * stride;
      if (j < accesses) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) partial[j * kVec + k] = acc[i][k].sum;
      }
    }
    return;
  }

  for (int j = t; j < accesses; j += stride) {
#pragma unroll
    for (int k = 0; k < kVec; ++k) partial[j * kVec + k] = 0.f;
  }
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const int64_t row_start = row * a.cols;
    // Rows longer than the registers hold are read twice anyway: their mean is summed as mean_dot_term's
    // directly, at two multiplications an element.
    const float inv_rms = 1.f / a.rms[row];
    CompensatedSum dot;
    for (int j = t; j < accesses; j += stride) {
      float dy[kVec], x[kVec], g[kVec];
      load_floats<E, kVec>(a.dy + row_start + int64_t{j} * kVec, dy);
      load_floats<E, kVec>(a.x + row_start + int64_t{j} * kVec, x);
      load_floats<E, kVec>(a.gamma + j * kVec, g);
      float access_dot = 0.f;
#pragma unroll
      for (int k = 0; k < kVec; ++k) access_dot += mean_dot_term(dy[k], g[k], x[k], inv_rms, inv_cols);
      dot.add(access_dot);
    }
    const float mean_dot = gpu::block_sum(dot.sum, scratch);
    for (int j = t; j < accesses; j += stride) {
      float dy[kVec], n[kVec], g[kVec], d_sum[kVec] = {};
      load_floats<E, kVec>(a.dy + row_start + int64_t{j} * kVec, dy);
      load_floats<E, kVec>(a.x + row_start + int64_t{j} * kVec, n);
      load_floats<E, kVec>(a.gamma + j * kVec, g);
      if constexpr (kFused) load_floats<E, kVec>(a.d_sum + row_start + int64_t{j} * kVec, d_sum);
#pragma unroll
      for (int k = 0; k < kVec; ++k) n[k] *= inv_rms;
      backward_store<E, kVec>(a, row_start + int64_t{j} * kVec, dy, n, g, d_sum, inv_rms, mean_dot);
#pragma unroll
      for (int k = 0; k < kVec; ++k) partial[j * kVec + k] += dy[k] * n[k];
    }
  }
}

// dgamma[c] = sum over blocks of partial[b][c], in a fixed order (deterministic). A block covers 32 columns
// with 8 slices of blocks each; the slices meet in shared memory, so no lane shuffles and no wave size.
inline constexpr int kColumnSumCols = 32;
inline constexpr int kColumnSumSlices = 8;

template <typename E>
__global__ void __launch_bounds__(kColumnSumCols* kColumnSumSlices)
    column_sum_kernel(const float* partial, int parts, int64_t cols, typename E::Storage* out) {
  __shared__ float sums[kColumnSumSlices][kColumnSumCols + 1];
  const int lane = static_cast<int>(threadIdx.x) % kColumnSumCols;
  const int slice = static_cast<int>(threadIdx.x) / kColumnSumCols;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kColumnSumCols + lane;
  float s = 0.f;
  if (col < cols) {
    for (int p = slice; p < parts; p += kColumnSumSlices) s += partial[p * cols + col];
  }
  sums[slice][lane] = s;
  __syncthreads();
  if (slice == 0 && col < cols) {
    float total = 0.f;
#pragma unroll
    for (int i = 0; i < kColumnSumSlices; ++i) total += sums[i][lane];
    out[col] = E::store(total);
  }
}

// --- launchers ----------------------------------------------------------------------------------------

namespace rms_norm_detail {

template <typename S>
bool vectorizable(int64_t cols, std::initializer_list<const void*> pointers) {
  if (cols % gpu::kVec16<S> != 0) return false;
  for (const void* p : pointers)
    if (p != nullptr && !gpu::aligned16(p)) return false;
  return true;
}

template <typename E>
using ForwardKernel = void (*)(RmsNormForwardArgs<typename E::Storage>);
template <typename E>
using BackwardKernel = void (*)(RmsNormBackwardArgs<typename E::Storage>);

template <typename E, int kVec>
ForwardKernel<E> forward_kernel(int items) {
  if constexpr (kVec == 1) {
    return items == 1 ? rms_norm_forward_kernel<E, 1, 1> : rms_norm_forward_kernel<E, 1, kRowScalarMaxItems>;
  } else {
    switch (items) {
      case 1: return rms_norm_forward_kernel<E, kVec, 1>;
      case 2: return rms_norm_forward_kernel<E, kVec, 2>;
      case 4: return rms_norm_forward_kernel<E, kVec, 4>;
      default: return rms_norm_forward_kernel<E, kVec, 8>;
    }
  }
}

template <typename E, int kVec, bool kFused>
BackwardKernel<E> backward_kernel(int items) {
  static_assert(kRowMaxItemsBackward == 2 && kRowScalarMaxItems == 2, "instantiated for 1 and 2 items");
  return items == 1 ? rms_norm_backward_kernel<E, kVec, 1, kFused> : rms_norm_backward_kernel<E, kVec, 2, kFused>;
}

template <typename E>
BackwardKernel<E> backward_kernel(bool wide, bool fused, int items) {
  using S = typename E::Storage;
  if (wide)
    return fused ? backward_kernel<E, gpu::kVec16<S>, true>(items) : backward_kernel<E, gpu::kVec16<S>, false>(items);
  return fused ? backward_kernel<E, 1, true>(items) : backward_kernel<E, 1, false>(items);
}

}  // namespace rms_norm_detail

template <typename E>
gpu::Status launch_rms_norm_forward(const RmsNormForwardArgs<typename E::Storage>& a, gpu::Stream stream) {
  using S = typename E::Storage;
  if (a.rows == 0 || a.cols == 0) return gpu::kSuccess;
  const bool wide = rms_norm_detail::vectorizable<S>(a.cols, {a.x, a.residual, a.gamma, a.y, a.sum});
  const RowConfig config = wide ? row_config(a.cols, gpu::kVec16<S>, kRowMaxItems)
                              : row_config(a.cols, 1, kRowScalarMaxItems);
  const auto kernel = wide ? rms_norm_detail::forward_kernel<E, gpu::kVec16<S>>(config.items)
                           : rms_norm_detail::forward_kernel<E, 1>(config.items);
  kernel<<<static_cast<unsigned>(a.rows), config.threads, 0, stream>>>(a);
  return gpu::last_error();
}

// The backward runs in two launches and needs a [blocks, cols] float32 workspace (args.dgamma_partial).
// Blocks: one resident wave (every block runs from the start, so rows spread evenly), at most the rows of
// the workspace.
struct RmsNormBackwardPlan {
  RowConfig config;
  bool wide = false;
  int blocks = 0;
};

template <typename E>
gpu::Status plan_rms_norm_backward(const RmsNormBackwardArgs<typename E::Storage>& a, int device, int max_blocks,
                                   RmsNormBackwardPlan* plan) {
  using S = typename E::Storage;
  plan->wide = rms_norm_detail::vectorizable<S>(a.cols, {a.dy, a.x, a.gamma, a.d_sum, a.dx});
  const bool fused = a.d_sum != nullptr;
  plan->config = plan->wide ? row_config(a.cols, gpu::kVec16<S>, kRowMaxItemsBackward)
                             : row_config(a.cols, 1, kRowScalarMaxItems);
  const auto kernel = rms_norm_detail::backward_kernel<E>(plan->wide, fused, plan->config.items);
  int multiprocessors = 0;
  int per_multiprocessor = 0;
  if (auto s = gpu::multiprocessor_count(device, &multiprocessors); s != gpu::kSuccess) return s;
  if (auto s = gpu::max_active_blocks(&per_multiprocessor, kernel, plan->config.threads); s != gpu::kSuccess)
    return s;
  int64_t blocks = int64_t{multiprocessors} * (per_multiprocessor > 0 ? per_multiprocessor : 1);
  blocks = blocks < max_blocks ? blocks : max_blocks;
  plan->blocks = static_cast<int>(a.rows < blocks ? a.rows : blocks);
  return gpu::kSuccess;
}

template <typename E>
gpu::Status launch_rms_norm_backward(const RmsNormBackwardArgs<typename E::Storage>& a, const RmsNormBackwardPlan& plan,
                                     typename E::Storage* dgamma, gpu::Stream stream) {
  if (a.cols == 0) return gpu::kSuccess;
  if (plan.blocks > 0) {
    const auto kernel = rms_norm_detail::backward_kernel<E>(plan.wide, a.d_sum != nullptr, plan.config.items);
    kernel<<<plan.blocks, plan.config.threads, 0, stream>>>(a);
    if (auto s = gpu::last_error(); s != gpu::kSuccess) return s;
  }
  const auto column_blocks = static_cast<unsigned>((a.cols + kColumnSumCols - 1) / kColumnSumCols);
  column_sum_kernel<E><<<column_blocks, kColumnSumCols * kColumnSumSlices, 0, stream>>>(a.dgamma_partial, plan.blocks,
                                                                                        a.cols, dgamma);
  return gpu::last_error();
}

}  // namespace jax_aiter::kernels
