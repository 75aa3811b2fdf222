// Level of detail: TimelineData::queryRow against (1) a linear-scan implementation of the same rule and (2) a
// brute-force account of every span, at several zoom levels over random nested spans.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>

#include "tpscope/gui/frame_scheduler.h"
#include "tpscope/gui/timeline_data.h"

namespace tpscope::gui {
namespace {

// The rule of queryRow's header comment, by linear scans only.
std::vector<DrawItem> referenceRow(const LaneRow& r, const Viewport& vp) {
  const LodThresholds th = lodThresholds(vp);
  std::vector<DrawItem> out;
  size_t i = 0;
  while (i < r.size() && r.end[i] <= vp.startNs) ++i;
  while (i < r.size() && r.begin[i] < vp.endNs()) {
    if (r.end[i] - r.begin[i] >= th.minNs) {
      out.push_back({r.begin[i], r.end[i], static_cast<uint32_t>(i), 1, r.kind[i], false});
      ++i;
      continue;
    }
    size_t j = i + 1;
    int64_t runEnd = r.end[i];
    while (j < r.size() && runEnd - r.begin[i] < th.maxNs) {
      size_t k = j;
      while (k < r.size() && r.end[k] < runEnd + th.gapNs) ++k;
      if (k > j) {
        runEnd = r.end[k - 1];
        j = k;
      } else if (r.end[j] - r.begin[j] < th.minNs && r.begin[j] < runEnd + th.gapNs) {
        runEnd = r.end[j++];
      } else {
        break;
      }
    }
    std::array<uint32_t, kKindCount> counts{};
    for (size_t k = i; k < j; ++k) ++counts[r.kind[k]];
    out.push_back({r.begin[i], runEnd, static_cast<uint32_t>(i), static_cast<uint32_t>(j - i), majorityKind(counts),
                   true});
    i = j;
  }
  return out;
}

// Random lanes: top-level spans with nested children, sizes spread over 5 orders of magnitude.
std::vector<InputSpan> randomSpans(unsigned seed, int lanes, int perLane) {
  std::mt19937_64 rng(seed);
  std::vector<InputSpan> spans;
  for (int lane = 0; lane < lanes; ++lane) {
    int64_t t = 0;
    for (int i = 0; i < perLane; ++i) {
      const int64_t gap = std::uniform_int_distribution<int64_t>(0, 2000)(rng);
      const int64_t dur = int64_t{1} << std::uniform_int_distribution<int>(2, 18)(rng);
      InputSpan s;
      s.rank = lane / 2;
      s.thread = lane % 2;
      s.beginNs = t + gap;
      s.endNs = s.beginNs + dur;
      s.kind = static_cast<uint8_t>(rng() % kKindCount);
      s.name = static_cast<uint32_t>(rng() % 4);
      spans.push_back(s);
      // Children: up to 3, strictly inside.
      int64_t c = s.beginNs;
      for (int k = 0; k < 3 && dur > 16; ++k) {
        const int64_t cd = std::uniform_int_distribution<int64_t>(1, std::max<int64_t>(1, dur / 4))(rng);
        if (c + cd > s.endNs) break;
        InputSpan ch = s;
        ch.beginNs = c;
        ch.endNs = c + cd;
        ch.kind = static_cast<uint8_t>(rng() % kKindCount);
        spans.push_back(ch);
        c += cd + std::uniform_int_distribution<int64_t>(0, 8)(rng);
      }
      t = s.endNs;
    }
  }
  std::shuffle(spans.begin(), spans.end(), rng);
  return spans;
}

TEST(Lod, RowsAreSortedAndDisjoint) {
  auto data = TimelineData::build(randomSpans(1, 4, 3000), {"a", "b", "c", "d"}, {}, 2);
  size_t total = 0;
  ASSERT_EQ(data.lanes().size(), 4u);
  for (const Lane& lane : data.lanes()) {
    ASSERT_GE(lane.rows.size(), 2u);
    for (const LaneRow& r : lane.rows) {
      total += r.size();
      for (size_t i = 1; i < r.size(); ++i) {
        EXPECT_LE(r.end[i - 1], r.begin[i]);
        EXPECT_LE(r.end[i - 1], r.end[i]);
      }
    }
  }
  EXPECT_EQ(total, data.spanCount());
}

TEST(Lod, EqualsLinearReferenceAtSeveralZoomLevels) {
  auto data = TimelineData::build(randomSpans(7, 4, 5000), {"a", "b", "c", "d"}, {}, 2);
  const int64_t extent = data.endNs() - data.beginNs();
  int checkedMerged = 0, checkedSingle = 0;
  for (double zoom : {1.0, 3.0, 17.0, 100.0, 1000.0, 20000.0}) {
    for (double offset : {0.0, 0.13, 0.5, 0.77}) {
      Viewport vp;
      vp.widthPx = 1200;
      vp.nsPerPx = static_cast<double>(extent) / zoom / vp.widthPx;
      vp.startNs = data.beginNs() + static_cast<int64_t>(offset * extent);
      for (size_t l = 0; l < data.lanes().size(); ++l)
        for (size_t d = 0; d < data.lanes()[l].rows.size(); ++d) {
          const auto got = data.queryRow(static_cast<int>(l), static_cast<int>(d), vp);
          const auto want = referenceRow(data.lanes()[l].rows[d], vp);
          ASSERT_EQ(got, want) << "zoom " << zoom << " offset " << offset << " lane " << l << " row " << d;
          for (const auto& it : got) (it.merged ? checkedMerged : checkedSingle)++;
        }
    }
  }
  EXPECT_GT(checkedMerged, 100);
  EXPECT_GT(checkedSingle, 100);
}

// Independent of the rule's details: every visible span is accounted for exactly once, wide spans are never
// merged away, a block's extent covers its members, and its kind is their brute-force majority.
TEST(Lod, AccountsForEverySpanOnce) {
  auto data = TimelineData::build(randomSpans(11, 2, 8000), {"a"}, {}, 1);
  const int64_t extent = data.endNs() - data.beginNs();
  for (double zoom : {1.0, 10.0, 250.0, 5000.0}) {
    Viewport vp;
    vp.widthPx = 1000;
    vp.nsPerPx = static_cast<double>(extent) / zoom / vp.widthPx;
    vp.startNs = data.beginNs() + extent / 3;
    for (size_t l = 0; l < data.lanes().size(); ++l)
      for (size_t d = 0; d < data.lanes()[l].rows.size(); ++d) {
        const LaneRow& r = data.lanes()[l].rows[d];
        const auto items = data.queryRow(static_cast<int>(l), static_cast<int>(d), vp);
        std::vector<int> seen(r.size(), 0);
        for (const auto& it : items) {
          std::array<uint32_t, kKindCount> counts{};
          for (uint32_t k = it.first; k < it.first + it.count; ++k) {
            ++seen[k];
            ++counts[r.kind[k]];
            EXPECT_GE(r.begin[k], it.beginNs);
            EXPECT_LE(r.end[k], it.endNs);
          }
          EXPECT_EQ(it.kind, majorityKind(counts));
          if (it.merged) {
            EXPECT_LE(it.endNs - it.beginNs, lodThresholds(vp).maxNs + 2 * lodThresholds(vp).gapNs + lodThresholds(vp).minNs);
          }
        }
        for (size_t k = 0; k < r.size(); ++k) {
          const bool visible = r.end[k] > vp.startNs && r.begin[k] < vp.endNs();
          if (visible) {
            EXPECT_EQ(seen[k], 1) << "span " << k << " zoom " << zoom;
            const bool wide = r.end[k] - r.begin[k] >= lodThresholds(vp).minNs;
            if (wide) {
              auto it = std::find_if(items.begin(), items.end(), [&](const DrawItem& x) { return x.first == k; });
              ASSERT_NE(it, items.end());
              EXPECT_FALSE(it->merged) << "a span at least kMinVisiblePx wide is drawn as itself";
            }
          } else if (r.begin[k] >= vp.endNs() || r.end[k] <= vp.startNs) {
            // Invisible spans may only appear as the tail of a block that started on screen.
            if (seen[k]) {
              auto it = std::find_if(items.begin(), items.end(), [&](const DrawItem& x) {
                return x.first <= k && k < x.first + x.count;
              });
              ASSERT_NE(it, items.end());
              EXPECT_TRUE(it->merged);
            }
          }
        }
        // Output in time order, without overlap.
        for (size_t i = 1; i < items.size(); ++i) EXPECT_LE(items[i - 1].endNs, items[i].beginNs);
      }
  }
}

// The first frame of a big run comes from the file's lane summary (tracedb/lane_summary.h): its rows must be the
// rows build() lays the same spans out in, every span counted once, and a bucket of several drawn as one block.
TEST(Lod, ASummaryTimelineHasTheRowsOfTheFullOneAndDrawsBucketsAsBlocks) {
  const auto spans = randomSpans(5, 4, 4000);
  std::vector<tracedb::SpanRow> rows;
  for (const InputSpan& s : spans)
    rows.push_back({s.rank, s.thread, static_cast<tracedb::SpanKind>(s.kind), s.name, s.beginNs, s.endNs - s.beginNs,
                    s.step, s.layer, static_cast<tracedb::Phase>(s.phase), {}});
  const std::vector<std::string> strings{"a", "b", "c", "d"};
  const auto full = TimelineData::build(spans, strings, {}, 1);
  const auto summary = TimelineData::fromSummary(tracedb::summarizeLanes(rows, 300), {0, 1, 2, 3},
                                                 [](int) { return int64_t{0}; }, strings);
  ASSERT_TRUE(summary.summary());
  EXPECT_FALSE(full.summary());
  EXPECT_EQ(summary.spanCount(), full.spanCount());
  EXPECT_EQ(summary.beginNs(), full.beginNs());
  EXPECT_EQ(summary.endNs(), full.endNs());
  ASSERT_EQ(summary.lanes().size(), full.lanes().size());
  int blocks = 0;
  for (size_t l = 0; l < full.lanes().size(); ++l) {
    const Lane& f = full.lanes()[l];
    const Lane& m = summary.lanes()[l];
    EXPECT_EQ(m.label, f.label);
    ASSERT_EQ(m.rows.size(), f.rows.size()) << "lane " << l;
    for (size_t d = 0; d < f.rows.size(); ++d) {
      const LaneRow& fr = f.rows[d];
      const LaneRow& mr = m.rows[d];
      uint64_t weight = 0;
      for (uint32_t w : mr.weight) weight += w;
      EXPECT_EQ(weight, fr.size()) << "lane " << l << " row " << d;
      // Every span of the full row lies inside an entry of the summary row.
      for (size_t i = 0; i < fr.size(); ++i) {
        const size_t e = std::upper_bound(mr.begin.begin(), mr.begin.end(), fr.begin[i]) - mr.begin.begin();
        ASSERT_GT(e, 0u);
        EXPECT_GE(mr.end[e - 1], fr.end[i]) << "lane " << l << " row " << d << " span " << i;
      }
      // Zoomed in far enough that every entry is wide: an entry of several spans is still one merged block.
      Viewport vp;
      vp.widthPx = 1000;
      vp.nsPerPx = 0.001;
      for (size_t e = 0; e < mr.size() && blocks < 50; ++e) {
        if (mr.weight[e] < 2) continue;
        vp.startNs = mr.begin[e];
        const auto items = summary.queryRow(static_cast<int>(l), static_cast<int>(d), vp);
        ASSERT_FALSE(items.empty());
        EXPECT_TRUE(items[0].merged);
        EXPECT_EQ(items[0].count, mr.weight[e]);
        ++blocks;
      }
    }
  }
  EXPECT_GT(blocks, 10);
}

// Zoomed out, frames come from the coarser levels (buckets of at most a pixel): they must cover the same pixels
// as the spans themselves, with far fewer items.
TEST(Lod, CoarserLevelsDrawTheSamePixelsAsTheSpans) {
  auto data = TimelineData::build(randomSpans(9, 4, 60000), {"a", "b", "c", "d"}, {}, 2);
  data.buildLevels(2);
  ASSERT_GE(data.levels().size(), 1u);
  for (size_t i = 1; i < data.levels().size(); ++i)
    EXPECT_EQ(data.levels()[i - 1]->bucketNs(), 4 * data.levels()[i]->bucketNs()) << "coarsest first, 4× apart";
  const int64_t extent = data.endNs() - data.beginNs();
  int framesOnLevels = 0;
  for (double zoom : {1.0, 3.0, 10.0, 40.0, 200.0}) {
    Viewport vp;
    vp.widthPx = 400;  // a level is used up to zoom 4096 / 400
    vp.nsPerPx = static_cast<double>(extent) / zoom / vp.widthPx;
    vp.startNs = data.beginNs() + extent / 3 - static_cast<int64_t>(vp.nsPerPx * vp.widthPx / 2 / zoom);
    const Frame frame = computeFrame(data, vp);
    if (frame.level < 0) continue;
    ++framesOnLevels;
    const TimelineData& level = frame.source(data);
    EXPECT_LE(level.bucketNs(), vp.nsPerPx);
    size_t levelItems = 0, spanItems = 0, covered = 0, differ = 0;
    for (size_t l = 0; l < data.lanes().size(); ++l)
      for (size_t d = 0; d < data.lanes()[l].rows.size(); ++d) {
        auto pixels = [&](const std::vector<DrawItem>& items) {
          std::vector<char> px(static_cast<size_t>(vp.widthPx), 0);
          for (const DrawItem& it : items) {
            const auto x0 = std::max<int64_t>(0, static_cast<int64_t>((it.beginNs - vp.startNs) / vp.nsPerPx));
            const auto x1 = std::min<int64_t>(vp.widthPx - 1, static_cast<int64_t>((it.endNs - vp.startNs) /
                                                                                  vp.nsPerPx));
            for (int64_t x = x0; x <= x1; ++x) px[static_cast<size_t>(x)] = 1;
          }
          return px;
        };
        const auto& fromLevel = frame.items[l][d];
        const auto fromSpans = data.queryRow(static_cast<int>(l), static_cast<int>(d), vp);
        levelItems += fromLevel.size();
        spanItems += fromSpans.size();
        const auto a = pixels(fromLevel), b = pixels(fromSpans);
        for (size_t x = 0; x < a.size(); ++x) {
          covered += b[x];
          differ += a[x] != b[x];
        }
      }
    EXPECT_LE(differ * 50, covered) << "zoom " << zoom << ": " << differ << " of " << covered << " pixels differ";
    EXPECT_LE(levelItems * 10, spanItems * 11) << "zoom " << zoom << ": about as many items to paint";
    std::printf("zoom %g: %zu of %zu pixels differ; %zu items from the level, %zu from the spans\n", zoom, differ,
                covered, levelItems, spanItems);
  }
  EXPECT_EQ(framesOnLevels, 3);
}

TEST(Lod, EmptyAndOutOfRange) {
  auto empty = TimelineData::build(std::vector<InputSpan>{}, {}, {}, 2);
  EXPECT_EQ(empty.lanes().size(), 0u);
  EXPECT_TRUE(empty.queryRow(0, 0, {}).empty());
  EXPECT_FALSE(empty.spanAt(0, 5).valid());
  auto data = TimelineData::build(randomSpans(3, 1, 50), {"a"}, {}, 1);
  EXPECT_TRUE(data.queryRow(0, 99, {}).empty());
  EXPECT_TRUE(data.queryRow(-1, 0, {}).empty());
  Viewport far;
  far.startNs = data.endNs() + 1000;
  far.nsPerPx = 1;
  far.widthPx = 100;
  EXPECT_TRUE(data.queryRow(0, 0, far).empty());
}

TEST(Lod, SpanAtFindsInnermostAndSearchMatchesNames) {
  std::vector<InputSpan> spans = {
      {0, 0, 100, 1000, 1, 0, -1, 4, 0},  // step
      {0, 0, 200, 500, 2, 0, 0, 0, 1},    // compute, nested
      {1, 0, 300, 400, 2, 1, 0, 1, 1},
  };
  auto data = TimelineData::build(spans, {"", "train_step", "Layers.0.FWD"}, {}, 1);
  const SpanRef inner = data.spanAt(0, 250);
  ASSERT_TRUE(inner.valid());
  EXPECT_EQ(inner.row, 1);
  EXPECT_EQ(data.row(inner).begin[inner.index], 200);
  const SpanRef outer = data.spanAt(0, 700);
  ASSERT_TRUE(outer.valid());
  EXPECT_EQ(outer.row, 0);
  EXPECT_FALSE(data.spanAt(0, 5000).valid());
  EXPECT_TRUE(data.spanAt(0, 1010, 20).valid());
  const auto found = data.search("layers.0");
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(data.row(found[0]).begin[found[0].index], 200);
  EXPECT_EQ(data.row(found[1]).begin[found[1].index], 300);
  EXPECT_TRUE(data.search("nope").empty());
  EXPECT_TRUE(data.contains(inner));
  EXPECT_FALSE(data.contains({0, 7, 0}));
  EXPECT_FALSE(data.contains({5, 0, 0}));
  EXPECT_FALSE(data.contains({0, 0, 99}));
  EXPECT_FALSE(data.contains({}));
}

}  // namespace
}  // namespace tpscope::gui
