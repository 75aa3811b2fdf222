// Test helper: a temporary folder per test and a Writer on a fresh file in it.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>

#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/writer.h"

namespace tpscope::testing {

inline std::filesystem::path testDir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  auto dir = std::filesystem::temp_directory_path() / "tpscope-analysis-test" /
             (std::string(info->test_suite_name()) + "." + info->name());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

inline std::unique_ptr<tracedb::Writer> newWriter(const std::filesystem::path& path) {
  tracedb::CreateOptions o;
  o.overwrite = true;
  o.runId = "t";
  auto w = tracedb::Writer::create(path, o);
  EXPECT_TRUE(w.isOk()) << w.error();
  return w ? std::move(*w) : nullptr;
}

// Ranks 0 and 1 of a world of two, and with `tpGroup` their TP group "tp-0".
inline void putRankPair(tracedb::Writer& w, bool tpGroup) {
  for (int r = 0; r < 2; ++r) {
    tracedb::RankInfo ri;
    ri.rank = r;
    ri.worldSize = 2;
    ASSERT_TRUE(w.putRank(ri));
  }
  if (tpGroup) {
    ASSERT_TRUE(w.putGroup(tracedb::GroupInfo{"tp-0", {0, 1}, "gloo"}));
  }
}

inline std::unique_ptr<tracedb::Reader> openReader(const std::filesystem::path& path) {
  auto r = tracedb::Reader::open(path);
  EXPECT_TRUE(r.isOk()) << r.error();
  return r ? std::move(*r) : nullptr;
}

}  // namespace tpscope::testing
