// Force-included (-include) when csrc/aiter or tools/aiter_api_layout.py's probe is compiled against AITER's
// real headers with Debian's HIP headers (libamdhip64-dev 5.2), which are older than AITER's headers assume.
// aiter_hip_common.h (at e4048607) uses, in inline code the bridge never calls:
//   - hipGetFuncBySymbol and hipDeviceAttributePciChipId, HIP 6 API absent from HIP 5.2: declared here (the
//     attribute as a stand-in enumerator, so the inline code compiles; it is never executed from a
//     compile-check object);
//   - std::unordered_map without including <unordered_map> (newer HIP headers include it on the way).
// With HIP 6 or newer headers this file adds only the include. Never part of a real build (CMake): a ROCm
// installation has the real declarations.
#pragma once

#include <hip/hip_runtime.h>

#include <unordered_map>

#if HIP_VERSION_MAJOR < 6
hipError_t hipGetFuncBySymbol(hipFunction_t* function, const void* symbol);
#define hipDeviceAttributePciChipId hipDeviceAttributePciBusId
#endif
