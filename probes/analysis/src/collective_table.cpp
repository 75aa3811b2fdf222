#include "collective_table.h"

#include <algorithm>
#include <deque>
#include <numeric>
#include <string_view>
#include <unordered_map>

#include "tpscope/tracedb/query.h"

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

tracedb::Result<CollectiveTable> loadCollectives(tracedb::Reader& reader) {
  CollectiveTable t;
  t.text.emplace_back();
  // Keys view the strings owned by `owned` (a deque: stable addresses), so lookups allocate nothing.
  std::deque<std::string> owned;
  std::unordered_map<std::string_view, uint32_t> ids{{std::string_view(), 0}};
  auto intern = [&](std::string_view v) -> uint32_t {
    if (v.empty()) return 0;
    auto it = ids.find(v);
    if (it != ids.end()) return it->second;
    const auto id = static_cast<uint32_t>(t.text.size());
    t.text.emplace_back(v);
    ids.emplace(owned.emplace_back(v), id);
    return id;
  };
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
    return l.id = intern(v);
  };
  reader.preferMemoryMap();
  Query q(reader,
          "SELECT group_name, rank, seq, op, dtype, shape, callsite, state, numel, bytes, step, layer, enqueue_ns,"
          " start_ns, end_ns FROM collectives",
          "table 'collectives'");
  auto s = q.each([&](Query& r) {
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
    t.rows.push_back(c);
  });
  if (!s) return s;
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
  return t;
}

}  // namespace tpscope::analysis::detail
