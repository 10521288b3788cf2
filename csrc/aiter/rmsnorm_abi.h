// The C ABI of AITER's opus RMSNorm entry points, as csrc/aiter/rmsnorm.cc calls them through dlsym. Plain C++,
// so tools/aiter_api_layout.py can check these types against AITER's definitions at the pinned commit
// (csrc/kernels/rmsnorm/rmsnorm_opus_norm_entry.cu, JIT module module_rmsnorm) and the CPU tests against the
// recorded result (tests/fixtures/aiter/api_layout_e4048607.json).
//
// Pointers and the stream travel as size_t; dtype 0 = fp16, 1 = bf16, 2 = fp32; in_s = input row stride in
// elements; model_sensitive and gemma select variants the bridge does not use (0). Both return nothing and do
// nothing when rows or hidden is not positive.
#pragma once

#include <cstddef>

namespace jax_aiter::aiter {

using RmsNormOpus = void (*)(size_t out, size_t in, size_t weight, float epsilon, int rows, int hidden, int in_s,
                             int dtype, int model_sensitive, int gemma, size_t stream);
using AddRmsNormOpus = void (*)(size_t out, size_t in, size_t residual_in, size_t residual_out, size_t weight,
                                float epsilon, int rows, int hidden, int in_s, int dtype, int model_sensitive,
                                int gemma, size_t stream);

inline constexpr const char* kRmsNormOpusSymbol = "rms_norm_opus";
inline constexpr const char* kAddRmsNormOpusSymbol = "add_rms_norm_opus";

// The dtype codes.
inline constexpr int kOpusFp16 = 0;
inline constexpr int kOpusBf16 = 1;
inline constexpr int kOpusFp32 = 2;

}  // namespace jax_aiter::aiter
