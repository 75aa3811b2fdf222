// The lane summary (tracedb/lane_summary.h): its definition checked against a direct account of the spans (each
// span inside exactly one entry of its row, entries' counts and majority kinds), the file round trip, and the
// cases where a reader must read the spans instead (stale, another version) or fail (a damaged blob).
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <algorithm>
#include <array>
#include <climits>
#include <random>

#include "test_dir.h"
#include "tpscope/tracedb/lane_summary.h"
#include "tpscope/tracedb/writer.h"

namespace tpscope::tracedb {
namespace {

using tpscope::testing::TempDir;

// Two lanes of nested spans whose sizes spread over five orders of magnitude, in no particular order.
std::vector<SpanRow> randomSpans(unsigned seed, int perLane) {
  std::mt19937_64 rng(seed);
  std::vector<SpanRow> spans;
  for (int lane = 0; lane < 2; ++lane) {
    int64_t t = 1'000'000;
    for (int i = 0; i < perLane; ++i) {
      const int64_t dur = int64_t{1} << std::uniform_int_distribution<int>(2, 20)(rng);
      SpanRow s{lane, 3 * lane, static_cast<SpanKind>(rng() % kSpanKindCount), static_cast<uint32_t>(rng() % 5),
                t + static_cast<int64_t>(rng() % 3000), dur, i / 50, static_cast<int>(rng() % 4), Phase::Forward, {}};
      spans.push_back(s);
      int64_t c = s.beginNs;
      for (int k = 0; k < 3 && dur > 16; ++k) {  // children strictly inside
        SpanRow ch = s;
        ch.beginNs = c;
        ch.durNs = std::uniform_int_distribution<int64_t>(1, dur / 4)(rng);
        ch.kind = static_cast<SpanKind>(rng() % kSpanKindCount);
        if (ch.endNs() > s.endNs()) break;
        spans.push_back(ch);
        c = ch.endNs() + static_cast<int64_t>(rng() % 8);
      }
      t = s.endNs();
    }
  }
  std::shuffle(spans.begin(), spans.end(), rng);
  return spans;
}

// The rows of one lane by nesting depth, as the viewer lays them out (each span under every open span it begins in).
std::vector<std::vector<SpanRow>> rowsOf(std::vector<SpanRow> lane) {
  std::sort(lane.begin(), lane.end(), [](const SpanRow& a, const SpanRow& b) {
    return a.beginNs != b.beginNs ? a.beginNs < b.beginNs : a.endNs() > b.endNs();
  });
  std::vector<std::vector<SpanRow>> rows;
  std::vector<int64_t> open;
  for (const SpanRow& s : lane) {
    while (!open.empty() && open.back() <= s.beginNs) open.pop_back();
    if (rows.size() <= open.size()) rows.resize(open.size() + 1);
    rows[open.size()].push_back(s);
    open.push_back(s.endNs());
  }
  return rows;
}

TEST(LaneSummary, EverySpanIsInsideExactlyOneEntryOfItsRow) {
  const auto spans = randomSpans(11, 4000);
  const LaneSummary summary = summarizeLanes(spans, 512);
  EXPECT_EQ(summary.spanCount, static_cast<int64_t>(spans.size()));
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  for (const auto& s : spans) lo = std::min(lo, s.beginNs), hi = std::max(hi, s.endNs());
  EXPECT_EQ(summary.originNs, lo);
  size_t rowsChecked = 0, bucketsOfSeveral = 0;
  for (int lane = 0; lane < 2; ++lane) {
    std::vector<SpanRow> mine;
    for (const auto& s : spans)
      if (s.rank == lane) mine.push_back(s);
    const auto rows = rowsOf(mine);
    // A bucket per 16 spans of a row, at most 512 here, over the run's extent; the rank's finest bucket is how long
    // a span must be to be kept as itself in any of its rows.
    auto bucketOf = [&](size_t n) {
      const int64_t buckets = std::clamp<int64_t>(static_cast<int64_t>(n / 16), 1, 512);
      return (hi - lo + buckets - 1) / buckets;
    };
    int64_t keep = INT64_MAX;
    for (const auto& row : rows) keep = std::min(keep, bucketOf(row.size()));
    for (size_t d = 0; d < rows.size(); ++d) {
      auto it = std::find_if(summary.rows.begin(), summary.rows.end(), [&](const LaneSummaryRow& r) {
        return r.rank == lane && r.thread == 3 * lane && r.depth == static_cast<int>(d);
      });
      ASSERT_NE(it, summary.rows.end()) << "lane " << lane << " depth " << d;
      const int64_t buckets = std::clamp<int64_t>(static_cast<int64_t>(rows[d].size() / 16), 1, 512);
      EXPECT_EQ(it->bucketNs, bucketOf(rows[d].size())) << "lane " << lane << " depth " << d;
      const auto& entries = it->entries;
      for (size_t i = 1; i < entries.size(); ++i) ASSERT_LE(entries[i - 1].endNs, entries[i].beginNs);
      const auto keptForTheRank = std::count_if(rows[d].begin(), rows[d].end(), [&](const SpanRow& s) {
        return s.durNs >= keep && s.durNs < it->bucketNs;
      });
      EXPECT_LE(entries.size(), 3u * static_cast<size_t>(buckets) + 2u * static_cast<size_t>(keptForTheRank));
      // Walk spans and entries together: each span falls in the entry that contains it, and the entry's count,
      // kind and exactness follow from the spans found in it.
      size_t e = 0, inEntry = 0;
      std::array<uint32_t, kSpanKindCount> kinds{};
      auto closeEntry = [&] {
        ASSERT_EQ(entries[e].count, inEntry) << "entry " << e;
        if (inEntry > 1) {
          const auto majority = std::max_element(kinds.begin(), kinds.end()) - kinds.begin();
          EXPECT_EQ(entries[e].kind, majority);
          ++bucketsOfSeveral;
        }
        kinds = {};
        inEntry = 0;
        ++e;
      };
      for (const SpanRow& s : rows[d]) {
        while (e < entries.size() && entries[e].endNs <= s.beginNs) closeEntry();  // spans here last ≥ 1 ns
        ASSERT_LT(e, entries.size());
        ASSERT_LE(entries[e].beginNs, s.beginNs);
        ASSERT_GE(entries[e].endNs, s.endNs());
        if (s.durNs >= keep) {  // a span as long as the rank's finest bucket is kept as itself
          EXPECT_EQ(entries[e].count, 1u);
          EXPECT_EQ(entries[e].beginNs, s.beginNs);
          EXPECT_EQ(entries[e].endNs, s.endNs());
        }
        if (entries[e].count > 1) {
          EXPECT_LT(s.durNs, keep) << "merged spans are shorter than the rank's finest bucket";
        }
        ++inEntry;
        ++kinds[static_cast<int>(s.kind)];
      }
      while (e < entries.size()) closeEntry();
      ++rowsChecked;
    }
  }
  EXPECT_GE(rowsChecked, 4u);
  EXPECT_GT(bucketsOfSeveral, 100u);  // the case under test: short spans merged
}

// Edits the file behind tracedb's back, as another tool or a damaged disk would.
void sql(const std::filesystem::path& path, const char* statement) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, statement, nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
  sqlite3_close(db);
}

// A summary read back from a file against the one summarizeLanes makes of the same spans.
void expectSameSummary(const LaneSummary& got, const LaneSummary& expected) {
  EXPECT_EQ(got.originNs, expected.originNs);
  EXPECT_EQ(got.spanCount, expected.spanCount);
  ASSERT_EQ(got.rows.size(), expected.rows.size());
  for (size_t i = 0; i < got.rows.size(); ++i) {
    EXPECT_EQ(got.rows[i].rank, expected.rows[i].rank);
    EXPECT_EQ(got.rows[i].thread, expected.rows[i].thread);
    EXPECT_EQ(got.rows[i].depth, expected.rows[i].depth);
    EXPECT_EQ(got.rows[i].bucketNs, expected.rows[i].bucketNs);
    EXPECT_EQ(got.rows[i].entries, expected.rows[i].entries);
  }
}

// The summary the file at `path` holds, against `expected`.
void expectFileHolds(const std::filesystem::path& path, const LaneSummary& expected) {
  auto r = Reader::open(path);
  ASSERT_TRUE(r.isOk());
  auto read = readLaneSummary(**r);
  ASSERT_TRUE(read.isOk()) << read.error();
  ASSERT_TRUE(read->has_value());
  expectSameSummary(**read, expected);
}

TEST(LaneSummary, RoundTripsThroughTheFileAndIsIgnoredOnceStale) {
  TempDir dir;
  const auto spans = randomSpans(3, 800);
  const auto path = dir / "run.db";
  {
    auto w = Writer::create(path, CreateOptions{false, "run-1", 1'000'000'000, "merge"});
    ASSERT_TRUE(w.isOk()) << w.error();
    for (uint32_t i = 0; i < 5; ++i) ASSERT_TRUE((*w)->intern("name" + std::to_string(i)).isOk());
    ASSERT_TRUE((*w)->addSpans(spans));
    ASSERT_TRUE((*w)->close());
  }
  {
    auto r = Reader::open(path);
    ASSERT_TRUE(r.isOk());
    auto none = readLaneSummary(**r);
    ASSERT_TRUE(none.isOk()) << none.error();
    EXPECT_FALSE(none->has_value());  // not written yet: read the spans
  }
  ASSERT_TRUE(writeLaneSummary(path, 256));
  expectFileHolds(path, summarizeLanes(spans, 256));
  // Spans added since: the summary no longer describes the file.
  {
    sql(path, "INSERT INTO spans(rank, thread, kind, name, begin_ns, dur_ns) VALUES (0, 0, 0, 1, 5, 10)");
    auto r = Reader::open(path);
    ASSERT_TRUE(r.isOk());
    auto stale = readLaneSummary(**r);
    ASSERT_TRUE(stale.isOk()) << stale.error();
    EXPECT_FALSE(stale->has_value());
  }
}

// A file whose ranks' spans are each one run of rows (imports, merges) is summarised a rank at a time: the rows are
// those of the whole run summarised at once, in rank order whatever the ranks' order in the file.
TEST(LaneSummary, ARankAtATimeGivesTheWholeRunsRows) {
  TempDir dir;
  std::vector<SpanRow> spans = randomSpans(17, 700);
  for (SpanRow s : randomSpans(23, 300)) {  // a third rank, later and on its own thread
    s.rank = 2;
    s.thread = 5;
    s.beginNs += 40'000'000;
    spans.push_back(s);
  }
  std::stable_sort(spans.begin(), spans.end(), [](const SpanRow& a, const SpanRow& b) {
    return (a.rank + 1) % 3 < (b.rank + 1) % 3;  // ranks 2, 0, 1: each one run of rows, not in rank order
  });
  const auto path = dir / "run.db";
  {
    auto w = Writer::create(path, CreateOptions{false, "run-1", 1'000'000'000, "merge"});
    ASSERT_TRUE(w.isOk()) << w.error();
    ASSERT_TRUE((*w)->addSpans(spans));
    ASSERT_TRUE((*w)->close());
  }
  ASSERT_TRUE(writeLaneSummary(path, 256));
  expectFileHolds(path, summarizeLanes(spans, 256));
}

TEST(LaneSummary, AnotherVersionIsIgnoredAndADamagedBlobIsAnErrorNamingTheFile) {
  TempDir dir;
  const auto path = dir / "run.db";
  {
    auto w = Writer::create(path, CreateOptions{false, "run-1", 1'000'000'000, "merge"});
    ASSERT_TRUE(w.isOk());
    ASSERT_TRUE((*w)->addSpans(randomSpans(5, 100)));
    ASSERT_TRUE((*w)->close());
  }
  ASSERT_TRUE(writeLaneSummary(path));
  sql(path, "UPDATE meta SET value = '999' WHERE key = 'lane_summary.version'");
  {
    auto r = Reader::open(path);
    ASSERT_TRUE(r.isOk());
    auto other = readLaneSummary(**r);
    ASSERT_TRUE(other.isOk());
    EXPECT_FALSE(other->has_value());
  }
  ASSERT_TRUE(writeLaneSummary(path));
  sql(path, "UPDATE lane_summary SET entries = x'0102030405' WHERE depth = 0");
  auto r = Reader::open(path);
  ASSERT_TRUE(r.isOk());
  auto damaged = readLaneSummary(**r);
  ASSERT_FALSE(damaged.isOk());
  EXPECT_NE(damaged.error().find(path.string()), std::string::npos) << damaged.error();
}

}  // namespace
}  // namespace tpscope::tracedb
