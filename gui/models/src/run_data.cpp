#include "tpscope/gui/run_data.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>

#include "tpscope/tracedb/lane_summary.h"
#include "tpscope/tracedb/query.h"
#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/run_files.h"

namespace tpscope::gui {

namespace fs = std::filesystem;
using tracedb::Reader;
using tracedb::Result;
using tracedb::Status;

std::vector<int> RunData::rankIds() const {
  std::set<int> ids;
  for (const auto& r : ranks) ids.insert(r.rank);
  for (const auto& c : collectives) ids.insert(c.rank);
  if (timeline)
    for (const auto& l : timeline->lanes()) ids.insert(l.rank);
  return {ids.begin(), ids.end()};
}

bool RunData::stepWindow(int rank, int step, int64_t& b, int64_t& e) const {
  for (const auto& s : stepStats)
    if (s.rank == rank && s.step == step && s.beginNs && s.endNs) {
      b = *s.beginNs;
      e = *s.endNs;
      return true;
    }
  if (!timeline) return false;
  bool found = false;
  for (const Lane& lane : timeline->lanes()) {
    if (lane.rank != rank) continue;
    for (const LaneRow& r : lane.rows)
      for (size_t i = 0; i < r.size(); ++i)
        if (r.step[i] == step) {
          b = found ? std::min(b, r.begin[i]) : r.begin[i];
          e = found ? std::max(e, r.end[i]) : r.end[i];
          found = true;
        }
  }
  return found;
}

namespace {

// The cache key of a single run file: its size and modification time; "" if it must not be cached.
std::string cacheKey(const fs::path& file) {
  std::error_code ec;
  const auto size = fs::file_size(file, ec);
  if (ec) return {};
  const auto mtime = fs::last_write_time(file, ec);
  if (ec) return {};
  const fs::path wal = file.string() + "-wal";
  if (fs::exists(wal, ec) && fs::file_size(wal, ec) > 0) return {};
  return "v1;size=" + std::to_string(size) +
         ";mtime=" + std::to_string(mtime.time_since_epoch().count());
}

std::vector<fs::path> cachePaths(const fs::path& file) {
  std::vector<fs::path> paths{file.string() + ".tpscope-gui-cache"};
  fs::path home;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) home = fs::path(xdg) / "tpscope-gui";
  else if (const char* h = std::getenv("HOME"); h && *h) home = fs::path(h) / ".cache" / "tpscope-gui";
  if (!home.empty()) {
    std::error_code ec;
    const std::string absolute = fs::absolute(file, ec).string();
    paths.push_back(home / (std::to_string(std::hash<std::string>{}(absolute)) + ".cache"));
  }
  return paths;
}

// Reads the spans of `path` with ids in [lo, hi) into `out`, shifting times and remapping names.
Status readSpanChunk(const fs::path& path, int64_t lo, int64_t hi, const tracedb::FileClock& clock,
                     const std::vector<uint32_t>& nameMap, std::vector<InputSpan>& out) {
  auto reader = Reader::open(path);
  if (!reader) return reader.status();
  (*reader)->preferMemoryMap();
  out.reserve(static_cast<size_t>(hi - lo));
  int lastRank = INT32_MIN;
  int64_t sh = 0;
  return (*reader)->forEachSpanInIdRange(lo, hi, [&](const tracedb::SpanRow& row) {
    InputSpan s;
    s.rank = row.rank;
    s.thread = row.thread;
    s.kind = static_cast<uint8_t>(std::clamp(static_cast<int>(row.kind), 0, kKindCount - 1));
    s.name = row.name < nameMap.size() ? nameMap[row.name] : 0;
    if (s.rank != lastRank) {  // spans come in runs of one rank: one map lookup per run
      lastRank = s.rank;
      sh = clock.shiftNs(s.rank);
    }
    s.beginNs = row.beginNs + sh;
    s.endNs = s.beginNs + std::max<int64_t>(0, row.durNs);
    s.step = row.step;
    s.layer = static_cast<int16_t>(row.layer);
    s.phase = static_cast<uint8_t>(row.phase);
    out.push_back(s);
    return true;
  });
}

// Appends the ranks, threads, groups, collectives, gradient and step stats and alerts of one file to `run`, times
// moved onto the run's time base.
Status readSmallTables(tracedb::RunFile& file, RunData& run) {
  Reader& r = *file.reader;
  const tracedb::FileClock& clock = file.clock;
  auto shift = [](std::optional<int64_t>& t, int64_t sh) {
    if (t) *t += sh;
  };
  for (tracedb::RankInfo rk : file.ranks) {
    shift(rk.startNs, clock.shiftNs(rk.rank));
    shift(rk.endNs, clock.shiftNs(rk.rank));
    run.ranks.push_back(std::move(rk));
  }
  auto threads = r.threads();
  if (!threads) return threads.status();
  run.threads.insert(run.threads.end(), threads->begin(), threads->end());
  auto groups = r.groups();
  if (!groups) return groups.status();
  for (auto& g : *groups)
    if (std::none_of(run.groups.begin(), run.groups.end(), [&](const auto& x) { return x.name == g.name; }))
      run.groups.push_back(std::move(g));
  auto collectives = r.collectives();
  if (!collectives) return collectives.status();
  for (auto& c : *collectives) {
    const int64_t sh = clock.shiftNs(c.rank);
    c.enqueueNs += sh;
    shift(c.startNs, sh);
    shift(c.endNs, sh);
    run.collectives.push_back(std::move(c));
  }
  auto grads = r.gradStats();
  if (!grads) return grads.status();
  run.gradStats.insert(run.gradStats.end(), grads->begin(), grads->end());
  auto steps = r.stepStats();
  if (!steps) return steps.status();
  for (auto& st : *steps) {
    shift(st.beginNs, clock.shiftNs(st.rank));
    shift(st.endNs, clock.shiftNs(st.rank));
    run.stepStats.push_back(std::move(st));
  }
  auto alerts = r.alerts();
  if (!alerts) return alerts.status();
  for (auto& a : *alerts) {
    a.tsNs += clock.shiftNs(a.rank);
    run.alerts.push_back(std::move(a));
  }
  return Status::ok();
}

// Sets the run's extent and sort orders once its timeline is there.
Result<std::shared_ptr<const RunData>> finish(std::shared_ptr<RunData> run, std::shared_ptr<TimelineData> timeline) {
  run->beginNs = timeline->beginNs();
  run->endNs = timeline->endNs();
  bool any = timeline->spanCount() > 0;
  for (const auto& c : run->collectives) {
    const int64_t e = c.endNs.value_or(c.startNs.value_or(c.enqueueNs));
    run->beginNs = any ? std::min(run->beginNs, c.enqueueNs) : c.enqueueNs;
    run->endNs = any ? std::max(run->endNs, e) : e;
    any = true;
  }
  run->timeline = std::move(timeline);
  std::sort(run->collectives.begin(), run->collectives.end(), [](const auto& a, const auto& b) {
    return std::tie(a.group, a.seq, a.rank) < std::tie(b.group, b.seq, b.rank);
  });
  std::stable_sort(run->alerts.begin(), run->alerts.end(), [](const auto& a, const auto& b) { return a.tsNs < b.tsNs; });
  std::stable_sort(run->stepStats.begin(), run->stepStats.end(),
                   [](const auto& a, const auto& b) { return std::tie(a.step, a.rank) < std::tie(b.step, b.rank); });
  std::stable_sort(run->gradStats.begin(), run->gradStats.end(), [](const auto& a, const auto& b) {
    return std::tie(a.step, a.rank, a.layer) < std::tie(b.step, b.rank, b.layer);
  });
  return std::shared_ptr<const RunData>(std::move(run));
}

// The span names of every file re-interned into one table: per file, file string id → global id.
struct SpanNames {
  std::vector<std::vector<uint32_t>> maps;
  std::vector<std::string> strings{""};
  std::unordered_map<std::string, uint32_t> ids{{"", 0}};
};

// Pass 1: the first file's meta, every file's small tables (unless `tables` has them already), and the span names.
Status readTables(tracedb::RunFiles& opened, RunData& run, SpanNames& names, const RunData* tables = nullptr) {
  names.maps.resize(opened.files.size());
  if (tables) {
    run.meta = tables->meta;
    run.ranks = tables->ranks;
    run.threads = tables->threads;
    run.groups = tables->groups;
    run.collectives = tables->collectives;
    run.gradStats = tables->gradStats;
    run.stepStats = tables->stepStats;
    run.alerts = tables->alerts;
  }
  for (size_t f = 0; f < opened.files.size(); ++f) {
    tracedb::RunFile& o = opened.files[f];
    if (f == 0 && !tables) {
      auto meta = o.reader->meta();
      if (!meta) return meta.status();
      run.meta = std::move(*meta);
    }
    if (!tables)
      if (Status s = readSmallTables(o, run); !s) return s;
    std::vector<uint32_t>& nameMap = names.maps[f];
    Status s = o.reader->forEachString([&](uint32_t id, std::string_view text) {
      if (id > (1u << 30)) return;
      if (nameMap.size() <= id) nameMap.resize(id + 1, 0);
      auto [it, inserted] = names.ids.emplace(std::string(text), static_cast<uint32_t>(names.strings.size()));
      if (inserted) names.strings.emplace_back(text);
      nameMap[id] = it->second;
    });
    if (!s) return s;
  }
  return Status::ok();
}

// The timeline of a single-file run from its cache, when a cache for this file's content is there.
std::shared_ptr<TimelineData> cachedTimeline(const RunData& run) {
  if (run.files.size() != 1) return nullptr;
  const std::string key = cacheKey(run.files[0]);
  if (key.empty()) return nullptr;
  for (const fs::path& cache : cachePaths(run.files[0]))
    if (auto cached = TimelineData::readCache(cache.string(), key))
      return std::make_shared<TimelineData>(std::move(*cached));
  return nullptr;
}

struct SpanChunk {
  size_t file;
  int64_t lo, hi;
};

// Each file's span id range cut into 2 × workers chunks.
Result<std::vector<SpanChunk>> spanChunks(tracedb::RunFiles& opened, int workers) {
  std::vector<SpanChunk> chunks;
  for (size_t f = 0; f < opened.files.size(); ++f) {
    auto ids = opened.files[f].reader->spanIdRange();
    if (!ids) return ids.status();
    if (ids->empty()) continue;
    const int64_t lo = ids->first, hi = ids->last;
    const int64_t n = hi - lo + 1;
    const int parts = std::max(1, workers) * 2;
    for (int p = 0; p < parts; ++p) {
      const int64_t a = lo + n * p / parts, b = lo + n * (p + 1) / parts;
      if (b > a) chunks.push_back({f, a, b});
    }
  }
  return chunks;
}

// Runs task(k, worker) for every k in [0, n) on up to `workers` threads (the calling one is worker 0); the first
// error wins, and the others still finish.
Status forEachOnWorkers(size_t n, int workers, const std::function<Status(size_t k, int worker)>& task) {
  std::atomic<size_t> next{0};
  std::mutex errorMutex;
  Status firstError = Status::ok();
  auto work = [&](int worker) {
    for (size_t k; (k = next.fetch_add(1)) < n;)
      if (Status st = task(k, worker); !st) {
        std::lock_guard lock(errorMutex);
        if (firstError) firstError = st;
      }
  };
  std::vector<std::thread> pool;
  for (int w = 1; w < std::max(1, workers); ++w) pool.emplace_back(work, w);
  work(0);
  for (auto& t : pool) t.join();
  return firstError;
}

// Pass 2: the chunks read in parallel (one connection per chunk); the first error wins.
Status readSpans(const tracedb::RunFiles& opened, const std::vector<SpanChunk>& chunks, const SpanNames& names,
                 int workers, std::vector<std::vector<InputSpan>>& spans) {
  spans.resize(chunks.size());
  return forEachOnWorkers(chunks.size(), workers, [&](size_t k, int) {
    const SpanChunk& c = chunks[k];
    const tracedb::RunFile& in = opened.files[c.file];
    return readSpanChunk(in.path, c.lo, c.hi, in.clock, names.maps[c.file], spans[k]);
  });
}

// The opened run's data, before anything is read from its file.
std::shared_ptr<RunData> newRun(const OpenedRun& opened) {
  auto run = std::make_shared<RunData>();
  run->source = opened.source;
  run->files = opened.files;
  run->live = opened.live;
  return run;
}

using Clock = std::chrono::steady_clock;
double msSince(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

}  // namespace

Result<std::shared_ptr<const RunData>> loadRunSummary(const fs::path& path, const LoadOptions& options) {
  auto opened = openRun(path);
  if (!opened) return opened.status();
  return loadRunSummary(**opened, options);
}

Result<std::shared_ptr<const RunData>> loadRunSummary(const OpenedRun& file, const LoadOptions& options) {
  std::shared_ptr<RunData> run = newRun(file);
  if (run->live || run->files.size() != 1) return std::shared_ptr<const RunData>();
  const auto phase = Clock::now();
  auto opened = tracedb::openRunFiles(std::vector<fs::path>{file.file});
  if (!opened) return opened.status();
  auto summary = tracedb::readLaneSummary(*opened->files[0].reader);
  if (!summary) return summary.status();
  if (!*summary) return std::shared_ptr<const RunData>();
  SpanNames names;
  if (Status s = readTables(*opened, *run, names); !s) return s;
  const tracedb::FileClock& clock = opened->files[0].clock;
  auto source = std::make_shared<SpanWindowSource>();
  for (const tracedb::LaneSummaryRow& row : (*summary)->rows) {
    source->shiftNs.emplace(row.rank, clock.shiftNs(row.rank));
    auto [reach, added] = source->reachNs.emplace(row.rank, row.bucketNs);
    if (!added) reach->second = std::min(reach->second, row.bucketNs);
  }
  source->nameMap = names.maps[0];
  auto timeline = std::make_shared<TimelineData>(TimelineData::fromSummary(
      **summary, names.maps[0], [&](int rank) { return clock.shiftNs(rank); }, std::move(names.strings),
      run->threads));
  // Windows are read by the (rank, begin) index that merge, capture and import create; a file without it is read whole.
  bool indexed = false;
  {
    tracedb::Query q(*opened->files[0].reader,
                     "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = 'spans_rank_begin'",
                     "the span index");
    if (Status st = q.each([&](tracedb::Query& r) { indexed = r.i64(0) > 0; }); !st) return st;
  }
  run->windowed = indexed && static_cast<int64_t>(timeline->spanCount()) > options.fullLoadLimit;
  run->windowSource = std::move(source);
  if (options.timings) *options.timings = LoadTimings{msSince(phase), 0, 0};
  return finish(std::move(run), std::move(timeline));
}

Result<std::shared_ptr<const RunData>> loadRun(const fs::path& path, const LoadOptions& options) {
  auto opened = openRun(path);
  if (!opened) return opened.status();
  return loadRun(**opened, options);
}

Result<std::shared_ptr<const RunData>> loadRun(const OpenedRun& file, const LoadOptions& options) {
  std::shared_ptr<RunData> run = newRun(file);
  auto ms = msSince;
  LoadTimings timings;
  auto phase = Clock::now();

  // Pass 1: open the file (its clocks aligned once, tracedb/run_files.h), read the small tables.
  auto opened = tracedb::openRunFiles(std::vector<fs::path>{file.file});
  if (!opened) return opened.status();
  SpanNames names;
  const RunData* tables =
      options.tablesFrom && options.tablesFrom->files == run->files ? options.tablesFrom.get() : nullptr;
  if (Status s = readTables(*opened, *run, names, tables); !s) return s;
  timings.tablesMs = ms(phase);
  phase = Clock::now();

  if (options.useCache)
    if (auto timeline = cachedTimeline(*run)) {
      timeline->buildLevels(options.workers);
      run->timelineFromCache = true;
      timings.spansMs = ms(phase);
      if (options.timings) *options.timings = timings;
      return finish(std::move(run), std::move(timeline));
    }

  // Pass 2: spans, each file's id range cut into chunks read in parallel.
  auto chunks = spanChunks(*opened, options.workers);
  if (!chunks) return chunks.status();
  std::vector<std::vector<InputSpan>> spans;
  if (Status s = readSpans(*opened, *chunks, names, options.workers, spans); !s) return s;
  opened->files.clear();

  timings.spansMs = ms(phase);
  phase = Clock::now();
  auto timeline = std::make_shared<TimelineData>(
      TimelineData::build(std::move(spans), std::move(names.strings), run->threads, options.workers));
  timeline->buildLevels(options.workers);
  timings.buildMs = ms(phase);
  if (options.timings) *options.timings = timings;
  return finish(std::move(run), std::move(timeline));
}

Result<std::shared_ptr<const TimelineData>> loadWindow(const RunData& run, int64_t fromNs, int64_t toNs,
                                                       int workers) {
  if (!run.windowSource || !run.timeline || run.files.size() != 1)
    return Status::error(run.source.string() + ": not a run file opened from its lane summary");
  const SpanWindowSource& src = *run.windowSource;
  const TimelineData& summary = *run.timeline;
  std::vector<int> ranks;
  for (const Lane& lane : summary.lanes())
    if (ranks.empty() || ranks.back() != lane.rank) ranks.push_back(lane.rank);
  auto at = [](const std::map<int, int64_t>& m, int rank) {
    auto it = m.find(rank);
    return it == m.end() ? int64_t{0} : it->second;
  };
  std::vector<std::vector<InputSpan>> parts(ranks.size());
  std::vector<std::unique_ptr<Reader>> readers(static_cast<size_t>(std::max(1, workers)));  // one per worker
  Status read = forEachOnWorkers(ranks.size(), workers, [&](size_t k, int worker) -> Status {
    std::unique_ptr<Reader>& reader = readers[static_cast<size_t>(worker)];
    if (!reader) {
      auto opened = Reader::open(run.files[0]);
      if (!opened) return opened.status();
      reader = std::move(*opened);
      reader->preferMemoryMap();
    }
    const int rank = ranks[k];
    const int64_t sh = at(src.shiftNs, rank);
    tracedb::Query q(*reader,
                     "SELECT thread, kind, name, begin_ns, dur_ns, step, layer, phase FROM spans WHERE rank = ? "
                     "AND begin_ns >= ? AND begin_ns < ?",
                     "the spans of a window");
    q.bind(1, int64_t{rank}).bind(2, fromNs - sh - at(src.reachNs, rank)).bind(3, toNs - sh);
    std::vector<InputSpan>& out = parts[k];
    return q.each([&](tracedb::Query& r) {
      InputSpan s;
      s.rank = rank;
      s.thread = r.i32(0);
      s.kind = static_cast<uint8_t>(std::clamp(r.i32(1), 0, kKindCount - 1));
      const int64_t name = r.i64(2);
      s.name = name >= 0 && static_cast<uint64_t>(name) < src.nameMap.size() ? src.nameMap[name] : 0;
      s.beginNs = r.i64(3) + sh;
      s.endNs = s.beginNs + std::max<int64_t>(0, r.i64(4));
      s.step = r.i32(5);
      s.layer = static_cast<int16_t>(r.i32(6));
      s.phase = static_cast<uint8_t>(r.i32(7));
      if (s.endNs > fromNs || s.beginNs >= fromNs) out.push_back(s);  // one that ended before cannot nest one in
    });
  });
  if (!read) return read;
  // The spans that began before the read but still overlap the window: longer than their rank's finest bucket, so
  // each is in the summary as itself (weight 1).
  std::vector<InputSpan> spans;
  for (const Lane& lane : summary.lanes()) {
    const int64_t before = fromNs - at(src.reachNs, lane.rank);
    for (const LaneRow& r : lane.rows) {
      size_t i = static_cast<size_t>(std::upper_bound(r.end.begin(), r.end.end(), fromNs) - r.end.begin());
      for (; i < r.size() && r.begin[i] < before; ++i)
        if (r.weight.empty() || r.weight[i] == 1)
          spans.push_back({lane.rank, lane.thread, r.begin[i], r.end[i], r.name[i], r.step[i], r.layer[i], r.kind[i],
                           r.phase[i]});
    }
  }
  size_t total = spans.size();
  for (const auto& p : parts) total += p.size();
  spans.reserve(total);
  for (auto& p : parts) {
    spans.insert(spans.end(), p.begin(), p.end());
    std::vector<InputSpan>().swap(p);
  }
  return std::shared_ptr<const TimelineData>(
      std::make_shared<TimelineData>(TimelineData::buildWindow(summary, std::move(spans), fromNs, toNs, workers)));
}

bool writeTimelineCache(const RunData& run) {
  if (run.live || run.files.size() != 1 || !run.timeline || run.timelineFromCache || run.summaryOnly()) return false;
  const std::string key = cacheKey(run.files[0]);
  if (key.empty()) return false;
  for (const fs::path& cache : cachePaths(run.files[0])) {
    std::error_code ec;
    fs::create_directories(cache.parent_path(), ec);
    if (run.timeline->writeCache(cache.string(), key)) return true;
  }
  return false;
}

}  // namespace tpscope::gui
