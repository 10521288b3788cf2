// RMSNorm forward (alone and with the residual add in front) on AITER's "opus" kernels, through their plain C
// ABI (AITER v0.1.18+): y = x * rsqrt(mean(x^2) + epsilon) * gamma with float32 accumulation; with the add,
// sum = x + residual is written too and normalized. bfloat16, float16 and float32; gamma has x's dtype.
//
// The kernels live in the AITER JIT module staged as aiter/libaiter_rmsnorm.so. It is opened on first use
// rather than linked, so the GEMM handlers of this library keep working where only they were staged.

#include <dlfcn.h>

#include <cstddef>
#include <mutex>
#include <string>

#include "asm_launcher.h"
#include "handler.h"
#include "rmsnorm_abi.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jax_aiter::aiter {
namespace {

constexpr const char* kLibrary = "libaiter_rmsnorm.so";

struct OpusKernels {
  RmsNormOpus rms_norm = nullptr;
  AddRmsNormOpus add_rms_norm = nullptr;
  std::string error;
};

const OpusKernels& opus_kernels() {
  static OpusKernels kernels;
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string path = asset_dir() + "/" + kLibrary;
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      kernels.error = "cannot open " + path + ": " + (why ? why : "unknown error") +
                      " (build it with scripts/build-aiter.sh; see docs/building-rocm.md)";
      return;
    }
    kernels.rms_norm = reinterpret_cast<RmsNormOpus>(dlsym(handle, kRmsNormOpusSymbol));
    kernels.add_rms_norm = reinterpret_cast<AddRmsNormOpus>(dlsym(handle, kAddRmsNormOpusSymbol));
    if (kernels.rms_norm == nullptr || kernels.add_rms_norm == nullptr)
      kernels.error = path + " lacks rms_norm_opus or add_rms_norm_opus";
  });
  return kernels;
}

// Pointers (and the stream) cross the C ABI as size_t.
template <typename T>
size_t address(T* pointer) {
  return reinterpret_cast<size_t>(pointer);
}

struct NormShape {
  int rows = 0;
  int hidden = 0;
  int dtype = 0;
};

ffi::Error check(const char* op, const ffi::AnyBuffer& x, const ffi::AnyBuffer& gamma, NormShape* shape) {
  const auto dims = x.dimensions();
  if (dims.size() < 1) return invalid(op, "x must have rank >= 1");
  switch (x.element_type()) {
    case ffi::DataType::F16: shape->dtype = kOpusFp16; break;
    case ffi::DataType::BF16: shape->dtype = kOpusBf16; break;
    case ffi::DataType::F32: shape->dtype = kOpusFp32; break;
    default: return invalid(op, "x must be bfloat16, float16 or float32");
  }
  if (gamma.element_type() != x.element_type()) return invalid(op, "gamma must have x's dtype");
  const int64_t hidden = dims.back();
  if (gamma.dimensions().size() != 1 || gamma.dimensions()[0] != hidden)
    return invalid(op, "gamma must be 1-D with x's last dimension");
  const int64_t rows = hidden == 0 ? 0 : static_cast<int64_t>(x.element_count()) / hidden;
  // The C ABI takes int sizes.
  if (rows >= (int64_t{1} << 31) || hidden >= (int64_t{1} << 31)) return invalid(op, "x is too large");
  shape->rows = static_cast<int>(rows);
  shape->hidden = static_cast<int>(hidden);
  return ffi::Error::Success();
}

ffi::Error RmsNorm(hipStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer gamma, float epsilon,
                   ffi::Result<ffi::AnyBuffer> y) {
  constexpr const char* op = "ja_aiter_rms_norm_fwd";
  NormShape s;
  if (ffi::Error err = check(op, x, gamma, &s); err.failure()) return err;
  if (s.rows == 0 || s.hidden == 0) return ffi::Error::Success();
  const OpusKernels& kernels = opus_kernels();
  if (!kernels.error.empty()) return internal(op, kernels.error);
  // The opus entry points return nothing: a failed launch shows up as HIP's last error, which the tail reads.
  return launch_on_stream(op, device, stream, {}, [&] {
    kernels.rms_norm(address(y->untyped_data()), address(x.untyped_data()), address(gamma.untyped_data()), epsilon,
                     s.rows, s.hidden, s.hidden, s.dtype, 0, 0, address(stream));
    return std::string();
  });
}

ffi::Error AddRmsNorm(hipStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer residual,
                      ffi::AnyBuffer gamma, float epsilon, ffi::Result<ffi::AnyBuffer> y,
                      ffi::Result<ffi::AnyBuffer> sum) {
  constexpr const char* op = "ja_aiter_add_rms_norm_fwd";
  NormShape s;
  if (ffi::Error err = check(op, x, gamma, &s); err.failure()) return err;
  if (residual.element_type() != x.element_type() || residual.element_count() != x.element_count())
    return invalid(op, "residual must have x's shape and dtype");
  if (s.rows == 0 || s.hidden == 0) return ffi::Error::Success();
  const OpusKernels& kernels = opus_kernels();
  if (!kernels.error.empty()) return internal(op, kernels.error);
  return launch_on_stream(op, device, stream, {}, [&] {
    kernels.add_rms_norm(address(y->untyped_data()), address(x.untyped_data()), address(residual.untyped_data()),
                         address(sum->untyped_data()), address(gamma.untyped_data()), epsilon, s.rows, s.hidden,
                         s.hidden, s.dtype, 0, 0, address(stream));
    return std::string();
  });
}

}  // namespace
}  // namespace jax_aiter::aiter

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaAiterRmsNormFwd, jax_aiter::aiter::RmsNorm,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<hipStream_t>>()
                                  .Ctx<xla::ffi::DeviceOrdinal>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Attr<float>("epsilon")
                                  .Ret<xla::ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaAiterAddRmsNormFwd, jax_aiter::aiter::AddRmsNorm,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<hipStream_t>>()
                                  .Ctx<xla::ffi::DeviceOrdinal>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Attr<float>("epsilon")
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>());
