// Loading and launching AITER's ASM code objects, and the per-device facts kernel selection needs.
//
// Assets (code objects and kernel tables) are staged by scripts/build-aiter.sh and installed next to this
// library: <library dir>/aiter/hsa/<arch>/<family>/{*.co, *.csv}. Everything here is cached for the life of
// the process and safe to call from several threads: XLA runs one executable on several devices at once.
#pragma once

#include <hip/hip_runtime.h>

#include <cstddef>
#include <string>

#include "gemm_select.h"
#include "kernel_table.h"

namespace jax_aiter::aiter {

// "" when `status` is hipSuccess, else "<what>: <HIP's message>".
std::string hip_status(hipError_t status, const char* what);

// The staged asset directory: "<directory of this library>/aiter".
const std::string& asset_dir();

struct DeviceInfo {
  std::string arch;  // gcnArchName up to the first ':' (e.g. "gfx942" from "gfx942:sramecc+:xnack-")
  int num_cu = 0;
};

// Facts about device `ordinal`, read once per device.
std::string device_info(int ordinal, DeviceInfo* info);

// The kernel table hsa/<arch>/<family>/<csv_name>, parsed once per file. The pointer stays valid.
std::string kernel_table(const std::string& arch, const char* family, const char* csv_name,
                         const KernelTable** table);

// The kernel `row` of `family` on device `ordinal`: its code object is loaded (hipModuleLoad) the first time
// and the function handle cached per (device, code object, kernel).
std::string kernel_function(int ordinal, const std::string& arch, const char* family, const KernelRow& row,
                            hipFunction_t* function);

// hipModuleLaunchKernel with the argument block passed by value (HIP_LAUNCH_PARAM_BUFFER_POINTER): `args`
// is copied at launch, so it may live on the caller's stack.
std::string launch_kernel(hipFunction_t function, const LaunchGrid& grid, unsigned block_threads, void* args,
                          size_t args_size, hipStream_t stream);

// Makes `ordinal` the current device for the scope (hipModuleLoad and AITER's host code act on the current
// device), then restores the previous one.
class ScopedDevice {
 public:
  explicit ScopedDevice(int ordinal);
  ~ScopedDevice();
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  const std::string& error() const { return error_; }

 private:
  int previous_ = -1;
  std::string error_;
};

}  // namespace jax_aiter::aiter
