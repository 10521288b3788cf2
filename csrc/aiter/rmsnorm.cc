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
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jax_aiter::aiter {
namespace {

// The C ABI at the pinned AITER commit (csrc/kernels/rmsnorm opus entry; build-aiter checks both signatures):
// pointers and the stream travel as size_t; dtype 0 = fp16, 1 = bf16, 2 = fp32; in_s = input row stride in
// elements; model_sensitive and gemma select variants this op does not use (0).
using RmsNormOpus = void (*)(size_t out, size_t in, size_t weight, float epsilon, int rows, int hidden, int in_s,
                             int dtype, int model_sensitive, int gemma, size_t stream);
using AddRmsNormOpus = void (*)(size_t out, size_t in, size_t residual_in, size_t residual_out, size_t weight,
                                float epsilon, int rows, int hidden, int in_s, int dtype, int model_sensitive,
                                int gemma, size_t stream);

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
    kernels.rms_norm = reinterpret_cast<RmsNormOpus>(dlsym(handle, "rms_norm_opus"));
    kernels.add_rms_norm = reinterpret_cast<AddRmsNormOpus>(dlsym(handle, "add_rms_norm_opus"));
    if (kernels.rms_norm == nullptr || kernels.add_rms_norm == nullptr)
      kernels.error = path + " lacks rms_norm_opus or add_rms_norm_opus";
  });
  return kernels;
}

ffi::Error invalid(const char* op, const std::string& message) {
  return ffi::Error::InvalidArgument(std::string(op) + ": " + message);
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
    case ffi::DataType::F16: shape->dtype = 0; break;
    case ffi::DataType::BF16: shape->dtype = 1; break;
    case ffi::DataType::F32: shape->dtype = 2; break;
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

// The opus entry points return nothing: a failed launch shows up as HIP's last error on this thread.
ffi::Error launched(const char* op) {
  const std::string err = hip_status(hipGetLastError(), "kernel launch");
  return err.empty() ? ffi::Error::Success() : ffi::Error::Internal(std::string(op) + ": " + err);
}

ffi::Error RmsNorm(hipStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer gamma, float epsilon,
                   ffi::Result<ffi::AnyBuffer> y) {
  constexpr const char* op = "ja_aiter_rms_norm_fwd";
  NormShape s;
  if (ffi::Error err = check(op, x, gamma, &s); err.failure()) return err;
  if (s.rows == 0 || s.hidden == 0) return ffi::Error::Success();
  const OpusKernels& kernels = opus_kernels();
  if (!kernels.error.empty()) return ffi::Error::Internal(std::string(op) + ": " + kernels.error);
  ScopedDevice scoped(device);
  if (!scoped.error().empty()) return ffi::Error::Internal(std::string(op) + ": " + scoped.error());
  (void)hipGetLastError();  // start from a clean slate so launched() reports only this launch
  kernels.rms_norm(reinterpret_cast<size_t>(y->untyped_data()), reinterpret_cast<size_t>(x.untyped_data()),
                   reinterpret_cast<size_t>(gamma.untyped_data()), epsilon, s.rows, s.hidden, s.hidden, s.dtype, 0, 0,
                   reinterpret_cast<size_t>(stream));
  return launched(op);
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
  if (!kernels.error.empty()) return ffi::Error::Internal(std::string(op) + ": " + kernels.error);
  ScopedDevice scoped(device);
  if (!scoped.error().empty()) return ffi::Error::Internal(std::string(op) + ": " + scoped.error());
  (void)hipGetLastError();
  kernels.add_rms_norm(reinterpret_cast<size_t>(y->untyped_data()), reinterpret_cast<size_t>(x.untyped_data()),
                       reinterpret_cast<size_t>(residual.untyped_data()),
                       reinterpret_cast<size_t>(sum->untyped_data()), reinterpret_cast<size_t>(gamma.untyped_data()),
                       epsilon, s.rows, s.hidden, s.hidden, s.dtype, 0, 0, reinterpret_cast<size_t>(stream));
  return launched(op);
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
