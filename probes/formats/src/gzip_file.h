// Reads a JSON input file, plain or gzip-compressed (detected by the magic bytes 1f 8b, not by the name), into a
// buffer padded for simdjson (kPadding zero bytes after the text).
#pragma once

#include <cstddef>
#include <filesystem>
#include <vector>

#include "tpscope/tracedb/status.h"

namespace tpscope::formats {

struct JsonBuffer {
  static constexpr size_t kPadding = 64;  // >= SIMDJSON_PADDING
  std::vector<char> bytes;                // text followed by kPadding zero bytes
  size_t size = 0;                        // length of the text
  bool compressed = false;
  size_t fileBytes = 0;                   // size on disk
};

// Errors name the file: missing or unreadable, empty, truncated or corrupt gzip stream.
tracedb::Result<JsonBuffer> readJsonFile(const std::filesystem::path& path);

}  // namespace tpscope::formats
