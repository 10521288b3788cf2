// MXFP4 GEMM on AITER's a4w4 ASM kernels (gfx950): out = A . B^T with per-1x32 e8m0 block scales, bfloat16 out.
//
// Operands (layouts in docs/mxfp4-contract.md and docs/mxfp4.md): A uint8 [M, K/2] fp4x2, plain
// row-major; B uint8 [N, K/2] fp4x2, shuffled (16,16); A_scale and B_scale e8m0 (uint8 or float8_e8m0fnu),
// shuffled and zero-padded to [ceil(R/256)*256, ceil(K/32/8)*8]. Result: out bfloat16 [ceil(M/32)*32, N] —
// the kernels write whole 32-row groups; the caller slices the first M rows.

#include <cstring>
#include <string>

#include "asm_kernel_args.h"
#include "gemm_select.h"
#include "handler.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jax_aiter::aiter {
namespace {

constexpr const char* kOp = "ja_aiter_gemm_fp4";
// The family folder and table of AITER's fp4 GEMM code objects (gfx950 only); build-aiter checks both.
constexpr const char* kFamily = "f4gemm";
constexpr const char* kTable = "f4gemm_bf16_per1x32Fp4.csv";

int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

bool is_scale_type(ffi::DataType t) { return t == ffi::DataType::U8 || t == ffi::DataType::F8E8M0FNU; }

ffi::Error GemmFp4(hipStream_t stream, int32_t device, ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::AnyBuffer a_scale,
                   ffi::AnyBuffer b_scale, ffi::Result<ffi::AnyBuffer> out) {
  const auto a_dims = a.dimensions();
  const auto b_dims = b.dimensions();
  const auto as_dims = a_scale.dimensions();
  const auto bs_dims = b_scale.dimensions();
  const auto out_dims = out->dimensions();
  if (a_dims.size() != 2 || b_dims.size() != 2 || as_dims.size() != 2 || bs_dims.size() != 2 || out_dims.size() != 2)
    return invalid(kOp, "all operands and out must be rank 2");
  if (a.element_type() != ffi::DataType::U8 || b.element_type() != ffi::DataType::U8)
    return invalid(kOp, "A and B must be uint8 (two fp4 codes per byte)");
  if (!is_scale_type(a_scale.element_type()) || !is_scale_type(b_scale.element_type()))
    return invalid(kOp, "A_scale and B_scale must be uint8 or float8_e8m0fnu");
  if (out->element_type() != ffi::DataType::BF16) return invalid(kOp, "out must be bfloat16");
  const int64_t m = a_dims[0], n = b_dims[0], k = 2 * a_dims[1];
  if (b_dims[1] != a_dims[1]) return invalid(kOp, "A and B must have the same number of packed columns (K/2)");
  // The (16,16) shuffle of B needs N % 16 == 0 and (K/2) % 32 == 0.
  if (k % 64 != 0 || n % 16 != 0) return invalid(kOp, "K must be a multiple of 64 and N a multiple of 16");
  const int64_t scale_cols = round_up(k / 32, 8);
  if (as_dims[0] != round_up(m, 256) || as_dims[1] != scale_cols)
    return invalid(kOp, "A_scale must be the shuffled, padded [ceil(M/256)*256, ceil(K/256)*8] layout");
  if (bs_dims[0] != round_up(n, 256) || bs_dims[1] != scale_cols)
    return invalid(kOp, "B_scale must be the shuffled, padded [ceil(N/256)*256, ceil(K/256)*8] layout");
  if (out_dims[0] != fp4_output_rows(m) || out_dims[1] != n) return invalid(kOp, "out must be [ceil(M/32)*32, N]");
  if (m == 0 || n == 0) return ffi::Error::Success();

  DeviceInfo info;
  const KernelTable* table = nullptr;
  if (ffi::Error err = gemm_kernel_table(kOp, device, kFamily, kTable, " (AITER has FP4 GEMM kernels for gfx950 only)",
                                         &info, &table);
      err.failure())
    return err;
  Fp4Choice choice;
  if (std::string err = select_fp4_kernel(*table, GemmProblem{m, n, k, info.arch}, info.num_cu, &choice);
      !err.empty())
    return invalid(kOp, err);
  const KernelRow& row = table->rows[choice.row];

  // Every field the host does not set must read as zero (C, its strides and the unused second strides).
  Fp4GemmArgs args;
  std::memset(&args, 0, sizeof(args));
  args.ptr_d = out->untyped_data();
  args.ptr_a = a.untyped_data();
  args.ptr_b = b.untyped_data();
  args.alpha = 1.0f;
  args.beta = 0.0f;
  args.stride_d0 = args.stride_c0 = static_cast<uint32_t>(n);  // output elements
  args.stride_a0 = static_cast<uint32_t>(k);                   // fp4 elements = row bytes * 2
  args.stride_b0 = static_cast<uint32_t>(k);
  args.m = static_cast<uint32_t>(m);
  args.n = static_cast<uint32_t>(n);
  args.k = static_cast<uint32_t>(k);
  args.ptr_scale_a = a_scale.untyped_data();
  args.ptr_scale_b = b_scale.untyped_data();
  args.stride_scale_a0 = static_cast<uint32_t>(scale_cols);  // bytes
  args.stride_scale_b0 = static_cast<uint32_t>(scale_cols);
  args.log2_k_split = choice.log2_k_split;
  // The K splits add into the output with atomics: it starts from zero (and sums are not bitwise reproducible
  // across split choices).
  const size_t zero_out = choice.log2_k_split > 0 ? out->size_bytes() : 0;
  return launch_gemm(kOp, stream, device, info.arch, kFamily, row, choice.grid, &args, sizeof(args),
                     {{out->untyped_data(), zero_out}});
}

}  // namespace
}  // namespace jax_aiter::aiter

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaAiterGemmFp4, jax_aiter::aiter::GemmFp4,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<hipStream_t>>()
                                  .Ctx<xla::ffi::DeviceOrdinal>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>());
