#include "tpscope/analysis/kernels.h"

#include <algorithm>
#include <string_view>

#include "tpscope/tracedb/query.h"
#include "tpscope/tracedb/records.h"

namespace tpscope::analysis {

tracedb::Result<KernelSummary> summarizeKernels(tracedb::Reader& reader, int limit) {
  KernelSummary out;
  const std::string sql =
      "SELECT n.value, count(*), sum(s.dur_ns) FROM spans s "
      "JOIN threads t ON t.rank = s.rank AND t.thread = s.thread "
      "JOIN strings n ON n.id = s.name "
      "WHERE t.kind = ? AND s.kind IN (" +
      std::to_string(static_cast<int>(tracedb::SpanKind::Kernel)) + ", " +
      std::to_string(static_cast<int>(tracedb::SpanKind::NcclKernel)) + ") GROUP BY s.name";
  tracedb::Query q(reader, sql, "the kernels on device lanes");
  q.bind(1, tracedb::thread_kinds::kCudaStream);
  std::vector<KernelStat> all;
  if (auto s = q.each([&](tracedb::Query& row) {
        all.push_back(KernelStat{row.text(0), row.i64(1), row.i64(2)});
        out.count += row.i64(1);
        out.totalNs += row.i64(2);
      });
      !s)
    return s;
  out.present = out.count > 0;
  std::sort(all.begin(), all.end(), [](const KernelStat& a, const KernelStat& b) {
    return a.totalNs != b.totalNs ? a.totalNs > b.totalNs : a.name < b.name;
  });
  if (static_cast<int>(all.size()) > limit) all.resize(static_cast<size_t>(std::max(0, limit)));
  out.top = std::move(all);
  return out;
}

}  // namespace tpscope::analysis
