#include "kernel_table.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <fstream>
#include <tuple>
#include <utility>
#include <sstream>

namespace jax_aiter::aiter {

namespace {

// A code-object name from a table is joined to the asset folder to form a path: it must stay inside it.
bool is_relative_asset_name(const std::string& name) {
  if (name.empty() || name.front() == '/') return false;
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.' || c == '/')) return false;
  size_t start = 0;
  while (start <= name.size()) {
    const size_t end = std::min(name.find('/', start), name.size());
    const std::string part = name.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = end + 1;
  }
  return true;
}

// "tile_M", "tileM" and "TILE_M" all name the same column.
std::string normalize(std::string_view name) {
  std::string key;
  for (char c : name) {
    if (c == '_' || std::isspace(static_cast<unsigned char>(c))) continue;
    key.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  return key;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> split_fields(std::string_view line) {
  std::vector<std::string_view> fields;
  size_t start = 0;
  while (true) {
    const size_t comma = line.find(',', start);
    const size_t length = comma == std::string_view::npos ? std::string_view::npos : comma - start;
    fields.push_back(trim(line.substr(start, length)));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return fields;
}

// Column indices by normalized name; -1 when the table lacks the column.
struct Columns {
  int knl_name = -1, co_name = -1, tile_m = -1, tile_n = -1, split_k = -1, sub_k = -1, b_preshuffle = -1,
      bias = -1, persistent = -1;
};

std::string where(const std::string& source, int line_number) {
  return source + ":" + std::to_string(line_number);
}

// An absent or empty field reads as 0: AITER leaves trailing optional fields off some rows.
std::string read_int(const std::vector<std::string_view>& fields, int column, const char* name,
                     const std::string& location, int* value) {
  *value = 0;
  if (column < 0 || column >= static_cast<int>(fields.size()) || fields[column].empty()) return {};
  const std::string_view text = fields[column];
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *value);
  if (ec != std::errc() || end != text.data() + text.size() || *value < 0)
    return location + ": column " + name + " must be a non-negative integer, got '" + std::string(text) + "'";
  return {};
}

}  // namespace

std::string parse_kernel_table(std::string_view text, const std::string& source, KernelTable* table) {
  table->source = source;
  table->rows.clear();
  Columns col;
  size_t header_fields = 0;
  bool have_header = false;
  int line_number = 0;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t newline = text.find('\n', pos);
    const size_t length = newline == std::string_view::npos ? std::string_view::npos : newline - pos;
    std::string_view line = text.substr(pos, length);
    pos = newline == std::string_view::npos ? text.size() + 1 : newline + 1;
    ++line_number;
    line = trim(line);
    if (line.empty()) continue;
    const std::vector<std::string_view> fields = split_fields(line);
    if (!have_header) {
      for (size_t i = 0; i < fields.size(); ++i) {
        const std::string key = normalize(fields[i]);
        int* slot = key == "knlname"       ? &col.knl_name
                    : key == "coname"      ? &col.co_name
                    : key == "tilem"       ? &col.tile_m
                    : key == "tilen"       ? &col.tile_n
                    : key == "splitk"      ? &col.split_k
                    : key == "subk"        ? &col.sub_k
                    : key == "bpreshuffle" ? &col.b_preshuffle
                    : key == "bias"        ? &col.bias
                    : key == "persistent"  ? &col.persistent
                                           : nullptr;
        if (slot != nullptr) *slot = static_cast<int>(i);
      }
      for (const auto& [index, name] : {std::pair{col.knl_name, "knl_name"}, std::pair{col.co_name, "co_name"},
                                        std::pair{col.tile_m, "tile_M"}, std::pair{col.tile_n, "tile_N"}}) {
        if (index < 0) return where(source, line_number) + ": the header has no " + name + " column";
      }
      header_fields = fields.size();
      have_header = true;
      continue;
    }
    const std::string location = where(source, line_number);
    if (fields.size() > header_fields)
      return location + ": " + std::to_string(fields.size()) + " fields but the header has " +
             std::to_string(header_fields);
    KernelRow row;
    auto text_field = [&](int column) {
      return column < static_cast<int>(fields.size()) ? std::string(fields[column]) : std::string();
    };
    row.knl_name = text_field(col.knl_name);
    row.co_name = text_field(col.co_name);
    if (row.knl_name.empty() || row.co_name.empty()) return location + ": knl_name and co_name must not be empty";
    if (!is_relative_asset_name(row.co_name))
      return location + ": co_name " + row.co_name +
             " must be a relative path inside the asset folder (letters, digits, _ - . /, no .. or leading /)";
    int split_k = 0, b_preshuffle = 0, bias = 0, persistent = 0;
    for (const auto& [column, name, value] :
         {std::tuple{col.tile_m, "tile_M", &row.tile_m}, std::tuple{col.tile_n, "tile_N", &row.tile_n},
          std::tuple{col.split_k, "splitK", &split_k}, std::tuple{col.sub_k, "subK", &row.sub_k},
          std::tuple{col.b_preshuffle, "bpreshuffle", &b_preshuffle}, std::tuple{col.bias, "bias", &bias},
          std::tuple{col.persistent, "persistent", &persistent}}) {
      if (std::string err = read_int(fields, column, name, location, value); !err.empty()) return err;
    }
    if (row.tile_m <= 0 || row.tile_n <= 0) return location + ": tile_M and tile_N must be positive";
    row.split_k = split_k != 0;
    row.b_preshuffle = b_preshuffle != 0;
    row.bias = bias != 0;
    row.persistent = persistent != 0;
    table->rows.push_back(std::move(row));
  }
  if (!have_header) return source + ": empty kernel table";
  return {};
}

std::string load_kernel_table(const std::string& path, KernelTable* table) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return "cannot read kernel table " + path;
  std::ostringstream text;
  text << file.rdbuf();
  return parse_kernel_table(text.str(), path, table);
}

}  // namespace jax_aiter::aiter
