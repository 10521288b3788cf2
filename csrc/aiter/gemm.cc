// BF16 GEMM on AITER's a16w16 ASM kernels (gfx942, gfx950): out[M, N] = A[M, K] . B[N, K]^T, float32
// accumulation, out float32 or bfloat16 (the result buffer's dtype picks the kernel's output mode).
//
// Operands: A [Ma, K] with Ma >= M (rows past M are zero padding: the kernels load whole tileM-row tiles of A
// unpredicated, so when M < tileM the buffer must hold tileM rows; ROCm/aiter#5781), B [N, K], both bfloat16.
// Results: out [M, N]; semaphore u32 [16, 64], the split-K workspace (contents undefined afterwards).

#include <cstring>
#include <string>

#include "asm_kernel_args.h"
#include "gemm_select.h"
#include "handler.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jax_aiter::aiter {
namespace {

constexpr const char* kOp = "ja_aiter_gemm_bf16";
// The family folder and table of AITER's bf16 GEMM code objects; build-aiter checks both exist.
constexpr const char* kFamily = "bf16gemm";
constexpr const char* kTable = "bf16gemm_fp32bf16.csv";

ffi::Error GemmBf16(hipStream_t stream, int32_t device, ffi::AnyBuffer a, ffi::AnyBuffer b,
                    ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::Buffer<ffi::U32>> semaphore) {
  const auto a_dims = a.dimensions();
  const auto b_dims = b.dimensions();
  const auto out_dims = out->dimensions();
  if (a_dims.size() != 2 || b_dims.size() != 2 || out_dims.size() != 2)
    return invalid(kOp, "A, B and out must be rank 2");
  if (a.element_type() != ffi::DataType::BF16 || b.element_type() != ffi::DataType::BF16)
    return invalid(kOp, "A and B must be bfloat16");
  const bool out_bf16 = out->element_type() == ffi::DataType::BF16;
  if (!out_bf16 && out->element_type() != ffi::DataType::F32) return invalid(kOp, "out must be float32 or bfloat16");
  const int64_t m = out_dims[0], n = out_dims[1], k = a_dims[1];
  if (b_dims[1] != k || b_dims[0] != n) return invalid(kOp, "B must be [N, K] with out [M, N] and A [Ma, K]");
  if (a_dims[0] < m) return invalid(kOp, "A must have at least M rows");
  if (semaphore->element_count() != static_cast<size_t>(kBf16SemaphoreWords))
    return invalid(kOp, "the semaphore workspace must hold 16 x 64 words");
  if (m == 0 || n == 0) return ffi::Error::Success();

  DeviceInfo info;
  const KernelTable* table = nullptr;
  if (ffi::Error err = gemm_kernel_table(kOp, device, kFamily, kTable, "", &info, &table); err.failure()) return err;
  Bf16Choice choice;
  if (std::string err = select_bf16_kernel(*table, GemmProblem{m, n, k, info.arch}, info.num_cu, &choice);
      !err.empty())
    return invalid(kOp, err);
  const KernelRow& row = table->rows[choice.row];
  if (m < row.tile_m && a_dims[0] < row.tile_m)
    return invalid(kOp, "A must be zero-padded to " + std::to_string(row.tile_m) + " rows when M < tile_M");

  const size_t out_elem = out_bf16 ? 2 : 4;
  const size_t out_bytes = static_cast<size_t>(m) * n * out_elem;
  // Every field the host does not set must read as zero (bias, C and unused strides included).
  Bf16GemmArgs args;
  std::memset(&args, 0, sizeof(args));
  args.ptr_d = out->untyped_data();
  args.ptr_a = a.untyped_data();
  args.ptr_b = b.untyped_data();
  args.alpha = 1.0f;
  args.beta = 0.0f;
  args.stride_a0 = static_cast<uint32_t>(k * 2);  // bytes
  args.stride_b0 = static_cast<uint32_t>(k * 2);
  args.stride_c0 = args.stride_d0 = static_cast<uint32_t>(n * out_elem);
  args.m = static_cast<uint32_t>(m);
  args.n = static_cast<uint32_t>(n);
  args.k = static_cast<uint32_t>(k);
  args.splitk = static_cast<uint32_t>(choice.split_k);
  args.is_out_b16 = out_bf16 ? 1u : 0u;
  // Split-K accumulates into the output with atomics and orders the splits through the semaphore: both start
  // from zero on every call (a zero byte count zeroes nothing).
  const bool split = choice.split_k > 1;
  if (split) args.ptr_semaphore = semaphore->untyped_data();
  const size_t zero_out = split ? out_bytes : 0;
  const size_t zero_semaphore = split ? kBf16SemaphoreWords * sizeof(uint32_t) : 0;
  return launch_gemm(kOp, stream, device, info.arch, kFamily, row, choice.grid, &args, sizeof(args),
                     {{out->untyped_data(), zero_out}, {semaphore->untyped_data(), zero_semaphore}});
}

}  // namespace
}  // namespace jax_aiter::aiter

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaAiterGemmBf16, jax_aiter::aiter::GemmBf16,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<hipStream_t>>()
                                  .Ctx<xla::ffi::DeviceOrdinal>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::Buffer<xla::ffi::U32>>());
