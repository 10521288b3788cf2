// The table every jax-aiter native library exports: the Python loader (jax_aiter/_native.py) reads it and
// registers each handler under its target name, so targets are listed once, next to their handlers.
#pragma once

#include <cstddef>

struct JaFfiTarget {
  const char* name;
  void* handler;
};

#define JA_FFI_TARGET(name, symbol) JaFfiTarget{name, reinterpret_cast<void*>(symbol)}

#define JA_DEFINE_FFI_TARGET_TABLE(...)                                                   \
  extern "C" __attribute__((visibility("default"))) const JaFfiTarget* ja_ffi_targets( \
      std::size_t* count) {                                                             \
    static const JaFfiTarget targets[] = {__VA_ARGS__};                                 \
    *count = sizeof(targets) / sizeof(targets[0]);                                      \
    return targets;                                                                     \
  }
