// What the AITER handlers share around their launches: FFI errors named after the target, and the launch tail
// (current device, zeroing of accumulated outputs, the launch itself, HIP's error mapped to an FFI error).
// Header-only, so both bridge libraries use it without another dependency of the common object library.
#pragma once

#include <hip/hip_runtime.h>

#include <cstddef>
#include <initializer_list>
#include <string>
#include <utility>

#include "asm_kernel_args.h"
#include "asm_launcher.h"
#include "gemm_select.h"
#include "kernel_table.h"
#include "xla/ffi/api/ffi.h"

namespace jax_aiter::aiter {

// "<op>: <message>" as InvalidArgument (the caller's operands or a shape no kernel serves) or Internal (HIP,
// missing assets, AITER).
inline xla::ffi::Error invalid(const char* op, const std::string& message) {
  return xla::ffi::Error::InvalidArgument(std::string(op) + ": " + message);
}
inline xla::ffi::Error internal(const char* op, const std::string& message) {
  return xla::ffi::Error::Internal(std::string(op) + ": " + message);
}

// hipMemsetAsync(ptr, 0, bytes, stream) as an FFI error.
inline xla::ffi::Error zero_async(const char* op, void* ptr, size_t bytes, hipStream_t stream) {
  const std::string err = hip_status(hipMemsetAsync(ptr, 0, bytes, stream), "hipMemsetAsync");
  return err.empty() ? xla::ffi::Error::Success() : internal(op, err);
}

// A device buffer to zero on the stream before a launch (outputs accumulated with atomics, semaphores).
struct ZeroFirst {
  void* ptr = nullptr;
  size_t bytes = 0;
};

// The launch tail: makes `device` current for the scope, zeroes `zero_first` in order on `stream`, clears HIP's
// last error, runs `launch` (returns "" or what failed), then reads HIP's last error, which is how entry points
// that return nothing (AITER's C ABI) report a failed launch. Every failure is Internal, prefixed with `op`.
template <typename Launch>
xla::ffi::Error launch_on_stream(const char* op, int device, hipStream_t stream,
                                 std::initializer_list<ZeroFirst> zero_first, Launch&& launch) {
  ScopedDevice scoped(device);
  if (!scoped.error().empty()) return internal(op, scoped.error());
  for (const ZeroFirst& z : zero_first) {
    if (z.bytes == 0) continue;
    if (xla::ffi::Error err = zero_async(op, z.ptr, z.bytes, stream); err.failure()) return err;
  }
  (void)hipGetLastError();  // a stale error from earlier work on this thread is not this launch's
  if (std::string err = std::forward<Launch>(launch)(); !err.empty()) return internal(op, err);
  if (std::string err = hip_status(hipGetLastError(), "kernel launch"); !err.empty()) return internal(op, err);
  return xla::ffi::Error::Success();
}

// The device's kernel table of an ASM GEMM family (hsa/<arch>/<family>/<csv_name>) and the device facts
// selection needs. `missing_hint` is appended when the table cannot be loaded.
inline xla::ffi::Error gemm_kernel_table(const char* op, int device, const char* family, const char* csv_name,
                                         const char* missing_hint, DeviceInfo* info, const KernelTable** table) {
  if (std::string err = device_info(device, info); !err.empty()) return internal(op, err);
  if (std::string err = kernel_table(info->arch, family, csv_name, table); !err.empty())
    return internal(op, err + missing_hint);
  return xla::ffi::Error::Success();
}

// Loads the selected ASM GEMM kernel and launches it with the argument block `args` (copied at launch) through
// launch_on_stream, zeroing `zero_first` first.
inline xla::ffi::Error launch_gemm(const char* op, hipStream_t stream, int device, const std::string& arch,
                                   const char* family, const KernelRow& row, const LaunchGrid& grid, void* args,
                                   size_t args_size, std::initializer_list<ZeroFirst> zero_first) {
  hipFunction_t function = nullptr;
  if (std::string err = kernel_function(device, arch, family, row, &function); !err.empty())
    return internal(op, err);
  return launch_on_stream(op, device, stream, zero_first, [&]() -> std::string {
    std::string err = launch_kernel(function, grid, kGemmBlockThreads, args, args_size, stream);
    return err.empty() ? err : err + " (" + row.knl_name + ")";
  });
}

}  // namespace jax_aiter::aiter
