#include "collective_table.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <deque>
#include <numeric>
#include <string_view>
#include <tuple>
#include <unordered_map>

#include "tpscope/tracedb/query.h"
#include "workers.h"

namespace tpscope::analysis::detail {

using tracedb::Query;

bool CollectiveTable::completed(const CollectiveRecord& r) const {
  const std::string& s = text[r.state];
  return s == "completed" || (r.hasEnd() && s != "timed_out" && s != "failed");
}

bool CollectiveTable::started(const CollectiveRecord& r) const {
  const std::string& s = text[r.state];
  return r.hasStart() || s == "started" || s == "completed";
}

namespace {

// Interns a table's text: each new string gets the next id, so ids follow the order of first appearance.
class Dictionary {
 public:
  // Takes over `text` (text[0] = "", added when empty) and its ids.
  explicit Dictionary(std::vector<std::string>& text) : text_(text) {
    if (text_.empty()) text_.emplace_back();
    for (size_t i = 1; i < text_.size(); ++i) ids_.emplace(owned_.emplace_back(text_[i]), static_cast<uint32_t>(i));
  }

  uint32_t intern(std::string_view v) {
    if (v.empty()) return 0;
    auto it = ids_.find(v);
    if (it != ids_.end()) return it->second;
    const auto id = static_cast<uint32_t>(text_.size());
    text_.emplace_back(v);
    ids_.emplace(owned_.emplace_back(v), id);
    return id;
  }

 private:
  std::vector<std::string>& text_;
  // Keys view the strings owned by `owned_` (a deque: stable addresses), so lookups allocate nothing.
  std::deque<std::string> owned_;
  std::unordered_map<std::string_view, uint32_t> ids_{{std::string_view(), 0}};
};

// The rows with ids in [from, to], in id order, their text interned into `part.text`.
tracedb::Status scanRows(tracedb::Reader& reader, int64_t from, int64_t to, CollectiveTable& part) {
  Dictionary dict(part.text);
  // Consecutive rows mostly repeat a column's value (the members of one collective, one op, one state): compare
  // with the previous row's text before hashing.
  struct Last {
    std::string text;
    uint32_t id = 0;
  };
  Last last[6];
  auto column = [&](int slot, std::string_view v) -> uint32_t {
    Last& l = last[slot];
    if (v == l.text) return l.id;
    l.text.assign(v);
    return l.id = dict.intern(v);
  };
  Query q(reader,
          "SELECT group_name, rank, seq, op, dtype, shape, callsite, state, numel, bytes, step, layer, enqueue_ns,"
          " start_ns, end_ns FROM collectives WHERE id BETWEEN ? AND ?",
          "table 'collectives'");
  q.bind(1, from).bind(2, to);
  part.rows.reserve(static_cast<size_t>(std::max<int64_t>(0, to - from + 1)));
  return q.each([&](Query& r) {
    CollectiveRecord c;
    c.group = column(0, r.view(0));
    c.rank = r.i32(1);
    c.seq = r.i64(2);
    c.op = column(1, r.view(3));
    c.dtype = column(2, r.view(4));
    c.shape = column(3, r.view(5));
    c.callsite = column(4, r.view(6));
    c.state = column(5, r.view(7));
    c.numel = r.i64(8);
    c.bytes = r.i64(9);
    c.step = r.i32(10);
    c.layer = r.i32(11);
    c.enqueueNs = r.i64(12);
    c.startNs = r.isNull(13) ? CollectiveRecord::kNone : r.i64(13);
    c.endNs = r.isNull(14) ? CollectiveRecord::kNone : r.i64(14);
    part.rows.push_back(c);
  });
}

// Bits needed for the values 0..span.
int bitsFor(uint64_t span) { return span == 0 ? 0 : 64 - std::countl_zero(span); }

// The parts' rows as one sequence, in part order (row ids ascending), read with the joined table's text ids.
class JoinedRows {
 public:
  // Interns the parts' text into `text` (the first part's, taken over): a later part's strings after the earlier
  // parts', in their order of first appearance, which are the ids one scan of all rows in id order gives.
  JoinedRows(std::vector<CollectiveTable>& parts, std::vector<std::string>& text) : parts_(parts) {
    text = std::move(parts_.front().text);
    ids_.resize(parts_.size());
    ids_[0].resize(text.size());
    std::iota(ids_[0].begin(), ids_[0].end(), 0u);
    Dictionary dict(text);
    for (size_t p = 1; p < parts_.size(); ++p)
      for (const std::string& v : parts_[p].text) ids_[p].push_back(dict.intern(v));
    offsets_.push_back(0);
    for (const CollectiveTable& part : parts_) offsets_.push_back(offsets_.back() + part.rows.size());
  }

  size_t size() const { return offsets_.back(); }

  // Calls fn(group, seq, rank) for each row in sequence order (the sort's key; the group as the table's text id).
  template <class Fn>
  void forEachKey(Fn&& fn) const {
    for (size_t p = 0; p < parts_.size(); ++p)
      for (const CollectiveRecord& c : parts_[p].rows) fn(ids_[p][c.group], c.seq, c.rank);
  }

  // Row `i` of the sequence, all its text ids the table's.
  CollectiveRecord at(size_t i) const {
    const size_t p = static_cast<size_t>(std::upper_bound(offsets_.begin(), offsets_.end(), i) - offsets_.begin()) - 1;
    CollectiveRecord c = parts_[p].rows[i - offsets_[p]];
    for (uint32_t* field : {&c.group, &c.op, &c.dtype, &c.shape, &c.callsite, &c.state}) *field = ids_[p][*field];
    return c;
  }

 private:
  std::vector<CollectiveTable>& parts_;
  std::vector<std::vector<uint32_t>> ids_;  // part → its text id → the joined table's
  std::vector<size_t> offsets_;             // part → index of its first row in the sequence; then the size
};

// The indexes of `rows` in (group name, seq, rank) order. Where the three and the index fit in 64 bits (offset from
// their minimums: the usual case) one integer per row is sorted, several times faster than moving 100-byte rows
// through a three-part comparison; else the indexes are sorted by that comparison, the index breaking ties alike.
std::vector<uint64_t> sortedOrder(const JoinedRows& rows, const std::vector<std::string>& text) {
  std::vector<uint32_t> byName(text.size());  // text id → rank of its string: groups ordered by name
  std::iota(byName.begin(), byName.end(), 0u);
  std::sort(byName.begin(), byName.end(), [&](uint32_t a, uint32_t b) { return text[a] < text[b]; });
  std::vector<uint32_t> nameRank(text.size());
  for (uint32_t i = 0; i < byName.size(); ++i) nameRank[byName[i]] = i;
  int64_t seqMin = INT64_MAX, seqMax = INT64_MIN;
  int32_t rankMin = INT32_MAX, rankMax = INT32_MIN;
  rows.forEachKey([&](uint32_t, int64_t seq, int32_t rank) {
    seqMin = std::min(seqMin, seq);
    seqMax = std::max(seqMax, seq);
    rankMin = std::min(rankMin, rank);
    rankMax = std::max(rankMax, rank);
  });
  const int seqBits = bitsFor(static_cast<uint64_t>(seqMax) - static_cast<uint64_t>(seqMin));
  const int rankBits = bitsFor(static_cast<uint64_t>(int64_t{rankMax} - rankMin));
  const int indexBits = bitsFor(rows.size());
  std::vector<uint64_t> order;
  order.reserve(rows.size());
  if (bitsFor(text.size()) + seqBits + rankBits + indexBits <= 64) {
    rows.forEachKey([&](uint32_t group, int64_t seq, int32_t rank) {
      const uint64_t s = static_cast<uint64_t>(seq) - static_cast<uint64_t>(seqMin);
      const uint64_t r = static_cast<uint64_t>(int64_t{rank} - rankMin);
      const uint64_t key = (uint64_t{nameRank[group]} << (seqBits + rankBits)) | (s << rankBits) | r;
      order.push_back((key << indexBits) | order.size());
    });
    if (!std::is_sorted(order.begin(), order.end())) std::sort(order.begin(), order.end());
    const uint64_t mask = indexBits == 0 ? 0 : ~uint64_t{0} >> (64 - indexBits);
    for (uint64_t& o : order) o &= mask;
    return order;
  }
  std::vector<std::tuple<uint32_t, int64_t, int32_t, uint64_t>> keys;
  keys.reserve(rows.size());
  rows.forEachKey([&](uint32_t group, int64_t seq, int32_t rank) {
    keys.emplace_back(nameRank[group], seq, rank, keys.size());
  });
  std::sort(keys.begin(), keys.end());
  for (const auto& k : keys) order.push_back(std::get<3>(k));
  return order;
}

// The parts' rows as one table sorted by (group name, seq, rank).
CollectiveTable joinSorted(std::vector<CollectiveTable>& parts) {
  CollectiveTable t;
  const JoinedRows rows(parts, t.text);
  const std::vector<uint64_t> order = sortedOrder(rows, t.text);
  t.rows.reserve(order.size());
  for (uint64_t i : order) t.rows.push_back(rows.at(static_cast<size_t>(i)));
  return t;
}

}  // namespace

tracedb::Result<CollectiveTable> loadCollectives(tracedb::Reader& reader) {
  auto ids = reader.collectiveIdRange();
  if (!ids) return ids.status();
  // Large tables are read by several threads, each a range of row ids (workers.h).
  const unsigned workers = workerCount(ids->last - ids->first + 1);
  std::vector<CollectiveTable> parts(workers);
  auto s = scanIdRanges(reader, ids->first, ids->last, workers,
                        [&](tracedb::Reader& own, int64_t from, int64_t to, unsigned w) {
                          return scanRows(own, from, to, parts[w]);
                        });
  if (!s) return s;
  return joinSorted(parts);
}

}  // namespace tpscope::analysis::detail
