// Cache file layout (native endianness; the cache is a local accelerator, never exchanged):
//   magic "TPSGUIC1" | u32 key length | key | u64 span count | i64 begin | i64 end
//   u32 strings | per string: u32 length, bytes
//   u32 lanes | per lane: i32 rank, i32 thread, u32 label length, label, u32 rows |
//     per row: u64 n, then the arrays begin[n] end[n] name[n] step[n] layer[n] kind[n] phase[n]
//   magic again (a truncated file fails here)
// Kind summaries are rebuilt on read (one pass).
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "tpscope/gui/timeline_data.h"

namespace tpscope::gui {

namespace {

constexpr char kMagic[8] = {'T', 'P', 'S', 'G', 'U', 'I', 'C', '1'};
constexpr uint64_t kMaxCount = uint64_t{1} << 34;

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

struct Out {
  std::FILE* f;
  bool ok = true;
  void raw(const void* p, size_t n) { ok = ok && (n == 0 || std::fwrite(p, 1, n, f) == n); }
  template <class T>
  void pod(const T& v) { raw(&v, sizeof v); }
  void str(const std::string& s) {
    pod(static_cast<uint32_t>(s.size()));
    raw(s.data(), s.size());
  }
  template <class T>
  void vec(const std::vector<T>& v) { raw(v.data(), v.size() * sizeof(T)); }
};

struct In {
  std::FILE* f;
  bool ok = true;
  void raw(void* p, size_t n) { ok = ok && (n == 0 || std::fread(p, 1, n, f) == n); }
  template <class T>
  T pod() {
    T v{};
    raw(&v, sizeof v);
    return v;
  }
  std::string str() {
    const uint32_t n = pod<uint32_t>();
    if (!ok || n > (1u << 24)) return ok = false, std::string();
    std::string s(n, '\0');
    raw(s.data(), n);
    return s;
  }
  template <class T>
  void vec(std::vector<T>& v, uint64_t n) {
    v.resize(n);
    raw(v.data(), n * sizeof(T));
  }
};

}  // namespace

bool TimelineData::writeCache(const std::string& path, const std::string& key) const {
  const std::string temporary = path + ".tmp";
  {
    File file(std::fopen(temporary.c_str(), "wb"));
    if (!file) return false;
    Out out{file.get()};
    out.raw(kMagic, sizeof kMagic);
    out.str(key);
    out.pod(static_cast<uint64_t>(spanCount_));
    out.pod(beginNs_);
    out.pod(endNs_);
    out.pod(static_cast<uint32_t>(strings_.size()));
    for (const auto& s : strings_) out.str(s);
    out.pod(static_cast<uint32_t>(lanes_.size()));
    for (const Lane& lane : lanes_) {
      out.pod(static_cast<int32_t>(lane.rank));
      out.pod(static_cast<int32_t>(lane.thread));
      out.str(lane.label);
      out.pod(static_cast<uint32_t>(lane.rows.size()));
      for (const LaneRow& r : lane.rows) {
        out.pod(static_cast<uint64_t>(r.size()));
        out.vec(r.begin);
        out.vec(r.end);
        out.vec(r.name);
        out.vec(r.step);
        out.vec(r.layer);
        out.vec(r.kind);
        out.vec(r.phase);
      }
    }
    out.raw(kMagic, sizeof kMagic);
    if (!out.ok || std::fflush(file.get()) != 0) {
      std::remove(temporary.c_str());
      return false;
    }
  }
  std::error_code ec;
  std::filesystem::rename(temporary, path, ec);
  if (ec) std::remove(temporary.c_str());
  return !ec;
}

std::optional<TimelineData> TimelineData::readCache(const std::string& path, const std::string& key) {
  File file(std::fopen(path.c_str(), "rb"));
  if (!file) return std::nullopt;
  In in{file.get()};
  char magic[8];
  in.raw(magic, sizeof magic);
  if (!in.ok || std::memcmp(magic, kMagic, sizeof magic) != 0 || in.str() != key || !in.ok) return std::nullopt;
  TimelineData data;
  data.spanCount_ = in.pod<uint64_t>();
  data.beginNs_ = in.pod<int64_t>();
  data.endNs_ = in.pod<int64_t>();
  const uint32_t strings = in.pod<uint32_t>();
  if (!in.ok || strings > (1u << 26)) return std::nullopt;
  data.strings_.reserve(strings);
  for (uint32_t i = 0; i < strings && in.ok; ++i) data.strings_.push_back(in.str());
  const uint32_t lanes = in.pod<uint32_t>();
  if (!in.ok || lanes > (1u << 24)) return std::nullopt;
  uint64_t total = 0;
  data.lanes_.resize(lanes);
  for (Lane& lane : data.lanes_) {
    lane.rank = in.pod<int32_t>();
    lane.thread = in.pod<int32_t>();
    lane.label = in.str();
    const uint32_t rows = in.pod<uint32_t>();
    if (!in.ok || rows > (1u << 20)) return std::nullopt;
    lane.rows.resize(rows);
    for (LaneRow& r : lane.rows) {
      const uint64_t n = in.pod<uint64_t>();
      if (!in.ok || n > kMaxCount) return std::nullopt;
      in.vec(r.begin, n);
      in.vec(r.end, n);
      in.vec(r.name, n);
      in.vec(r.step, n);
      in.vec(r.layer, n);
      in.vec(r.kind, n);
      in.vec(r.phase, n);
      if (!in.ok) return std::nullopt;
      for (uint8_t& k : r.kind) k = k < kKindCount ? k : kKindCount - 1;
      r.buildSummaries();
      total += n;
    }
  }
  in.raw(magic, sizeof magic);
  if (!in.ok || std::memcmp(magic, kMagic, sizeof magic) != 0 || total != data.spanCount_) return std::nullopt;
  return data;
}

}  // namespace tpscope::gui
