// Helpers for the formats tests: fixture paths, a scratch folder per test, reading files and small JSON walks.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace tpscope::formats::testing {

namespace fs = std::filesystem;

inline fs::path fixture(const std::string& name) { return fs::path(TPSCOPE_FORMATS_FIXTURES) / name; }
inline fs::path sharedKineto() { return fs::path(TPSCOPE_SHARED_TESTDATA) / "kineto"; }

// A fresh folder under the system temp dir, removed at the end of the test.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag = "") {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("tpscope-formats-" + std::string(info->test_suite_name()) + "-" + info->name() + "-" +
             std::to_string(::getpid()) + (tag.empty() ? "" : "-" + tag));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& name) const { return path_ / name; }
  // Names of the entries in the folder (to check that nothing half-written was left behind). SQLite's -wal/-shm
  // sidecars, which a reader of a WAL database may leave, are not listed.
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(path_)) {
      const std::string name = e.path().filename().string();
      if (name.size() > 4 && (name.ends_with("-wal") || name.ends_with("-shm"))) continue;
      out.push_back(name);
    }
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  fs::path path_;
};

inline std::string readFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void writeFile(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

inline std::string gunzip(const std::string& bytes) {
  z_stream zs{};
  EXPECT_EQ(inflateInit2(&zs, 15 + 32), Z_OK);
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  zs.avail_in = static_cast<uInt>(bytes.size());
  std::string out;
  char buf[1 << 16];
  int rc = Z_OK;
  while (rc == Z_OK) {
    zs.next_out = reinterpret_cast<Bytef*>(buf);
    zs.avail_out = sizeof buf;
    rc = inflate(&zs, Z_NO_FLUSH);
    out.append(buf, sizeof buf - zs.avail_out);
  }
  inflateEnd(&zs);
  EXPECT_EQ(rc, Z_STREAM_END);
  return out;
}

// The trace's events, read the plain way (nlohmann, no code shared with the importer). Json may be a basic_json
// with another number type (long double: exact ns from unix-epoch µs).
template <class Json = nlohmann::json>
Json loadEvents(const fs::path& path) {
  std::string text = readFile(path);
  if (text.size() > 2 && static_cast<unsigned char>(text[0]) == 0x1f) text = gunzip(text);
  Json doc = Json::parse(text);
  return doc.is_array() ? doc : doc["traceEvents"];
}

inline int64_t usToNs(const nlohmann::json& v) { return static_cast<int64_t>(std::llround(v.get<double>() * 1000.0)); }

}  // namespace tpscope::formats::testing
