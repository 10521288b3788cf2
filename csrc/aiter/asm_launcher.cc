#include "asm_launcher.h"

#include <dlfcn.h>

#include <map>
#include <memory>
#include <mutex>
#include <tuple>

namespace jax_aiter::aiter {

std::string hip_status(hipError_t status, const char* what) {
  if (status == hipSuccess) return {};
  return std::string(what) + ": " + hipGetErrorString(status);
}

const std::string& asset_dir() {
  static const std::string dir = [] {
    Dl_info info{};
    // Any symbol of this library names the file it was loaded from.
    if (dladdr(reinterpret_cast<void*>(&hip_status), &info) == 0 || info.dli_fname == nullptr) return std::string();
    std::string path = info.dli_fname;
    const size_t slash = path.rfind('/');
    return (slash == std::string::npos ? std::string(".") : path.substr(0, slash)) + "/aiter";
  }();
  return dir;
}

ScopedDevice::ScopedDevice(int ordinal) {
  error_ = hip_status(hipGetDevice(&previous_), "hipGetDevice");
  if (error_.empty() && previous_ != ordinal) error_ = hip_status(hipSetDevice(ordinal), "hipSetDevice");
}

ScopedDevice::~ScopedDevice() {
  int current = -1;
  if (previous_ >= 0 && hipGetDevice(&current) == hipSuccess && current != previous_) (void)hipSetDevice(previous_);
}

std::string device_info(int ordinal, DeviceInfo* info) {
  static std::mutex mutex;
  static std::map<int, DeviceInfo> cache;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = cache.find(ordinal); it != cache.end()) {
    *info = it->second;
    return {};
  }
  hipDeviceProp_t props{};
  if (std::string err = hip_status(hipGetDeviceProperties(&props, ordinal), "hipGetDeviceProperties"); !err.empty())
    return err;
  DeviceInfo found;
  found.arch = props.gcnArchName;
  found.arch = found.arch.substr(0, found.arch.find(':'));
  found.num_cu = props.multiProcessorCount;
  cache.emplace(ordinal, found);
  *info = found;
  return {};
}

std::string kernel_table(const std::string& arch, const char* family, const char* csv_name,
                         const KernelTable** table) {
  static std::mutex mutex;
  // unique_ptr keeps each table at a fixed address while the map grows.
  static std::map<std::string, std::unique_ptr<KernelTable>> cache;
  const std::string path = asset_dir() + "/hsa/" + arch + "/" + family + "/" + csv_name;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(path);
  if (it == cache.end()) {
    auto loaded = std::make_unique<KernelTable>();
    if (std::string err = load_kernel_table(path, loaded.get()); !err.empty())
      return err + " (the AITER assets for " + arch + " are not staged; see docs/building-rocm.md)";
    it = cache.emplace(path, std::move(loaded)).first;
  }
  *table = it->second.get();
  return {};
}

std::string kernel_function(int ordinal, const std::string& arch, const char* family, const KernelRow& row,
                            hipFunction_t* function) {
  static std::mutex mutex;
  // Modules stay loaded for the life of the process: unloading at exit would race the HIP runtime's own
  // teardown, and a cached function handle must never outlive its module.
  static std::map<std::tuple<int, std::string, std::string>, hipFunction_t> cache;
  // Newer tables name the family folder in co_name, older ones do not.
  const std::string co_path = asset_dir() + "/hsa/" + arch + "/" +
                              (row.co_name.find('/') == std::string::npos ? std::string(family) + "/" : "") +
                              row.co_name;
  const auto key = std::make_tuple(ordinal, co_path, row.knl_name);
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = cache.find(key); it != cache.end()) {
    *function = it->second;
    return {};
  }
  ScopedDevice device(ordinal);
  if (!device.error().empty()) return device.error();
  hipModule_t module = nullptr;
  if (std::string err = hip_status(hipModuleLoad(&module, co_path.c_str()), "hipModuleLoad"); !err.empty())
    return err + " (" + co_path + ")";
  hipFunction_t loaded = nullptr;
  if (std::string err = hip_status(hipModuleGetFunction(&loaded, module, row.knl_name.c_str()),
                                   "hipModuleGetFunction");
      !err.empty()) {
    (void)hipModuleUnload(module);
    return err + " (" + row.knl_name + " in " + co_path + ")";
  }
  cache.emplace(key, loaded);
  *function = loaded;
  return {};
}

std::string launch_kernel(hipFunction_t function, const LaunchGrid& grid, unsigned block_threads, void* args,
                          size_t args_size, hipStream_t stream) {
  void* extra[] = {HIP_LAUNCH_PARAM_BUFFER_POINTER, args, HIP_LAUNCH_PARAM_BUFFER_SIZE, &args_size,
                   HIP_LAUNCH_PARAM_END};
  return hip_status(hipModuleLaunchKernel(function, grid.x, grid.y, grid.z, block_threads, 1, 1, 0, stream, nullptr,
                                          extra),
                    "hipModuleLaunchKernel");
}

}  // namespace jax_aiter::aiter
