#include "tpscope/tracedb/lane_summary.h"

#include <sqlite3.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstring>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "sqlite_util.h"

namespace tpscope::tracedb {

namespace {

constexpr const char* kVersionKey = "lane_summary.version";
constexpr const char* kSpanKey = "lane_summary.span_max_id";
constexpr const char* kOriginKey = "lane_summary.origin_ns";
constexpr const char* kCountKey = "lane_summary.spans";
constexpr size_t kEntryBytes = 32;
constexpr int kKinds = kSpanKindCount;

constexpr const char* kSchema = R"SQL(
DROP TABLE IF EXISTS lane_summary;
CREATE TABLE lane_summary(
  rank      INTEGER NOT NULL,
  thread    INTEGER NOT NULL,
  depth     INTEGER NOT NULL,
  bucket_ns INTEGER NOT NULL,
  entries   BLOB NOT NULL,
  PRIMARY KEY(rank, thread, depth)
) WITHOUT ROWID;
)SQL";

// A span as the summary needs it: half a SpanRow's size, so 10 M of them fit in 320 MB while a file is summarised.
struct Span {
  int64_t beginNs;
  int64_t endNs;
  uint32_t name;
  int32_t step;
  int16_t layer;
  uint8_t kind;
  uint8_t phase;
};

Span compact(const SpanRow& r) {
  return {r.beginNs, r.beginNs + std::max<int64_t>(0, r.durNs), r.name, r.step, static_cast<int16_t>(r.layer),
          static_cast<uint8_t>(std::clamp(static_cast<int>(r.kind), 0, kKinds - 1)), static_cast<uint8_t>(r.phase)};
}

LaneSummaryEntry entryOf(const Span& s, uint32_t count) {
  return {s.beginNs, s.endNs, s.name, s.step, count, s.layer, s.kind, s.phase};
}

// A row of `spans` spans gets a bucket per kSpansPerBucket of them, at most `buckets`: entries stay a small share of
// the spans whatever the run's shape (a run of 1,000 sparse lanes as well as one of 16 dense ones).
int64_t rowBucketNs(size_t spans, int64_t extentNs, int buckets) {
  const int64_t n = std::clamp<int64_t>(static_cast<int64_t>(spans / kSpansPerBucket), 1, std::max(1, buckets));
  return std::max<int64_t>(1, (extentNs + n - 1) / n);
}

// One lane's spans sorted and put into rows by depth: each span's depth (it nests under every open span it begins
// inside) and each row's size.
struct LaneRows {
  int rank = 0, thread = 0;
  std::vector<Span>* spans = nullptr;
  std::vector<uint32_t> depths;
  std::vector<size_t> sizes;
};

LaneRows layOut(int rank, int thread, std::vector<Span>& spans) {
  auto before = [](const Span& a, const Span& b) {
    if (a.beginNs != b.beginNs) return a.beginNs < b.beginNs;
    return a.endNs > b.endNs;  // the enclosing span first, as the viewer orders them
  };
  if (!std::is_sorted(spans.begin(), spans.end(), before)) std::sort(spans.begin(), spans.end(), before);
  LaneRows lane{rank, thread, &spans, std::vector<uint32_t>(spans.size()), {}};
  std::vector<int64_t> openEnds;  // stack of the ends of open spans
  for (size_t i = 0; i < spans.size(); ++i) {
    while (!openEnds.empty() && openEnds.back() <= spans[i].beginNs) openEnds.pop_back();
    lane.depths[i] = static_cast<uint32_t>(openEnds.size());
    openEnds.push_back(spans[i].endNs);
    if (lane.sizes.size() <= lane.depths[i]) lane.sizes.resize(lane.depths[i] + 1, 0);
    ++lane.sizes[lane.depths[i]];
  }
  return lane;
}

// Each row of a laid-out lane through its summariser, spans of at least `keepNs` kept as themselves; appended to
// `out` in depth order.
void summarizeRows(LaneRows& lane, int64_t origin, int64_t extentNs, int buckets, int64_t keepNs,
                   std::vector<LaneSummaryRow>& out) {
  const size_t firstRow = out.size();
  for (size_t d = 0; d < lane.sizes.size(); ++d)
    out.push_back({lane.rank, lane.thread, static_cast<int>(d), rowBucketNs(lane.sizes[d], extentNs, buckets), {}});
  std::vector<RowSummarizer> rows;
  rows.reserve(lane.sizes.size());
  for (size_t d = 0; d < lane.sizes.size(); ++d)
    rows.emplace_back(origin, out[firstRow + d].bucketNs, out[firstRow + d].entries,
                      std::min(keepNs, out[firstRow + d].bucketNs));
  const std::vector<Span>& spans = *lane.spans;
  for (size_t i = 0; i < spans.size(); ++i) rows[lane.depths[i]].add(entryOf(spans[i], 1));
  for (auto& r : rows) r.finish();
  std::vector<Span>().swap(*lane.spans);
}

LaneSummary summarize(std::map<std::pair<int, int>, std::vector<Span>>& lanes, int64_t lo, int64_t hi, int buckets) {
  LaneSummary out;
  if (lanes.empty()) return out;
  out.originNs = lo;
  // A rank at a time: a span at least as long as the finest bucket of any of the rank's rows is kept as itself, so
  // whatever is merged into an entry is shorter than that — how far before a window a reader must look for a span
  // that overlaps it (the viewer's windows of a big run, gui/run_data.h loadWindow).
  for (auto it = lanes.begin(); it != lanes.end();) {
    const int rank = it->first.first;
    std::vector<LaneRows> rankLanes;
    int64_t keepNs = INT64_MAX;
    for (; it != lanes.end() && it->first.first == rank; ++it) {
      out.spanCount += static_cast<int64_t>(it->second.size());
      rankLanes.push_back(layOut(it->first.first, it->first.second, it->second));
      for (size_t size : rankLanes.back().sizes) keepNs = std::min(keepNs, rowBucketNs(size, hi - lo, buckets));
    }
    for (LaneRows& lane : rankLanes) summarizeRows(lane, lo, hi - lo, buckets, keepNs, out.rows);
  }
  return out;
}

// Gathers spans into lanes, tracking the time extent.
struct Gather {
  std::map<std::pair<int, int>, std::vector<Span>> lanes;
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  std::pair<int, int> lastKey{INT32_MIN, INT32_MIN};
  std::vector<Span>* last = nullptr;

  void add(const SpanRow& r) {
    if (!last || r.rank != lastKey.first || r.thread != lastKey.second) {  // spans come in runs of one lane
      lastKey = {r.rank, r.thread};
      last = &lanes[lastKey];
    }
    const Span s = compact(r);
    last->push_back(s);
    lo = std::min(lo, s.beginNs);
    hi = std::max(hi, s.endNs);
  }
};

std::string blobOf(const std::vector<LaneSummaryEntry>& entries) {
  std::string blob(entries.size() * kEntryBytes, '\0');
  char* p = blob.data();
  for (const auto& e : entries) {
    std::memcpy(p + 0, &e.beginNs, 8);
    std::memcpy(p + 8, &e.endNs, 8);
    std::memcpy(p + 16, &e.name, 4);
    std::memcpy(p + 20, &e.step, 4);
    std::memcpy(p + 24, &e.count, 4);
    std::memcpy(p + 28, &e.layer, 2);
    p[30] = static_cast<char>(e.kind);
    p[31] = static_cast<char>(e.phase);
    p += kEntryBytes;
  }
  return blob;
}

std::vector<LaneSummaryEntry> entriesOf(const void* data, size_t bytes) {
  std::vector<LaneSummaryEntry> out(bytes / kEntryBytes);
  const auto* p = static_cast<const unsigned char*>(data);
  for (auto& e : out) {
    std::memcpy(&e.beginNs, p + 0, 8);
    std::memcpy(&e.endNs, p + 8, 8);
    std::memcpy(&e.name, p + 16, 4);
    std::memcpy(&e.step, p + 20, 4);
    std::memcpy(&e.count, p + 24, 4);
    std::memcpy(&e.layer, p + 28, 2);
    e.kind = p[30];
    e.phase = p[31];
    p += kEntryBytes;
  }
  return out;
}

Status write(sqlite3* db, const std::filesystem::path& path, const LaneSummary& summary) {
  if (Status s = detail::exec(db, path, kSchema); !s) return s;
  detail::Stmt st(db, "INSERT INTO lane_summary VALUES (?, ?, ?, ?, ?)");
  for (const auto& row : summary.rows) {
    const std::string blob = blobOf(row.entries);
    st.bind(1, row.rank);
    st.bind(2, row.thread);
    st.bind(3, row.depth);
    st.bind(4, row.bucketNs);
    sqlite3_bind_blob(st.get(), 5, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT);
    if (st.step() != SQLITE_DONE) return detail::sqliteError(db, path, "cannot write lane_summary");
    st.reset();
  }
  int64_t spans = 0, collectives = 0;
  if (Status s = detail::recordStamp(db, path, &spans, &collectives); !s) return s;
  detail::Stmt meta(db, "INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)");
  const std::pair<const char*, int64_t> stamps[] = {{kVersionKey, kLaneSummaryVersion},
                                                    {kSpanKey, spans},
                                                    {kOriginKey, summary.originNs},
                                                    {kCountKey, summary.spanCount}};
  for (const auto& [key, value] : stamps) {
    meta.bind(1, std::string_view(key));
    meta.bind(2, std::string_view(std::to_string(value)));
    if (meta.step() != SQLITE_DONE) return detail::sqliteError(db, path, "cannot write meta");
    meta.reset();
  }
  return Status::ok();
}

}  // namespace

void RowSummarizer::add(const LaneSummaryEntry& s, uint32_t weight) {
  if (s.endNs - s.beginNs >= keepNs_) {  // long enough to be kept as itself
    finish();
    out_.push_back(s);
    out_.back().count = weight;
    return;
  }
  const int64_t index = (s.beginNs - origin_) / bucketNs_;
  if (entries_ > 0 && index != index_) finish();
  if (entries_ == 0) {
    index_ = index;
    first_ = longest_ = s;
    endNs_ = s.endNs;
  } else {
    if (s.endNs - s.beginNs > longest_.endNs - longest_.beginNs) longest_ = s;
    endNs_ = std::max(endNs_, s.endNs);
  }
  kinds_[std::min<int>(s.kind, kSpanKindCount - 1)] += weight;
  count_ += weight;
  ++entries_;
}

void RowSummarizer::finish() {
  if (entries_ == 1) {  // a bucket with one entry keeps it as it is
    out_.push_back(first_);
    out_.back().count = count_;
  } else if (entries_ > 1) {
    LaneSummaryEntry e = longest_;
    e.beginNs = first_.beginNs;
    e.endNs = endNs_;
    e.count = count_;
    e.kind = static_cast<uint8_t>(std::max_element(kinds_.begin(), kinds_.end()) - kinds_.begin());  // first max
    out_.push_back(e);
  }
  index_ = -1;
  count_ = entries_ = 0;
  kinds_ = {};
}

LaneSummary summarizeLanes(std::vector<SpanRow> spans, int buckets) {
  Gather g;
  for (const SpanRow& r : spans) g.add(r);
  std::vector<SpanRow>().swap(spans);
  return summarize(g.lanes, g.lo, g.hi, buckets);
}

namespace {

// The spans' extent as Gather measures it: [first begin, last end), an end being begin + max(0, dur).
Result<std::pair<int64_t, int64_t>> spanExtent(Reader& reader) {
  sqlite3* db = detail::Access::db(reader);
  detail::Stmt st(db, "SELECT min(begin_ns), max(begin_ns + dur_ns), max(begin_ns) FROM spans");
  if (!st.valid() || st.step() != SQLITE_ROW)
    return detail::sqliteError(db, reader.path(), "cannot read table 'spans'");
  return std::pair<int64_t, int64_t>{st.i64(0), std::max(st.i64(1), st.i64(2))};
}

// The rows of one rank's lanes (`part`, by summarize) appended to `into`.
void append(LaneSummary& into, LaneSummary part) {
  into.spanCount += part.spanCount;
  into.rows.insert(into.rows.end(), std::make_move_iterator(part.rows.begin()),
                   std::make_move_iterator(part.rows.end()));
}

// The whole file's spans gathered, then summarised.
Result<LaneSummary> summarizeWhole(Reader& reader, const IdRange& ids, int buckets) {
  Gather g;
  if (Status s = reader.forEachSpanInIdRange(ids.first, ids.last + 1,
                                             [&](const SpanRow& r) {
                                               g.add(r);
                                               return true;
                                             });
      !s)
    return s;
  return summarize(g.lanes, g.lo, g.hi, buckets);
}

}  // namespace

Result<LaneSummary> computeLaneSummary(const std::filesystem::path& path, int buckets) {
  LaneSummary summary;
  auto reader = Reader::open(path);
  if (!reader) return reader.status();
  auto ids = (*reader)->spanIdRange();
  if (!ids) return ids.status();
  if (ids->empty()) return summary;
  auto extent = spanExtent(**reader);
  if (!extent) return extent.status();
  const auto [lo, hi] = *extent;
  summary.originNs = lo;
  Gather g;
  std::set<int> done;
  bool interleaved = false;
  auto finishRank = [&]() {
    if (g.lanes.empty()) return;
    done.insert(g.lastKey.first);
    append(summary, summarize(g.lanes, lo, hi, buckets));
    g = Gather();
  };
  if (Status s = (*reader)->forEachSpanInIdRange(ids->first, ids->last + 1,
                                                 [&](const SpanRow& r) {
                                                   if (g.last != nullptr && r.rank != g.lastKey.first) finishRank();
                                                   if (g.last == nullptr && done.count(r.rank) != 0) {
                                                     interleaved = true;
                                                     return false;
                                                   }
                                                   g.add(r);
                                                   return true;
                                                 });
      !s)
    return s;
  finishRank();
  if (interleaved) return summarizeWhole(**reader, *ids, buckets);
  return summary;
}

Status writeLaneSummary(const std::filesystem::path& path, const LaneSummary& summary) {
  return detail::writeInTransaction(path, "lane summary", [&](sqlite3* db) { return write(db, path, summary); });
}

Status writeLaneSummary(const std::filesystem::path& path, int buckets) {
  auto summary = computeLaneSummary(path, buckets);  // its reader is closed before the file is written
  if (!summary) return summary.status();
  return writeLaneSummary(path, *summary);
}

Result<std::optional<LaneSummary>> readLaneSummary(Reader& reader) {
  sqlite3* db = detail::Access::db(reader);
  const auto value = [&](const char* key) { return detail::metaInt(reader, key); };
  const auto version = value(kVersionKey), stamp = value(kSpanKey), origin = value(kOriginKey),
             count = value(kCountKey);
  if (!version || *version != kLaneSummaryVersion || !stamp || !origin || !count)
    return std::optional<LaneSummary>();
  int64_t spans = 0, collectives = 0;
  if (Status s = detail::recordStamp(db, reader.path(), &spans, &collectives); !s) return s;
  if (spans != *stamp) return std::optional<LaneSummary>();  // spans added since

  LaneSummary out;
  out.originNs = *origin;
  out.spanCount = *count;
  detail::Stmt st(db,
                  "SELECT rank, thread, depth, bucket_ns, entries FROM lane_summary ORDER BY rank, thread, depth");
  if (!st.valid()) return std::optional<LaneSummary>();  // stamped but no table: read the spans instead
  int rc;
  while ((rc = st.step()) == SQLITE_ROW) {
    const void* data = sqlite3_column_blob(st.get(), 4);
    const auto bytes = static_cast<size_t>(sqlite3_column_bytes(st.get(), 4));
    if (bytes % kEntryBytes != 0)
      return Status::error(reader.path().string() + ": lane_summary: an entries blob of " + std::to_string(bytes) +
                           " bytes is not a whole number of entries");
    out.rows.push_back({st.i32(0), st.i32(1), st.i32(2), std::max<int64_t>(1, st.i64(3)), entriesOf(data, bytes)});
  }
  if (rc != SQLITE_DONE) return detail::sqliteError(db, reader.path(), "cannot read lane_summary");
  return std::optional<LaneSummary>(std::move(out));
}

}  // namespace tpscope::tracedb
