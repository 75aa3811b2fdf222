#include "gzip_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

namespace tpscope::formats {
namespace {

using tracedb::Result;
using tracedb::Status;

Status inflateInto(const std::filesystem::path& path, const JsonBuffer& in, JsonBuffer& out) {
  // ISIZE (the last 4 bytes: uncompressed size mod 2^32) is a good first guess for the output size.
  // A truncated stream ends in arbitrary bytes: trust ISIZE only within deflate's maximum ratio (1032:1).
  size_t guess = in.size * 4;
  if (in.size >= 18) {
    uint32_t isize = 0;
    std::memcpy(&isize, in.text() + in.size - 4, 4);
    if (isize > guess && isize <= in.size * 1032) guess = isize;
  }
  out.reserve(guess);

  z_stream zs{};
  if (inflateInit2(&zs, 15 + 32) != Z_OK) return Status::error(path.string() + ": cannot initialise zlib");
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.text()));
  zs.avail_in = static_cast<uInt>(std::min<size_t>(in.size, 1u << 30));
  size_t inLeft = in.size - zs.avail_in;
  size_t produced = 0;
  int rc = Z_OK;
  for (;;) {
    if (zs.avail_in == 0 && inLeft > 0) {
      zs.avail_in = static_cast<uInt>(std::min<size_t>(inLeft, 1u << 30));
      inLeft -= zs.avail_in;
    }
    out.size = produced;
    if (out.capacity - JsonBuffer::kPadding - produced < (1u << 16)) out.reserve(out.capacity * 2 + (1u << 20));
    const size_t room = out.capacity - JsonBuffer::kPadding - produced;
    zs.next_out = reinterpret_cast<Bytef*>(out.data.get() + produced);
    zs.avail_out = static_cast<uInt>(std::min<size_t>(room, 1u << 30));
    const uInt before = zs.avail_out;
    rc = inflate(&zs, Z_NO_FLUSH);
    produced += before - zs.avail_out;
    if (rc == Z_STREAM_END) {
      // Concatenated gzip members (gzip a; gzip b; cat) form one stream.
      if (zs.avail_in > 0 && static_cast<unsigned char>(*zs.next_in) == 0x1f) {
        if (inflateReset(&zs) != Z_OK) break;
        continue;
      }
      break;
    }
    if (rc == Z_OK) continue;
    if (rc == Z_BUF_ERROR && zs.avail_in == 0 && inLeft == 0) break;  // input ended before the stream did
    if (rc == Z_BUF_ERROR) continue;                   // output was full; grow and go on
    break;
  }
  const std::string zmsg = zs.msg ? zs.msg : "";
  inflateEnd(&zs);
  if (rc != Z_STREAM_END) {
    if (rc == Z_OK || rc == Z_BUF_ERROR)
      return Status::error(path.string() + ": truncated gzip stream (ended after " + std::to_string(produced) +
                           " uncompressed bytes)");
    return Status::error(path.string() + ": corrupt gzip stream" + (zmsg.empty() ? "" : " (" + zmsg + ")"));
  }
  out.size = produced;
  out.pad();
  return Status::ok();
}

}  // namespace

void JsonBuffer::reserve(size_t bytes) {
  if (bytes + kPadding <= capacity) return;
  std::unique_ptr<char[]> grown(new char[bytes + kPadding]);  // uninitialised: the text is written over it
  if (size > 0) std::memcpy(grown.get(), data.get(), size);
  data = std::move(grown);
  capacity = bytes + kPadding;
}

void JsonBuffer::pad() { std::memset(data.get() + size, 0, kPadding); }

Result<JsonBuffer> readJsonFile(const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return Status::error(path.string() + ": is a directory");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::error(path.string() + ": cannot open: " + std::strerror(errno));
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size < 0) return Status::error(path.string() + ": cannot determine the file size");
  const size_t len = static_cast<size_t>(st.st_size);
  if (len == 0) return Status::error(path.string() + ": empty file");

  JsonBuffer raw;
  raw.fileBytes = len;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t mappedBytes = (len + page - 1) / page * page;
  if (S_ISREG(st.st_mode) && mappedBytes - len >= JsonBuffer::kPadding) {
    void* m = ::mmap(nullptr, mappedBytes, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    if (m != MAP_FAILED) {
      ::madvise(m, mappedBytes, MADV_SEQUENTIAL);
      raw.mapped = std::shared_ptr<const char>(static_cast<const char*>(m),
                                               [mappedBytes](const char* p) { ::munmap(const_cast<char*>(p), mappedBytes); });
      raw.capacity = mappedBytes;
      raw.size = len;
    }
  }
  if (!raw.mapped) {
    raw.reserve(len);
    size_t got = 0;
    while (got < len) {
      const ssize_t n = ::read(fd, raw.data.get() + got, len - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return Status::error(path.string() + ": read error: " + (n < 0 ? std::strerror(errno) : "file shrank"));
      got += static_cast<size_t>(n);
    }
    raw.size = len;
    raw.pad();
  }
  if (len >= 2 && static_cast<unsigned char>(raw.text()[0]) == 0x1f && static_cast<unsigned char>(raw.text()[1]) == 0x8b) {
    JsonBuffer text;
    text.fileBytes = raw.fileBytes;
    text.compressed = true;
    if (Status s = inflateInto(path, raw, text); !s) return s;
    if (text.size == 0) return Status::error(path.string() + ": empty file (after gzip decompression)");
    return text;
  }
  return raw;
}

}  // namespace tpscope::formats
