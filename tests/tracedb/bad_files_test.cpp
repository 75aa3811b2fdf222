// Files that are not valid traces give an error naming the file and the problem — never a crash.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <fstream>
#include <random>

#include "test_dir.h"
#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/writer.h"

namespace tpscope::tracedb {
namespace {

using tpscope::testing::TempDir;

void expectOpenError(const std::filesystem::path& p, const std::string& needle) {
  auto r = Reader::open(p);
  ASSERT_FALSE(r.isOk()) << p;
  EXPECT_NE(r.error().find(p.string()), std::string::npos) << r.error();
  EXPECT_NE(r.error().find(needle), std::string::npos) << r.error();
}

TEST(BadFiles, Missing) {
  TempDir dir;
  expectOpenError(dir / "nope.db", "no such file");
}

TEST(BadFiles, Folder) {
  TempDir dir;
  expectOpenError(dir.path(), "is a folder");
}

TEST(BadFiles, Empty) {
  TempDir dir;
  { std::ofstream(dir / "empty.db"); }
  expectOpenError(dir / "empty.db", "empty");
}

TEST(BadFiles, RandomBytes) {
  TempDir dir;
  std::mt19937 rng(42);
  {
    std::ofstream f(dir / "random.db", std::ios::binary);
    for (int i = 0; i < 64 * 1024; ++i) f.put(static_cast<char>(rng()));
  }
  expectOpenError(dir / "random.db", "not a database");
}

TEST(BadFiles, UnrelatedSqliteFile) {
  TempDir dir;
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir / "other.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE songs(title TEXT); INSERT INTO songs VALUES ('x');", nullptr, nullptr,
                         nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  expectOpenError(dir / "other.db", "not a tpscope trace");

  // A 'meta' table of somebody else's format.
  ASSERT_EQ(sqlite3_open((dir / "meta.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE meta(key TEXT, value TEXT); INSERT INTO meta VALUES ('format', 'nsys');",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  expectOpenError(dir / "meta.db", "not a tpscope trace");
}

TEST(BadFiles, NewerFormatVersion) {
  TempDir dir;
  ASSERT_TRUE((*Writer::create(dir / "new.db", CreateOptions{}))->close());
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir / "new.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "PRAGMA user_version = 99", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  expectOpenError(dir / "new.db", "newer tpscope");
  expectOpenError(dir / "new.db", "version 99");
}

TEST(BadFiles, TruncatedFileFailsCleanly) {
  TempDir dir;
  {
    auto w = Writer::create(dir / "full.db", CreateOptions{});
    ASSERT_TRUE(w.isOk());
    const uint32_t name = *(*w)->intern("span");
    std::vector<SpanRow> spans(20000);
    for (size_t i = 0; i < spans.size(); ++i) spans[i] = SpanRow{0, 0, SpanKind::Compute, name, int64_t(i) * 10, 5};
    ASSERT_TRUE((*w)->addSpans(spans));
    ASSERT_TRUE((*w)->close());
  }
  const auto size = std::filesystem::file_size(dir / "full.db");
  for (const double keep : {0.1, 0.5, 0.9}) {
    const auto cut = dir / ("cut" + std::to_string(int(keep * 100)) + ".db");
    std::filesystem::copy_file(dir / "full.db", cut);
    std::filesystem::resize_file(cut, static_cast<uintmax_t>(size * keep));
    auto r = Reader::open(cut);
    if (!r.isOk()) {
      EXPECT_NE(r.error().find(cut.string()), std::string::npos) << r.error();
      continue;
    }
    // The damage is reached by the query, which must fail with the file named.
    auto spans = (*r)->spans();
    if (spans.isOk()) {
      EXPECT_LT(spans->size(), 20000u) << "a truncated file cannot hold every span";
    } else {
      EXPECT_NE(spans.error().find(cut.string()), std::string::npos) << spans.error();
    }
  }
}

}  // namespace
}  // namespace tpscope::tracedb
