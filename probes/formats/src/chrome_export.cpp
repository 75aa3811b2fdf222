#include "tpscope/formats/chrome_export.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <system_error>

#include <simdjson.h>

#include "json_text.h"
#include "tpscope/tracedb/reader.h"

namespace tpscope::formats {

using tracedb::Result;
using tracedb::Status;
namespace fs = std::filesystem;

namespace {

// Streams the trace into a file through a bounded buffer; remembers the first write error.
class EventSink {
 public:
  explicit EventSink(std::FILE* f) : file_(f) { buf_.reserve(kFlushAt + 4096); }
  std::string& begin() {  // a new event: separator handled here
    buf_ += first_ ? "\n" : ",\n";
    first_ = false;
    return buf_;
  }
  std::string& raw() { return buf_; }
  void maybeFlush() {
    if (buf_.size() >= kFlushAt) flush();
  }
  void flush() {
    if (!buf_.empty() && std::fwrite(buf_.data(), 1, buf_.size(), file_) != buf_.size() && !error_) error_ = errno;
    written_ += static_cast<int64_t>(buf_.size());
    buf_.clear();
  }
  int error() const { return error_; }
  int64_t written() const { return written_; }

 private:
  static constexpr size_t kFlushAt = 1 << 20;
  std::FILE* file_;
  std::string buf_;
  bool first_ = true;
  int error_ = 0;
  int64_t written_ = 0;
};

int pidOf(int rank) { return rank + 1; }

void metaEvent(EventSink& sink, std::string_view name, int pid, std::optional<int64_t> tid, std::string_view argKey,
               std::string_view stringValue, std::optional<int64_t> intValue) {
  std::string& o = sink.begin();
  o += "{\"ph\":\"M\",\"name\":\"";
  o += name;
  o += "\",\"pid\":";
  appendInt(o, pid);
  if (tid) {
    o += ",\"tid\":";
    appendInt(o, *tid);
  }
  o += ",\"args\":{\"";
  o += argKey;
  o += "\":";
  if (intValue) appendInt(o, *intValue);
  else appendJsonString(o, stringValue);
  o += "}}";
}

void counterEvent(EventSink& sink, int rank, std::string_view name, int64_t tsNs, double value) {
  std::string& o = sink.begin();
  o += "{\"ph\":\"C\",\"pid\":";
  appendInt(o, pidOf(rank));
  o += ",\"ts\":";
  appendMicros(o, tsNs);
  o += ",\"name\":";
  appendJsonString(o, name);
  o += ",\"args\":{\"value\":";
  appendDouble(o, value);
  o += "}}";
  sink.maybeFlush();
}

struct FileCloser {
  void operator()(std::FILE* f) const {
    if (f) std::fclose(f);
  }
};

struct TempFileGuard {
  fs::path path;
  bool keep = false;
  ~TempFileGuard() {
    std::error_code ec;
    if (!keep) fs::remove(path, ec);
  }
};

}  // namespace

std::string ChromeExportStats::summary() const {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "exported %d %s: %lld spans, %lld collectives (%lld linked across ranks), %lld counter samples, "
                "%lld alerts; %.1f MB in %.2f s",
                ranks, ranks == 1 ? "rank" : "ranks", static_cast<long long>(spans),
                static_cast<long long>(collectives), static_cast<long long>(flows), static_cast<long long>(counters),
                static_cast<long long>(alerts), bytesWritten / 1e6, seconds);
  return buf;
}

namespace {

// Every table of the run the export reads whole (spans are streamed).
struct RunTables {
  std::map<std::string, std::string> meta;
  std::vector<tracedb::RankInfo> ranks;
  std::vector<tracedb::ThreadInfo> threads;
  std::vector<tracedb::CollectiveRow> collectives;  // by (group, seq, rank)
  std::vector<tracedb::StepStatRow> stepStats;
  std::vector<tracedb::CounterRow> counters;
  std::vector<tracedb::AlertRow> alerts;
  tracedb::TimeRange range;
};

Result<RunTables> readRunTables(tracedb::Reader& reader) {
  RunTables t;
  auto take = [](auto result, auto& into) {
    if (!result) return result.status();
    into = std::move(*result);
    return Status::ok();
  };
  for (Status s : {take(reader.meta(), t.meta), take(reader.ranks(), t.ranks), take(reader.threads(), t.threads),
                   take(reader.collectives(), t.collectives), take(reader.stepStats(), t.stepStats),
                   take(reader.counters(), t.counters), take(reader.alerts(), t.alerts),
                   take(reader.timeRange(), t.range)})
    if (!s) return s;
  return t;
}

// Header. Only stable facts of the run go here (no time of export), so exports of one run are identical.
void writeHeader(EventSink& sink, const std::map<std::string, std::string>& meta) {
  std::string& o = sink.raw();
  o += "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"exporter\":\"tpscope export --format chrome\"";
  for (const char* key : {"run_id", "source", "epoch_unix_ns", "format"}) {
    auto it = meta.find(key);
    if (it == meta.end()) continue;
    o += ",";
    appendJsonString(o, key);
    o += ":";
    appendJsonString(o, it->second);
  }
  o += "},\"traceEvents\":[";
}

// The stage of every rank and the stages, from meta 'pipeline' ({} without one, or when it cannot be read).
std::pair<std::vector<int64_t>, int64_t> pipelineStages(const std::map<std::string, std::string>& meta) {
  auto it = meta.find(std::string(tracedb::meta_keys::kPipeline));
  if (it == meta.end()) return {};
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  int64_t stages = 0;
  simdjson::dom::array ranks;
  if (parser.parse(it->second).get(doc) || doc["stages"].get_int64().get(stages) ||
      doc["stage_of_rank"].get_array().get(ranks))
    return {};
  std::vector<int64_t> stageOf;
  for (simdjson::dom::element e : ranks) {
    int64_t stage = -1;
    if (e.get_int64().get(stage)) stage = -1;
    stageOf.push_back(stage);
  }
  return {stageOf, stages};
}

// Processes (one per rank) and their threads; returns the number of ranks. The process name carries the rank and
// its TP, DP and pipeline coordinates, which the Chrome import reads back (kineto/pipeline_names.h).
int writeProcesses(EventSink& sink, const RunTables& t) {
  std::set<int> rankSet;
  for (const auto& r : t.ranks) rankSet.insert(r.rank);
  for (const auto& th : t.threads) rankSet.insert(th.rank);
  for (const auto& c : t.collectives) rankSet.insert(c.rank);
  for (const auto& s : t.stepStats) rankSet.insert(s.rank);
  for (const auto& c : t.counters) rankSet.insert(c.rank);
  for (const auto& a : t.alerts) rankSet.insert(a.rank);
  std::map<int, const tracedb::RankInfo*> rankInfo;
  for (const auto& r : t.ranks) rankInfo[r.rank] = &r;
  const auto [stageOf, stages] = pipelineStages(t.meta);
  for (int rank : rankSet) {
    std::string label = "rank " + std::to_string(rank);
    if (auto it = rankInfo.find(rank); it != rankInfo.end()) {
      const auto& info = *it->second;
      if (!info.host.empty()) label += " (" + info.host + ")";
      if (info.tpSize > 1 || info.dpSize > 1)
        label += " tp " + std::to_string(info.tpRank) + "/" + std::to_string(info.tpSize) + " dp " +
                 std::to_string(info.dpRank) + "/" + std::to_string(info.dpSize);
    }
    if (rank >= 0 && static_cast<size_t>(rank) < stageOf.size() && stageOf[static_cast<size_t>(rank)] >= 0)
      label += " pp " + std::to_string(stageOf[static_cast<size_t>(rank)]) + "/" + std::to_string(stages);
    metaEvent(sink, "process_name", pidOf(rank), std::nullopt, "name", label, std::nullopt);
    metaEvent(sink, "process_sort_index", pidOf(rank), std::nullopt, "sort_index", {}, rank);
  }
  for (const auto& th : t.threads) {
    std::string name = th.name;
    if (name.empty())
      name = (th.kind == tracedb::thread_kinds::kCudaStream ? "stream " : "thread ") + std::to_string(th.thread);
    metaEvent(sink, "thread_name", pidOf(th.rank), th.thread, "name", name, std::nullopt);
    metaEvent(sink, "thread_sort_index", pidOf(th.rank), th.thread, "sort_index", {}, th.thread);
  }
  return static_cast<int>(rankSet.size());
}

// A complete ("X") event up to its name's value: {"ph":"X","pid":..,"tid":..,"ts":..,"dur":..,"name":
std::string& beginSlice(EventSink& sink, int rank, int64_t tid, int64_t tsNs, int64_t durNs) {
  std::string& o = sink.begin();
  o += "{\"ph\":\"X\",\"pid\":";
  appendInt(o, pidOf(rank));
  o += ",\"tid\":";
  appendInt(o, tid);
  o += ",\"ts\":";
  appendMicros(o, tsNs);
  o += ",\"dur\":";
  appendMicros(o, durNs);
  o += ",\"name\":";
  return o;
}

// "step":S,"layer":L,"phase":"P" — where in training a span or collective happened.
void appendPlace(std::string& o, int step, int layer, tracedb::Phase phase) {
  o += "\"step\":";
  appendInt(o, step);
  o += ",\"layer\":";
  appendInt(o, layer);
  o += ",\"phase\":\"";
  o += tracedb::phaseName(phase);
  o += "\"";
}

using StepEnds = std::map<std::pair<int, int>, int64_t>;  // (rank, step) -> end of its last span, ns

// Spans, streamed from the database; records where each step's last span ends.
Status writeSpans(EventSink& sink, tracedb::Reader& reader, ChromeExportStats& stats, StepEnds& stepEnd) {
  return reader.forEachSpan({}, [&](const tracedb::SpanRow& r) {
    std::string& o = beginSlice(sink, r.rank, r.thread, r.beginNs, r.durNs);
    appendJsonString(o, reader.string(r.name));
    o += ",\"cat\":\"";
    o += tracedb::spanKindName(r.kind);
    o += "\",\"args\":{";
    appendPlace(o, r.step, r.layer, r.phase);
    o += "}}";
    sink.maybeFlush();
    ++stats.spans;
    if (r.step >= 0) {
      int64_t& end = stepEnd[{r.rank, r.step}];
      end = std::max(end, r.endNs());
    }
    return sink.error() == 0;
  });
}

// A collective placed on the timeline: its slice and lane.
struct Placed {
  const tracedb::CollectiveRow* row;
  int64_t ts, dur;
  int tid;
};

// Collectives go on per-rank collectives lanes: a second lane only where a rank's collectives overlap, since
// slices on one lane must nest. Writes the lanes' names; returns the slices in the order of `collectives`.
std::vector<Placed> placeCollectives(EventSink& sink, const std::vector<tracedb::CollectiveRow>& collectives,
                                     int64_t runEndNs) {
  std::vector<Placed> placed;
  placed.reserve(collectives.size());
  for (const auto& c : collectives) {
    const int64_t ts = c.startNs.value_or(c.enqueueNs);
    const int64_t end = c.endNs ? *c.endNs : std::max(ts, runEndNs);  // unfinished: open to the end of the run
    placed.push_back(Placed{&c, ts, std::max<int64_t>(0, end - ts), kCollectivesTid});
  }
  std::vector<size_t> byRank(placed.size());
  for (size_t i = 0; i < placed.size(); ++i) byRank[i] = i;
  std::sort(byRank.begin(), byRank.end(), [&](size_t a, size_t b) {
    const auto& x = placed[a];
    const auto& y = placed[b];
    return std::tie(x.row->rank, x.ts, x.row->group, x.row->seq) < std::tie(y.row->rank, y.ts, y.row->group, y.row->seq);
  });
  std::map<int, std::vector<int64_t>> laneEnds;  // rank -> end of the last collective on each lane
  std::set<std::pair<int, int>> lanesUsed;
  for (size_t i : byRank) {
    Placed& p = placed[i];
    auto& ends = laneEnds[p.row->rank];
    size_t lane = 0;
    while (lane < ends.size() && ends[lane] > p.ts) ++lane;
    if (lane == ends.size()) ends.push_back(0);
    ends[lane] = p.ts + p.dur;
    p.tid = kCollectivesTid + static_cast<int>(lane) * 2;  // kCollectivesTid + 1 is the alerts lane
    lanesUsed.emplace(p.row->rank, p.tid);
  }
  for (const auto& [rank, tid] : lanesUsed) {
    const int lane = (tid - kCollectivesTid) / 2;
    metaEvent(sink, "thread_name", pidOf(rank), tid, "name",
              lane == 0 ? std::string("collectives") : "collectives " + std::to_string(lane + 1), std::nullopt);
    metaEvent(sink, "thread_sort_index", pidOf(rank), tid, "sort_index", {}, tid);
  }
  return placed;
}

void writeCollectiveSlice(EventSink& sink, const Placed& p) {
  const auto& c = *p.row;
  std::string& o = beginSlice(sink, c.rank, p.tid, p.ts, p.dur);
  appendJsonString(o, c.op);
  o += ",\"cat\":\"collective\",\"args\":{\"group\":";
  appendJsonString(o, c.group);
  o += ",\"seq\":";
  appendInt(o, c.seq);
  o += ",\"op\":";
  appendJsonString(o, c.op);
  o += ",\"dtype\":";
  appendJsonString(o, c.dtype);
  o += ",\"bytes\":";
  appendInt(o, c.bytes);
  o += ",\"shape\":[";
  for (size_t k = 0; k < c.shape.size(); ++k) {
    if (k) o += ",";
    appendInt(o, c.shape[k]);
  }
  o += "],\"state\":\"";
  o += tracedb::collectiveStateName(c.state);
  o += "\",\"enqueue_ns\":";
  appendInt(o, c.enqueueNs);
  o += ",";
  appendPlace(o, c.step, c.layer, c.phase);
  if (!c.callsite.empty()) {
    o += ",\"callsite\":";
    appendJsonString(o, c.callsite);
  }
  o += "}}";
  sink.maybeFlush();
}

// One flow per (group, seq) through the ranks in order of start. `placed` is ordered by (group, seq, rank), as
// collectives() returns them: each run of equal (group, seq) is one chain. Returns the number of flows.
int64_t writeCollectiveFlows(EventSink& sink, const std::vector<Placed>& placed) {
  int64_t flowId = 0;
  for (size_t begin = 0; begin < placed.size();) {
    size_t end = begin;
    while (end < placed.size() && placed[end].row->group == placed[begin].row->group &&
           placed[end].row->seq == placed[begin].row->seq)
      ++end;
    if (end - begin >= 2) {
      std::vector<const Placed*> chain;
      for (size_t k = begin; k < end; ++k) chain.push_back(&placed[k]);
      std::stable_sort(chain.begin(), chain.end(), [](const Placed* a, const Placed* b) {
        return std::tie(a->ts, a->row->rank) < std::tie(b->ts, b->row->rank);
      });
      ++flowId;
      const std::string name = placed[begin].row->group + "#" + std::to_string(placed[begin].row->seq);
      for (size_t k = 0; k < chain.size(); ++k) {
        const char ph = k == 0 ? 's' : k + 1 == chain.size() ? 'f' : 't';
        std::string& o = sink.begin();
        o += "{\"ph\":\"";
        o += ph;
        o += "\",\"id\":";
        appendInt(o, flowId);
        o += ",\"pid\":";
        appendInt(o, pidOf(chain[k]->row->rank));
        o += ",\"tid\":";
        appendInt(o, chain[k]->tid);
        o += ",\"ts\":";
        appendMicros(o, chain[k]->ts);
        o += ",\"name\":";
        appendJsonString(o, name);
        o += ",\"cat\":\"collective\"";
        if (ph != 's') o += ",\"bp\":\"e\"";
        o += "}";
      }
      sink.maybeFlush();
    }
    begin = end;
  }
  return flowId;
}

// Counters: loss, gradient norm, learning rate, loss scale per step; every row of the counters table.
void writeCounters(EventSink& sink, const RunTables& t, const StepEnds& stepEnd, ChromeExportStats& stats) {
  for (const auto& s : t.stepStats) {
    std::optional<int64_t> ts = s.endNs ? s.endNs : s.beginNs;
    if (!ts) {
      auto it = stepEnd.find({s.rank, s.step});
      if (it == stepEnd.end()) continue;  // a step with no time cannot be placed on a timeline
      ts = it->second;
    }
    for (auto [name, value] : {std::pair<std::string_view, std::optional<double>>{"loss", s.loss},
                               {"grad_norm", s.gradNorm},
                               {"lr", s.lr},
                               {"loss_scale", s.lossScale}}) {
      if (!value) continue;
      counterEvent(sink, s.rank, name, *ts, *value);
      ++stats.counters;
    }
  }
  for (const auto& c : t.counters) {
    counterEvent(sink, c.rank, c.name, c.tsNs, c.value);
    ++stats.counters;
  }
}

// Alerts: instant events on a per-rank "alerts" lane.
void writeAlerts(EventSink& sink, const std::vector<tracedb::AlertRow>& alerts, ChromeExportStats& stats) {
  std::set<int> alertRanks;
  for (const auto& a : alerts) {
    if (alertRanks.insert(a.rank).second) {
      metaEvent(sink, "thread_name", pidOf(a.rank), kAlertsTid, "name", "alerts", std::nullopt);
      metaEvent(sink, "thread_sort_index", pidOf(a.rank), kAlertsTid, "sort_index", {}, kAlertsTid);
    }
    std::string& o = sink.begin();
    o += "{\"ph\":\"i\",\"s\":\"t\",\"pid\":";
    appendInt(o, pidOf(a.rank));
    o += ",\"tid\":";
    appendInt(o, kAlertsTid);
    o += ",\"ts\":";
    appendMicros(o, a.tsNs);
    o += ",\"name\":";
    appendJsonString(o, a.kind);
    o += ",\"cat\":\"alert\",\"args\":{\"severity\":";
    appendJsonString(o, a.severity);
    o += ",\"kind\":";
    appendJsonString(o, a.kind);
    o += ",\"step\":";
    appendInt(o, a.step);
    o += ",\"layer\":";
    appendInt(o, a.layer);
    o += ",\"param\":";
    appendJsonString(o, a.param);
    o += ",\"message\":";
    appendJsonString(o, a.message);
    o += ",\"evidence\":";
    appendJsonString(o, a.evidence);
    o += "}}";
    ++stats.alerts;
  }
}

// Ends the trace and moves the temporary file over `output`.
Status finishFile(EventSink& sink, std::unique_ptr<std::FILE, FileCloser> file, TempFileGuard& temp,
                  const fs::path& output) {
  sink.raw() += "\n]}\n";
  sink.flush();
  if (sink.error()) return Status::error(output.string() + ": write error: " + std::strerror(sink.error()));
  if (std::fflush(file.get()) != 0 || std::fclose(file.release()) != 0)
    return Status::error(output.string() + ": write error: " + std::strerror(errno));
  std::error_code ec;
  fs::rename(temp.path, output, ec);
  if (ec) return Status::error(output.string() + ": cannot move the export into place: " + ec.message());
  temp.keep = true;
  return Status::ok();
}

}  // namespace

Result<ChromeExportStats> exportChrome(const fs::path& run, const fs::path& output) {
  const auto t0 = std::chrono::steady_clock::now();
  if (output.empty()) return Status::error("export: no output file");
  auto opened = tracedb::Reader::open(run);
  if (!opened) return opened.status();
  tracedb::Reader& reader = **opened;
  auto tables = readRunTables(reader);
  if (!tables) return tables.status();
  const RunTables& t = *tables;

  const fs::path dir = output.has_parent_path() ? output.parent_path() : fs::path(".");
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return Status::error(output.string() + ": folder " + dir.string() + " does not exist");
  TempFileGuard temp{dir / ("." + output.filename().string() + ".tmp-" + std::to_string(::getpid()))};
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(temp.path.c_str(), "wb"));
  if (!file) return Status::error(output.string() + ": cannot write: " + std::strerror(errno));

  ChromeExportStats stats;
  EventSink sink(file.get());
  writeHeader(sink, t.meta);
  stats.ranks = writeProcesses(sink, t);
  StepEnds stepEnd;
  if (Status s = writeSpans(sink, reader, stats, stepEnd); !s) return s;
  const std::vector<Placed> placed = placeCollectives(sink, t.collectives, t.range.endNs);
  for (const Placed& p : placed) {
    writeCollectiveSlice(sink, p);
    ++stats.collectives;
  }
  stats.flows = writeCollectiveFlows(sink, placed);
  writeCounters(sink, t, stepEnd, stats);
  writeAlerts(sink, t.alerts, stats);
  if (Status s = finishFile(sink, std::move(file), temp, output); !s) return s;

  stats.bytesWritten = sink.written();
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return stats;
}

}  // namespace tpscope::formats
