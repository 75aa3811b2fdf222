// The timeline's summary, written beside a run file's spans (issue #17: compute at write time, read at open time), so
// a viewer draws the whole run from a few MB instead of the span table. Perfetto keeps per-track mipmaps for the same
// reason; this is one level of them, at a resolution finer than any screen shows the whole run at.
//
// Design: the spans of each lane (rank × thread) are put into rows by nesting depth exactly as the viewer does; each
// row's time is cut into equal buckets, and the short spans that begin in one bucket merge into one entry while the
// long ones are kept as themselves (the rule is at summarizeLanes), so the entries stay a small share of the spans
// whatever the run's shape. Stored in table lane_summary (docs/schema.md), stamped with the definition's version and
// the span ids it was computed from: a reader that finds another version, or spans added since, gets nothing and
// reads the spans (readLaneSummary). Times are the file's own (the spans table's); names are the file's string ids.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/records.h"
#include "tpscope/tracedb/status.h"

namespace tpscope::tracedb {

inline constexpr int kLaneSummaryVersion = 2;
inline constexpr int kLaneSummaryBuckets = 4096;  // at most, per row
inline constexpr size_t kSpansPerBucket = 16;

struct LaneSummaryEntry {
  int64_t beginNs = 0;
  int64_t endNs = 0;
  uint32_t name = 0;   // string id (the longest span's, for a bucket of several)
  int32_t step = -1;
  uint32_t count = 1;  // spans this entry stands for; 1: the entry is that span
  int16_t layer = -1;
  uint8_t kind = 0;    // SpanKind (majority kind for a bucket of several)
  uint8_t phase = 0;   // Phase
  bool operator==(const LaneSummaryEntry&) const = default;
};

struct LaneSummaryRow {
  int rank = 0;
  int thread = 0;
  int depth = 0;
  int64_t bucketNs = 1;  // this row's bucket width
  std::vector<LaneSummaryEntry> entries;  // sorted by begin, disjoint
};

struct LaneSummary {
  int64_t originNs = 0;  // first span's begin: bucket 0 of every row starts here
  int64_t spanCount = 0;  // spans summarised
  std::vector<LaneSummaryRow> rows;  // by rank, thread, depth
};

// Summarises spans given in any order (consumed). `buckets` ≥ 1: the most a row gets.
// Rows: a lane's spans sorted by begin, the longer first at equal begins; a span nests under every open span it
// begins inside. Each row's time from the run's first begin is cut into equal buckets, one per kSpansPerBucket spans
// of the row and at most `buckets` (4,096: finer than any screen shows a whole run). In each row:
//   - a span at least one bucket long is kept as itself (count 1), and so is a span at least as long as the finest
//     bucket of any row of its rank (version 2): whatever an entry merges is shorter than that, so a reader that
//     wants every span overlapping a time t finds the longer ones here and the rest beginning at most that long
//     before t (the viewer's windows of a run too big to read whole, gui/run_data.h loadWindow);
//   - the shorter spans that begin in one bucket become one entry: their hull [first begin, last end), how many they
//     are, their majority kind (ties: lowest id), and the name, step, layer and phase of the longest of them. A
//     bucket with a single short span keeps that span as itself (count 1).
// Entries of a row are sorted and disjoint (short spans of a bucket end before the next bucket's first begins, and a
// kept span begins after every short span before it), so a row has at most 3 × its buckets entries plus the spans
// kept for their rank's finest bucket (no more than the row's spans, and few: in a row that has many, that row's
// bucket is the finest).
LaneSummary summarizeLanes(std::vector<SpanRow> spans, int buckets = kLaneSummaryBuckets);

// summarizeLanes' rule for one row whose spans are already laid out (sorted by begin, disjoint): add() them in
// order, then finish(). The viewer uses it for finer levels of its own, from the rows it has built.
class RowSummarizer {
 public:
  // Spans at least `keepNs` long are kept as themselves (default, and at most: a bucket).
  RowSummarizer(int64_t originNs, int64_t bucketNs, std::vector<LaneSummaryEntry>& out, int64_t keepNs = INT64_MAX)
      : origin_(originNs),
        bucketNs_(std::max<int64_t>(1, bucketNs)),
        keepNs_(std::clamp<int64_t>(keepNs, 1, std::max<int64_t>(1, bucketNs))),
        out_(out) {}
  // `weight`: spans the added one stands for (a row that is itself a summary); counts and kinds add up by weight.
  void add(const LaneSummaryEntry& span, uint32_t weight = 1);
  void finish();

 private:
  int64_t origin_, bucketNs_, keepNs_;
  std::vector<LaneSummaryEntry>& out_;
  int64_t index_ = -1, endNs_ = 0;
  uint32_t count_ = 0, entries_ = 0;
  LaneSummaryEntry first_{}, longest_{};
  std::array<uint32_t, kSpanKindCount> kinds_{};
};

// Reads the spans of the file at `path`, summarises them and writes the summary into the file (one transaction; the
// records are untouched). Error: the file cannot be read or written. Table lane_summary: one row per (rank, thread,
// depth) with its bucket width and its entries packed in a blob (32 bytes each, little-endian: begin i64, end i64,
// name u32, step i32, count u32, layer i16, kind u8, phase u8); meta holds the version and the span ids.
Status writeLaneSummary(const std::filesystem::path& path, int buckets = kLaneSummaryBuckets);

// writeLaneSummary in two halves, for a caller that reads the file for other summaries meanwhile. The first reads the
// spans (its own connection) and summarises them a rank at a time: summarize() needs the run's extent (one aggregate
// query) and, beyond it, a rank's own spans, gathered until the scan moves on to another rank and then freed, so a
// run is never held whole (1.3 M spans: 40-80 MB before). A file whose ranks interleave in row order (rank files
// written into one as they flushed) is gathered whole. The second writes a summary of the spans the file holds now.
Result<LaneSummary> computeLaneSummary(const std::filesystem::path& path, int buckets = kLaneSummaryBuckets);
Status writeLaneSummary(const std::filesystem::path& path, const LaneSummary& summary);

// The file's lane summary when present, of this version and computed from the spans the file holds now; nullopt
// otherwise (the caller reads the spans). An error only for a damaged file.
Result<std::optional<LaneSummary>> readLaneSummary(Reader& reader);

}  // namespace tpscope::tracedb
