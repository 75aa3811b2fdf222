#include "chrome_places.h"

#include <algorithm>
#include <set>

#include "kineto_names.h"
#include "pipeline_names.h"

namespace tpscope::formats::kineto {

namespace {

bool isRecord(const SpanArgs& a, const RawSpan& s, const KinetoFile& file) {
  return a.cat == "collective" && !a.group.empty() && !a.op.empty() && s.meta >= 0 && file.metas[s.meta].seq >= 0;
}

tracedb::CollectiveRow recordOf(const RawSpan& s, const SpanArgs& a, const KinetoFile& file, int rank, int thread) {
  const int64_t base = file.baseTimeNs.value_or(0);
  const CollectiveMeta& meta = file.metas[s.meta];
  tracedb::CollectiveRow c;
  c.rank = rank;
  c.group = std::string(a.group);
  c.seq = meta.seq;
  c.op = std::string(a.op);
  c.dtype = normalizeDtype(meta.dtype);
  if (c.dtype.empty()) c.dtype = std::string(meta.dtype);
  c.shape = std::vector<int64_t>();
  for (int v : parseRankList(a.shape)) c.shape.push_back(v);  // "[4,32,32]": a list of integers like a rank list
  c.numel = c.shape.empty() ? 0 : 1;
  for (int64_t d : c.shape) c.numel *= d;
  c.bytes = std::max<int64_t>(0, a.bytes);
  c.callsite = std::string(a.callsite);
  c.step = static_cast<int>(a.step);
  c.layer = static_cast<int>(a.layer);
  c.phase = phaseFromName(a.phase).value_or(tracedb::Phase::None);
  c.thread = thread;
  c.state = tracedb::parseCollectiveState(a.state).value_or(tracedb::CollectiveState::Completed);
  const int64_t begin = s.tsNs + base;
  c.enqueueNs = a.enqueueNs ? *a.enqueueNs + base : begin;
  // The export draws a record that never started from its enqueue and an unfinished one to the end of the run.
  if (c.state != tracedb::CollectiveState::Scheduled) c.startNs = begin;
  if (c.state == tracedb::CollectiveState::Completed || c.state == tracedb::CollectiveState::Failed)
    c.endNs = begin + s.durNs;
  return c;
}

}  // namespace

std::vector<char> applyPlaceArgs(const KinetoFile& file, RankModel& m) {
  std::vector<char> records;
  if (file.spanArgs.empty()) return records;
  records.assign(file.spans.size(), 0);
  for (size_t i = 0; i < file.spans.size(); ++i) {
    const RawSpan& s = file.spans[i];
    if (s.args < 0) continue;
    const SpanArgs& a = file.spanArgs[static_cast<size_t>(s.args)];
    tracedb::SpanRow& row = m.spans[i];
    if (isRecord(a, s, file)) {
      records[i] = 1;
      m.collectives.push_back(recordOf(s, a, file, m.rank, 0));
      m.minNs = std::min(m.minNs, m.collectives.back().enqueueNs);
      continue;
    }
    if (row.kind == tracedb::SpanKind::Other)
      if (auto kind = spanKindFromName(a.cat)) row.kind = *kind;
    if (a.step >= 0) row.step = static_cast<int>(a.step);
    if (a.layer >= 0) row.layer = static_cast<int>(a.layer);
    if (auto phase = phaseFromName(a.phase)) row.phase = *phase;
  }
  return records;
}

void dropSpans(RankModel& m, const std::vector<char>& drop) {
  if (std::find(drop.begin(), drop.end(), 1) == drop.end()) return;
  size_t kept = 0;
  for (size_t i = 0; i < m.spans.size(); ++i)
    if (!drop[i]) m.spans[kept++] = m.spans[i];
  m.spans.resize(kept);
  std::set<int> used;
  for (const tracedb::SpanRow& s : m.spans) used.insert(s.thread);
  std::erase_if(m.threads, [&](const tracedb::ThreadInfo& t) { return !used.count(t.thread); });
}

}  // namespace tpscope::formats::kineto
