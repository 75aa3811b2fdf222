#include "capture/run_poller.h"

#include <sqlite3.h>

#include <algorithm>
#include <limits>
#include <system_error>
#include <tuple>

#include "tpscope/tracedb/reader.h"

namespace tpscope::cli::capture {

namespace {

// A prepared statement that finalizes itself.
class Query {
 public:
  Query(sqlite3* db, const char* sql) { ok_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr) == SQLITE_OK; }
  ~Query() { sqlite3_finalize(stmt_); }
  Query(const Query&) = delete;
  Query& operator=(const Query&) = delete;
  bool ok() const { return ok_; }
  void bind(int i, int64_t v) { sqlite3_bind_int64(stmt_, i, v); }
  bool step() { return ok_ && sqlite3_step(stmt_) == SQLITE_ROW; }
  int64_t i64(int c) const { return sqlite3_column_int64(stmt_, c); }
  double real(int c) const { return sqlite3_column_double(stmt_, c); }
  bool isNull(int c) const { return sqlite3_column_type(stmt_, c) == SQLITE_NULL; }
  std::string text(int c) const {
    const auto* t = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, c));
    return t != nullptr ? std::string(t) : std::string();
  }

 private:
  sqlite3_stmt* stmt_ = nullptr;
  bool ok_ = false;
};

}  // namespace

RunPoller::RunPoller(std::filesystem::path dir, int ranks)
    : dir_(std::move(dir)), progress_(static_cast<size_t>(ranks)), readers_(static_cast<size_t>(ranks)) {}

RunPoller::~RunPoller() = default;

void RunPoller::close() {
  for (auto& r : readers_) r.reset();
}

int RunPoller::completedStep() const {
  int step = -1;
  for (const auto& p : progress_) step = step < 0 ? p.lastStep : std::min(step, p.lastStep);
  return std::max(step, 0);
}

bool RunPoller::poll(std::vector<LiveAlert>* alerts) {
  bool progressed = false;
  const size_t before = alerts != nullptr ? alerts->size() : 0;
  for (int r = 0; r < ranks(); ++r) progressed |= pollRank(r, alerts);
  // One poll can bring several ranks' alerts: print them in step order (then rank), as they happened.
  if (alerts != nullptr)
    std::stable_sort(alerts->begin() + static_cast<std::ptrdiff_t>(before), alerts->end(),
                     [](const LiveAlert& a, const LiveAlert& b) { return std::tie(a.step, a.rank) < std::tie(b.step, b.rank); });
  return progressed;
}

bool RunPoller::pollRank(int r, std::vector<LiveAlert>* alerts) {
  auto& reader = readers_[static_cast<size_t>(r)];
  RankProgress& p = progress_[static_cast<size_t>(r)];
  if (!reader) {
    const auto file = dir_ / ("rank-" + std::to_string(r) + ".db");
    std::error_code ec;
    if (!std::filesystem::exists(file, ec)) return false;
    auto opened = tracedb::Reader::open(file);
    if (!opened) return false;  // still being created: retry at the next poll
    reader = std::move(opened.value());
    sqlite3_busy_timeout(reader->handle(), 50);
  }
  sqlite3* db = reader->handle();
  bool progressed = false;
  if (!p.seen || p.host.empty()) {
    Query q(db, "SELECT host FROM ranks LIMIT 1");
    if (q.step()) p.host = q.text(0);
  }
  p.seen = true;
  {
    Query q(db, "SELECT (SELECT coalesce(max(id), 0) FROM spans), (SELECT coalesce(max(id), 0) FROM collectives)");
    if (q.step()) {
      const int64_t spans = q.i64(0), collectives = q.i64(1);
      progressed |= spans > p.maxSpanId || collectives > p.maxCollectiveId;
      p.maxSpanId = std::max(p.maxSpanId, spans);
      p.maxCollectiveId = std::max(p.maxCollectiveId, collectives);
    }
  }
  {
    Query q(db, "SELECT step, loss, tokens, begin_ns, end_ns FROM step_stats ORDER BY step DESC LIMIT 9");
    int n = 0;
    int64_t newestEnd = 0, oldestEnd = 0;
    int newestStep = 0, oldestStep = 0;
    while (q.step()) {
      const int step = static_cast<int>(q.i64(0));
      if (n == 0) {
        progressed |= step > p.lastStep;
        p.lastStep = std::max(p.lastStep, step);
        // SQLite stores a NaN as NULL: a step with stats but no loss had a non-finite one.
        p.lastLoss = q.isNull(1) ? std::numeric_limits<double>::quiet_NaN() : q.real(1);
        p.tokens = q.isNull(2) ? 0 : q.i64(2);
        newestEnd = q.i64(4);
        newestStep = step;
        p.lastStepEndNs = newestEnd;
        if (!q.isNull(3) && !q.isNull(4)) p.meanStepNs = static_cast<double>(q.i64(4) - q.i64(3));
      }
      oldestEnd = q.i64(4);
      oldestStep = step;
      ++n;
    }
    // Mean step period from the ends of up to 9 consecutive steps (includes everything between steps).
    if (n >= 2 && newestStep > oldestStep && newestEnd > oldestEnd)
      p.meanStepNs = static_cast<double>(newestEnd - oldestEnd) / (newestStep - oldestStep);
  }
  if (alerts != nullptr) {
    Query q(db,
            "SELECT id, step, layer, severity, kind, param, message, evidence FROM alerts WHERE id > ?1 ORDER BY id");
    q.bind(1, p.lastAlertId);
    while (q.step()) {
      p.lastAlertId = std::max(p.lastAlertId, q.i64(0));
      LiveAlert a;
      a.rank = r;
      a.host = p.host;
      a.step = static_cast<int>(q.i64(1));
      a.layer = static_cast<int>(q.i64(2));
      a.severity = q.text(3);
      a.kind = q.text(4);
      a.param = q.text(5);
      a.message = q.text(6);
      a.evidence = q.text(7);
      alerts->push_back(std::move(a));
    }
  }
  return progressed;
}

}  // namespace tpscope::cli::capture
