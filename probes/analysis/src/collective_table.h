// Internal: every collective record of a run, loaded once with a table scan (no ORDER BY, so the cost is the same
// with or without indexes; a large table by several threads, workers.h) into compact rows sorted by (group, seq,
// rank). Text columns are interned into small
// per-table dictionaries, so comparing ops/dtypes/shapes across ranks is an integer comparison.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/status.h"

namespace tpscope::analysis::detail {

struct CollectiveRecord {
  uint32_t group;     // index into CollectiveTable::text
  int32_t rank;
  int64_t seq;
  uint32_t op, dtype, shape, callsite, state;  // indexes into CollectiveTable::text
  int64_t numel, bytes;
  int32_t step, layer;
  int64_t enqueueNs;
  int64_t startNs, endNs;  // kNone when NULL
  static constexpr int64_t kNone = INT64_MIN;
  bool hasStart() const { return startNs != kNone; }
  bool hasEnd() const { return endNs != kNone; }
  // The latest time the record tells: coalesce(end_ns, start_ns, enqueue_ns).
  int64_t lastNs() const { return hasEnd() ? endNs : hasStart() ? startNs : enqueueNs; }
};

struct CollectiveTable {
  std::vector<std::string> text;         // interned strings; text[0] = ""
  std::vector<CollectiveRecord> rows;    // sorted by (group text, seq, rank)
  const std::string& str(uint32_t id) const { return text[id]; }
  // [begin, end) ranges of rows with the same (group, seq), in order.
  template <class Fn>
  void forEachCollective(Fn&& fn) const {
    size_t i = 0;
    while (i < rows.size()) {
      size_t j = i + 1;
      while (j < rows.size() && rows[j].group == rows[i].group && rows[j].seq == rows[i].seq) ++j;
      fn(i, j);
      i = j;
    }
  }
  bool completed(const CollectiveRecord& r) const;  // state completed, or an end time without timed_out/failed
  bool started(const CollectiveRecord& r) const;
};

tracedb::Result<CollectiveTable> loadCollectives(tracedb::Reader& reader);

}  // namespace tpscope::analysis::detail
