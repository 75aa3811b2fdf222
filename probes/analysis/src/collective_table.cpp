#include "collective_table.h"

#include <algorithm>
#include <deque>
#include <numeric>
#include <string_view>
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
  reader.preferMemoryMap();
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

// Appends the parts' rows in part order. A later part's strings are interned after the earlier parts' in their order
// of first appearance: the ids one scan of all rows in id order gives.
CollectiveTable join(std::vector<CollectiveTable>& parts) {
  CollectiveTable t = std::move(parts.front());
  Dictionary dict(t.text);
  size_t total = t.rows.size();
  for (size_t p = 1; p < parts.size(); ++p) total += parts[p].rows.size();
  t.rows.reserve(total);
  for (size_t p = 1; p < parts.size(); ++p) {
    std::vector<uint32_t> id(parts[p].text.size());
    for (size_t i = 0; i < id.size(); ++i) id[i] = dict.intern(parts[p].text[i]);
    for (CollectiveRecord c : parts[p].rows) {
      for (uint32_t* field : {&c.group, &c.op, &c.dtype, &c.shape, &c.callsite, &c.state}) *field = id[*field];
      t.rows.push_back(c);
    }
  }
  return t;
}

// Sorts the rows by (group name, seq, rank).
void sortRows(CollectiveTable& t) {
  // Order groups by name, not by first appearance.
  std::vector<uint32_t> order(t.text.size());
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return t.text[a] < t.text[b]; });
  std::vector<uint32_t> rankOf(t.text.size());
  for (uint32_t i = 0; i < order.size(); ++i) rankOf[order[i]] = i;
  auto less = [&](const CollectiveRecord& a, const CollectiveRecord& b) {
    if (a.group != b.group) return rankOf[a.group] < rankOf[b.group];
    if (a.seq != b.seq) return a.seq < b.seq;
    return a.rank < b.rank;
  };
  if (!std::is_sorted(t.rows.begin(), t.rows.end(), less)) std::sort(t.rows.begin(), t.rows.end(), less);
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
  CollectiveTable t = join(parts);
  sortRows(t);
  return t;
}

}  // namespace tpscope::analysis::detail
