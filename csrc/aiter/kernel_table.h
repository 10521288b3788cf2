// AITER's kernel tables: one CSV per code-object family (hsa/<arch>/<family>/*.csv), one row per kernel.
//
// The CSV header is the contract, not the column order: AITER's table versions differ in column names (tile_M vs
// tileM, bpreshuffle vs bPreshuffle) and in which columns exist (subK, bias, persistent), so columns are
// matched by name, ignoring case and underscores, and absent optional columns read as 0. Plain C++ (no HIP):
// the same parser runs in the ROCm handlers and in the CPU tests.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace jax_aiter::aiter {

struct KernelRow {
  std::string knl_name;  // the kernel symbol inside the code object
  std::string co_name;   // the code object file, relative to the family folder
  int tile_m = 0;
  int tile_n = 0;
  bool split_k = false;       // the kernel can split K across workgroups (atomically accumulated output)
  int sub_k = 0;              // K per split step (bf16 tables); 0 when the table has no such column
  bool b_preshuffle = false;  // B must be in AITER's shuffled layout
  bool bias = false;          // the kernel can add a bias
  bool persistent = false;    // a persistent-grid kernel
};

struct KernelTable {
  std::string source;  // where the rows came from, for messages
  std::vector<KernelRow> rows;
};

// Parses CSV text. Returns an empty string on success, else what is wrong (naming `source` and the line).
std::string parse_kernel_table(std::string_view text, const std::string& source, KernelTable* table);

// Reads and parses the CSV file at `path`.
std::string load_kernel_table(const std::string& path, KernelTable* table);

}  // namespace jax_aiter::aiter
