// CUDA / HIP portability for the single-source kernels and handlers in csrc/gpu.
// The same .cu file is compiled as CUDA by nvcc and as HIP by clang; everything that differs between the two
// runtimes goes through this header: the stream and error types, the wave (warp) size, lane shuffles and
// vectorized memory access.
#pragma once

#include <cstdint>

#if defined(__HIP__) || defined(__HIPCC__)
#define JA_HIP 1
#include <hip/hip_runtime.h>
#else
#define JA_HIP 0
#include <cuda_runtime.h>
#endif

#include "jax_aiter/float_bits.h"

namespace jax_aiter::gpu {

#if JA_HIP
using Stream = hipStream_t;
using Status = hipError_t;
inline constexpr Status kSuccess = hipSuccess;
inline Status last_error() { return hipGetLastError(); }
inline const char* error_string(Status s) { return hipGetErrorString(s); }
inline Status multiprocessor_count(int device, int* count) {
  return hipDeviceGetAttribute(count, hipDeviceAttributeMultiprocessorCount, device);
}
template <typename Kernel>
Status max_active_blocks(int* blocks, Kernel kernel, int threads) {
  return hipOccupancyMaxActiveBlocksPerMultiprocessor(blocks, kernel, threads, 0);
}
#else
using Stream = cudaStream_t;
using Status = cudaError_t;
inline constexpr Status kSuccess = cudaSuccess;
inline Status last_error() { return cudaGetLastError(); }
inline const char* error_string(Status s) { return cudaGetErrorString(s); }
inline Status multiprocessor_count(int device, int* count) {
  return cudaDeviceGetAttribute(count, cudaDevAttrMultiProcessorCount, device);
}
template <typename Kernel>
Status max_active_blocks(int* blocks, Kernel kernel, int threads) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, kernel, threads, 0);
}
#endif

// Wave (warp) size. NVIDIA: 32. AMD: 64 on gfx9 (MI300 = gfx942, MI350 = gfx950), 32 by default on gfx10+.
// A HIP host pass serves every offload architecture at once, so host code cannot know the wave size: launch
// shapes use kMaxWaveSize multiples and shared arrays kMaxWaves entries, valid for any wave size. The host
// pass still parses device bodies (never runs them); it sees kMaxWaveSize.
inline constexpr int kMaxWaveSize = 64;
inline constexpr int kMinWaveSize = 32;
inline constexpr int kMaxBlockThreads = 1024;
inline constexpr int kMaxWaves = kMaxBlockThreads / kMinWaveSize;

#if !JA_HIP
inline constexpr int kWaveSize = 32;
#elif defined(__HIP_DEVICE_COMPILE__)
#if defined(__AMDGCN_WAVEFRONT_SIZE)
inline constexpr int kWaveSize = __AMDGCN_WAVEFRONT_SIZE;
#elif defined(__GFX9__)
inline constexpr int kWaveSize = 64;
#else
inline constexpr int kWaveSize = 32;
#endif
#else
inline constexpr int kWaveSize = kMaxWaveSize;
#endif
static_assert(kWaveSize == 32 || kWaveSize == 64, "unexpected wave size");

// Butterfly exchange among groups of `width` lanes (a power of two <= kWaveSize); every lane of the wave
// must take part.
__device__ __forceinline__ float shfl_xor(float v, int lane_mask, int width) {
#if JA_HIP
  return __shfl_xor(v, lane_mask, width);
#else
  return __shfl_xor_sync(0xffffffffu, v, lane_mask, width);
#endif
}

__device__ __forceinline__ uint32_t shfl_xor(uint32_t v, int lane_mask, int width) {
#if JA_HIP
  return __shfl_xor(v, lane_mask, width);
#else
  return __shfl_xor_sync(0xffffffffu, v, lane_mask, width);
#endif
}

// Running max of |x| that lets NaN win (so a block's amax is non-finite when any element is). The result is
// a non-negative float whose bits order like the values, NaN included (any NaN compares >= Inf as bits).
__device__ __forceinline__ float amax_step(float acc, float x) {
#if JA_HIP
  const uint32_t a = __float_as_uint(acc), b = __float_as_uint(x) & 0x7FFFFFFFu;
  return __uint_as_float(a > b ? a : b);
#else
  // One FMNMX with an |x| operand; .NaN makes NaN propagate (plain fmaxf drops it).
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(acc), "f"(fabsf(x)));
  return r;
#endif
}

// Minimum over the wave, as unsigned integers; every lane of the wave must take part.
__device__ __forceinline__ uint32_t wave_min(uint32_t v) {
  constexpr int kStages = kWaveSize == 64 ? 6 : 5;
#pragma unroll
  for (int stage = kStages - 1; stage >= 0; --stage) {
    const uint32_t other = shfl_xor(v, 1 << stage, kWaveSize);
    v = other < v ? other : v;
  }
  return v;
}

__device__ __forceinline__ float wave_sum(float v) {
  constexpr int kStages = kWaveSize == 64 ? 6 : 5;
#pragma unroll
  for (int stage = kStages - 1; stage >= 0; --stage) v += shfl_xor(v, 1 << stage, kWaveSize);
  return v;
}

// Sum over the block. blockDim.x must be a multiple of kMaxWaveSize; `scratch` holds kMaxWaves floats and
// may be reused after the call (the trailing barrier protects it). Every thread adds the per-wave partial
// sums in the same order, so all threads get the same, deterministic result.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  v = wave_sum(v);
  const int wave = static_cast<int>(threadIdx.x) / kWaveSize;
  if (static_cast<int>(threadIdx.x) % kWaveSize == 0) scratch[wave] = v;
  __syncthreads();
  float total = 0.f;
  const int waves = static_cast<int>(blockDim.x) / kWaveSize;
  for (int w = 0; w < waves; ++w) total += scratch[w];
  __syncthreads();
  return total;
}

// N elements of T moved as one access of N * sizeof(T) bytes (16 bytes in the vectorized kernel paths).
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

template <int N, typename T>
__device__ __forceinline__ Vec<T, N> load_vec(const T* p) {
  return *reinterpret_cast<const Vec<T, N>*>(p);
}

template <int N, typename T>
__device__ __forceinline__ void store_vec(T* p, const Vec<T, N>& v) {
  *reinterpret_cast<Vec<T, N>*>(p) = v;
}

// A 16-byte store to global memory that stays one instruction: nvcc can split store_vec's aggregate copy into
// four 4-byte stores (it does in the MXFP4 dequantization kernel).
__device__ __forceinline__ void store_global_16(uint32_t* p, const Vec<uint32_t, 4>& v) {
#if JA_HIP
  store_vec<4>(p, v);
#else
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.v[0]), "r"(v.v[1]), "r"(v.v[2]),
               "r"(v.v[3])
               : "memory");
#endif
}

// Elements per 16-byte access for a storage type.
template <typename T>
inline constexpr int kVec16 = static_cast<int>(16 / sizeof(T));

inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

}  // namespace jax_aiter::gpu
