// What every GPU handler needs: the XLA FFI API, the portability layer, and turning a runtime status into an
// ffi::Error (a failed launch surfaces in Python as an exception, never as a crash).
#pragma once

#include <string>

#include "jax_aiter/gpu.h"
#include "jax_aiter/ffi_util.h"

namespace jax_aiter {

inline ffi::Error gpu_error(gpu::Status status, const char* what) {
  if (status == gpu::kSuccess) return ffi::Error::Success();
  return ffi::Error::Internal(std::string(what) + ": " + gpu::error_string(status));
}

}  // namespace jax_aiter
