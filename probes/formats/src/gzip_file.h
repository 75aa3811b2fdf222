// Reads a JSON input file, plain or gzip-compressed (detected by the magic bytes 1f 8b, not by the name), into a
// buffer padded for simdjson (at least kPadding readable bytes after the text). A plain file is mapped into memory
// rather than copied where its last page has room for the padding (the kernel zeroes a page's bytes after EOF);
// a mapped file must not be truncated while it is imported (the process would get SIGBUS).
#pragma once

#include <cstddef>
#include <filesystem>
#include <memory>

#include "tpscope/tracedb/status.h"

namespace tpscope::formats {

struct JsonBuffer {
  static constexpr size_t kPadding = 64;  // >= SIMDJSON_PADDING
  std::unique_ptr<char[]> data;           // text followed by kPadding zero bytes (not zero-filled before reading)
  std::shared_ptr<const char> mapped;     // or: the file mapped read-only (unmapped when the last owner goes)
  size_t size = 0;                        // length of the text
  size_t capacity = 0;                    // readable bytes from text(), padding included
  bool compressed = false;
  size_t fileBytes = 0;                   // size on disk

  const char* text() const { return mapped ? mapped.get() : data.get(); }
  // Makes room for `bytes` of text plus the padding, keeping the text so far.
  void reserve(size_t bytes);
  // Zeroes the padding after the text.
  void pad();
};

// Errors name the file: missing or unreadable, empty, truncated or corrupt gzip stream.
tracedb::Result<JsonBuffer> readJsonFile(const std::filesystem::path& path);

}  // namespace tpscope::formats
