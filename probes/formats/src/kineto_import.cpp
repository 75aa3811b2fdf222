#include "tpscope/formats/kineto_import.h"

#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <system_error>
#include <thread>
#include <unordered_map>

#include "chrome_places.h"
#include "import_output.h"
#include "json_text.h"
#include "kineto_model.h"
#include "kineto_names.h"
#include "kineto_parse.h"
#include "pipeline_import.h"
#include "rank_parts.h"
#include "tpscope/tracedb/writer.h"

namespace tpscope::formats {

using tracedb::Result;
using tracedb::Status;
namespace fs = std::filesystem;

namespace {

constexpr size_t kSpanChunk = 8192;

// Frees a vector's buffer (`v = {}` is `v.clear()`: it keeps the buffer).
template <class T>
void release(std::vector<T>& v) {
  std::vector<T>().swap(v);
}

std::string formatBytes(int64_t bytes) {
  char buf[32];
  if (bytes >= 1'000'000) std::snprintf(buf, sizeof buf, "%.1f MB", bytes / 1e6);
  else if (bytes >= 1'000) std::snprintf(buf, sizeof buf, "%.1f kB", bytes / 1e3);
  else std::snprintf(buf, sizeof buf, "%lld bytes", static_cast<long long>(bytes));
  return buf;
}


std::string runIdFor(std::span<const fs::path> inputs, std::string_view format) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a over names and sizes: same inputs, same run id
  auto mix = [&](std::string_view s) {
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  };
  for (const fs::path& p : inputs) {
    mix(p.filename().string());
    std::error_code ec;
    mix(std::to_string(fs::file_size(p, ec)));
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "-%016llx", static_cast<unsigned long long>(h));
  return std::string(format) + buf;
}


// Gives freed heap memory back to the system (glibc keeps it otherwise, in the heap of the thread that freed it).
void releaseFreedMemory() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

// Files parsed at once: at most this many, and no more than the machine has cores (a parse is CPU-bound), and
// between them at most kMaxParseJsonBytes of JSON (a parse holds about 7x its JSON: the text, simdjson's structural
// index of 4 bytes a byte and its string buffer) unless one alone is more: a file is always parsed when no other is
// (as the merge's read-ahead, merge_inputs.cpp).
constexpr size_t kMaxLoadThreads = 8;
constexpr uintmax_t kMaxParseJsonBytes = uintmax_t{1} << 30;

// The JSON bytes of an input, for the bound above: a gzip file's ISIZE trailer (its text size modulo 4 GiB; the
// file size where that is less), else the file size; 0 if it cannot be read (the parse then names the error).
uintmax_t jsonBytesOf(const fs::path& path) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) return 0;
  std::ifstream in(path, std::ios::binary);
  unsigned char head[2] = {0, 0}, tail[4] = {0, 0, 0, 0};
  if (size < 18 || !in.read(reinterpret_cast<char*>(head), 2) || head[0] != 0x1f || head[1] != 0x8b) return size;
  if (!in.seekg(-4, std::ios::end) || !in.read(reinterpret_cast<char*>(tail), 4)) return size;
  const uintmax_t isize = tail[0] | tail[1] << 8 | tail[2] << 16 | uintmax_t{tail[3]} << 24;
  return std::max(isize, size);
}

// One rank of an input (a file holds one, or several when its process or thread names carry ranks).
struct LoadedRank {
  kineto::RankModel model;
  kineto::RankCoords coords;
  bool rankKnown = false;  // else the rank comes from the coordinates, once every input is loaded (resolveRanks)
  std::string rankSource;
  kineto::PipelineRank pipe;
  std::vector<char> records;  // spans that were collective records (chrome_places.h)
};

// One input, parsed and interpreted; span names are ids into `names` until the write phase interns them.
struct LoadedFile {
  Status status;
  std::vector<LoadedRank> ranks;
  std::vector<std::string> names;
  std::string deviceProperties;
  int64_t events = 0, jsonBytes = 0;
  bool compressed = false;
  double parseSeconds = 0, modelSeconds = 0;
  std::vector<uint32_t> nameIds;  // `names` as ids of the output's strings, from the file's turn to be written
};

// The rank of a part, where the part itself says: distributedInfo.rank (a whole file), a global rank in its
// process or thread name, the file name (a whole file); else its coordinates decide later, else the input order.
void decideRank(const kineto::KinetoFile& file, const kineto::RankPart& part, size_t index, LoadedRank& out) {
  out.coords = part.coords;
  out.rankKnown = true;
  if (part.wholeFile && file.rank) {
    out.model.rank = *file.rank;
    out.rankSource = "distributedInfo.rank";
  } else if (part.coords.rank) {
    out.model.rank = *part.coords.rank;
    out.rankSource = part.source;
  } else if (auto fromName = part.wholeFile ? kineto::rankFromFileName(file.path.filename().string()) : std::nullopt) {
    out.model.rank = *fromName;
    out.rankSource = "file name";
  } else if (part.coords.any()) {
    out.rankKnown = false;
    out.rankSource = part.source + " (pp, tp, dp)";
  } else {
    out.model.rank = static_cast<int>(index);
    out.rankSource = "input order";
  }
}

// Interprets one part of a parsed file as one rank: the Kineto model, the Chrome args, the pipeline spans.
Status loadRank(const kineto::KinetoFile& file, const kineto::RankPart& part, size_t index,
                const kineto::InternFn& intern, LoadedRank& out) {
  decideRank(file, part, index, out);
  if (out.rankKnown && out.model.rank < 0)
    return Status::error(file.path.string() + ": negative rank " + std::to_string(out.model.rank));
  const kineto::KinetoFile& events = part.wholeFile ? file : part.events;
  auto model = kineto::buildRankModel(events, out.rankKnown ? out.model.rank : 0, intern);
  if (!model) return model.status();
  out.model = std::move(*model);
  out.records = kineto::applyPlaceArgs(events, out.model);
  if (Status s = kineto::recognisePipelineRank(events, out.model, intern, out.pipe); !s) return s;
  kineto::dropSpans(out.model, out.records);
  return Status::ok();
}

LoadedFile loadFile(const fs::path& path, size_t index, std::shared_ptr<void>& parser) {
  using Clock = std::chrono::steady_clock;
  LoadedFile out;
  const auto parseStart = Clock::now();
  auto parsed = kineto::parseKinetoFile(path, &parser);
  out.parseSeconds = std::chrono::duration<double>(Clock::now() - parseStart).count();
  if (!parsed) {
    out.status = parsed.status();
    return out;
  }
  const kineto::KinetoFile& file = *parsed;
  // Views into `file` and into the ranks' renamed pass names, alive until the models are built.
  std::unordered_map<std::string_view, uint32_t> ids;
  kineto::InternFn intern = [&](std::string_view name) -> Result<uint32_t> {
    auto [it, inserted] = ids.emplace(name, static_cast<uint32_t>(out.names.size()));
    if (inserted) out.names.emplace_back(name);
    return it->second;
  };
  const auto modelStart = Clock::now();
  std::vector<kineto::RankPart> parts = kineto::splitByRank(file);
  out.ranks.resize(parts.size());
  for (size_t p = 0; p < parts.size(); ++p)
    if (Status s = loadRank(file, parts[p], index, intern, out.ranks[p]); !s) {
      out.status = s;
      return out;
    }
  out.modelSeconds = std::chrono::duration<double>(Clock::now() - modelStart).count();
  out.deviceProperties = file.deviceProperties;
  out.events = file.events;
  out.jsonBytes = static_cast<int64_t>(file.buffer.size);
  out.compressed = file.buffer.compressed;
  return out;
}

// Sets the rank of every row of a model built before its rank was known.
void setRank(kineto::RankModel& m, int rank) {
  m.rank = rank;
  m.info.rank = rank;
  for (auto& t : m.threads) t.rank = rank;
  for (auto& s : m.spans) s.rank = rank;
  for (auto& c : m.collectives) c.rank = rank;
  for (auto& c : m.counters) c.rank = rank;
}

// Ranks known only by their coordinates get Megatron's global rank: TP fastest, then DP, then PP
// (rank = pp·T·D + dp·T + tp, T and D the TP and DP sizes named or seen). Their TP/DP position goes to `ranks`.
// Coordinates that are negative or give a rank beyond kMaxCoordinateRank are an error naming the file.
constexpr int64_t kMaxCoordinateRank = 1 << 20;

Status resolveRanks(std::span<const fs::path> inputs, std::vector<LoadedFile>& loaded) {
  int64_t tpSize = 1, dpSize = 1;
  for (const LoadedFile& f : loaded)
    for (const LoadedRank& r : f.ranks) {
      tpSize = std::max<int64_t>({tpSize, r.coords.tpSize.value_or(1), int64_t{r.coords.tp.value_or(0)} + 1});
      dpSize = std::max<int64_t>({dpSize, r.coords.dpSize.value_or(1), int64_t{r.coords.dp.value_or(0)} + 1});
    }
  for (size_t i = 0; i < loaded.size(); ++i)
    for (LoadedRank& r : loaded[i].ranks) {
      if (!r.coords.any()) continue;
      const int64_t tp = r.coords.tp.value_or(0), dp = r.coords.dp.value_or(0), pp = r.coords.pp.value_or(0);
      const int64_t rank = pp * tpSize * dpSize + dp * tpSize + tp;
      if (tp < 0 || dp < 0 || pp < 0 || tpSize > kMaxCoordinateRank || dpSize > kMaxCoordinateRank ||
          pp > kMaxCoordinateRank || rank > kMaxCoordinateRank)
        return Status::error(inputs[i].string() + ": rank coordinates pp " + std::to_string(pp) + ", tp " +
                             std::to_string(tp) + ", dp " + std::to_string(dp) + " (from its " + r.rankSource +
                             ") are out of range (ranks 0 to " + std::to_string(kMaxCoordinateRank) + ")");
      if (!r.rankKnown) {
        setRank(r.model, static_cast<int>(rank));
        r.rankKnown = true;
      }
      r.model.info.tpRank = static_cast<int>(tp);
      r.model.info.tpSize = static_cast<int>(tpSize);
      r.model.info.dpRank = static_cast<int>(dp);
      r.model.info.dpSize = static_cast<int>(dpSize);
    }
  return Status::ok();
}

// The inputs and the output can be used: some inputs, an output in an existing folder, not one of the inputs.
Status checkPaths(std::span<const fs::path> inputs, const fs::path& output, const fs::path& dir,
                  std::string_view format) {
  if (inputs.empty()) return Status::error("import " + std::string(format) + ": no input files");
  if (output.empty()) return Status::error("import " + std::string(format) + ": no output file");
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return Status::error(output.string() + ": folder " + dir.string() + " does not exist");
  for (const fs::path& input : inputs)
    if (fs::exists(output, ec) && fs::equivalent(input, output, ec))
      return Status::error(output.string() + ": the output file is also an input; choose another output");
  return Status::ok();
}

// Load: read, parse and interpret the files in parallel (workers take them in input order; files are independent),
// and hand each to `consume` on this thread, in input order, as soon as it and those before it are loaded. A worker
// starts a file only within one per worker of the file `consume` has, so a run's files are never all held at once.
// Each file's parsed document is freed as soon as its ranks are interpreted (loadFile); each worker keeps its JSON
// parser from file to file (parseKinetoFile's `reuse`). The first error `consume` returns stops the workers and is
// returned.
Status loadFiles(std::span<const fs::path> inputs, std::vector<LoadedFile>& loaded,
                 const std::function<Status(size_t, LoadedFile&)>& consume) {
  loaded.resize(inputs.size());
  std::vector<char> done(inputs.size(), 0);
  size_t next = 0, consumed = 0, parsing = 0;
  uintmax_t heldBytes = 0;
  bool stop = false;
  std::mutex mutex;
  std::condition_variable changed;
  const size_t workers =
      std::min<size_t>({inputs.size(), std::max(1u, std::thread::hardware_concurrency()), kMaxLoadThreads});
  auto work = [&] {
    std::shared_ptr<void> parser;  // this worker's, kept from file to file
    for (;;) {
      size_t i = 0;
      {
        std::lock_guard lock(mutex);
        if (stop || next >= inputs.size()) return;
        i = next++;
      }
      const uintmax_t bytes = jsonBytesOf(inputs[i]);
      {
        std::unique_lock lock(mutex);
        changed.wait(lock, [&] {
          return stop || (i <= consumed + workers && (parsing == 0 || heldBytes + bytes <= kMaxParseJsonBytes));
        });
        if (stop) return;
        heldBytes += bytes;
        ++parsing;
      }
      LoadedFile file = loadFile(inputs[i], i, parser);
      std::lock_guard lock(mutex);
      loaded[i] = std::move(file);
      done[i] = 1;
      heldBytes -= bytes;
      --parsing;
      changed.notify_all();
    }
  };
  std::vector<std::thread> threads;
  for (size_t t = 0; t < workers; ++t) threads.emplace_back(work);
  Status status = Status::ok();
  for (size_t i = 0; i < inputs.size() && status; ++i) {
    {
      std::unique_lock lock(mutex);
      changed.wait(lock, [&] { return done[i] != 0; });
    }
    status = consume(i, loaded[i]);
    std::lock_guard lock(mutex);
    consumed = i + 1;
    if (!status) stop = true;
    changed.notify_all();
  }
  for (auto& t : threads) t.join();
  return status;
}

// What the meta table says about the inputs: per file its rank and where the rank came from; per rank its devices.
struct InputsMeta {
  std::string inputsJson = "[", devicesJson = "{";
};

// The loaded files (every one without error: the write stopped at the first) with their ranks resolved, each rank
// held once, their costs summed.
Result<InputsMeta> collectInputs(std::span<const fs::path> inputs, std::vector<LoadedFile>& loaded,
                                 KinetoImportStats& stats) {
  if (Status s = resolveRanks(inputs, loaded); !s) return s;
  InputsMeta meta;
  std::map<int, fs::path> rankOwner;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const LoadedFile& f = loaded[i];
    for (const LoadedRank& r : f.ranks) {
      auto [owner, inserted] = rankOwner.emplace(r.model.rank, inputs[i]);
      if (!inserted)
        return Status::error(inputs[i].string() + ": holds rank " + std::to_string(r.model.rank) + " (from its " +
                             r.rankSource + "), which " + owner->second.string() +
                             " holds too; give each rank's trace once");
      std::string& in = meta.inputsJson;
      if (in.size() > 1) in += ",";
      in += "{\"file\":";
      appendJsonString(in, inputs[i].filename().string());
      in += ",\"rank\":" + std::to_string(r.model.rank) + ",\"rank_from\":";
      appendJsonString(in, r.rankSource);
      in += ",\"bytes\":" + std::to_string(f.jsonBytes) + ",\"gzip\":" + (f.compressed ? "true" : "false") + "}";
    }
    stats.parseSeconds += f.parseSeconds;
    stats.modelSeconds += f.modelSeconds;
    stats.events += f.events;
    stats.inputBytes += f.jsonBytes;
    if (!f.deviceProperties.empty()) {
      if (meta.devicesJson.size() > 1) meta.devicesJson += ",";
      meta.devicesJson += "\"" + std::to_string(f.ranks.front().model.rank) + "\":" + f.deviceProperties;
    }
  }
  meta.inputsJson += "]";
  meta.devicesJson += "}";
  return meta;
}

// A rank's spans and counters into the output, times shifted by `epoch`, names mapped by `nameIds`; both are
// released once written (the bulk of a rank: what the import must not hold for a whole run).
Status writeSpansAndCounters(tracedb::Writer& writer, kineto::RankModel& m, const std::vector<uint32_t>& nameIds,
                             int64_t epoch, KinetoImportStats& stats) {
  std::vector<tracedb::SpanRow> chunk;
  chunk.reserve(std::min(kSpanChunk, m.spans.size()));
  for (size_t k = 0; k < m.spans.size(); k += kSpanChunk) {
    chunk.clear();
    for (size_t j = k; j < std::min(m.spans.size(), k + kSpanChunk); ++j) {
      chunk.push_back(m.spans[j]);
      chunk.back().beginNs -= epoch;
      chunk.back().name = nameIds[chunk.back().name];
    }
    if (Status s = writer.addSpans(chunk); !s) return s;
  }
  for (tracedb::CounterRow c : m.counters) {
    c.tsNs -= epoch;
    if (Status s = writer.addCounter(c); !s) return s;
  }
  stats.spans += static_cast<int64_t>(m.spans.size());
  stats.counters += static_cast<int64_t>(m.counters.size());
  release(m.spans);
  release(m.counters);
  return Status::ok();
}

// The rest of a rank into the output, times shifted by `epoch`: its info, threads and collectives; its groups merge
// into `groups` (the largest member list of a name wins).
Status writeRankRows(tracedb::Writer& writer, const kineto::RankModel& m, int64_t epoch,
                     std::map<std::string, tracedb::GroupInfo>& groups, KinetoImportStats& stats) {
  tracedb::RankInfo info = m.info;
  if (info.startNs) *info.startNs -= epoch;
  if (info.endNs) *info.endNs -= epoch;
  if (Status s = writer.putRank(info); !s) return s;
  for (const auto& t : m.threads)
    if (Status s = writer.putThread(t); !s) return s;
  for (auto& g : m.groups) {
    auto [it, inserted] = groups.emplace(g.name, g);
    if (!inserted && it->second.ranks.size() < g.ranks.size()) it->second = g;
  }
  for (tracedb::CollectiveRow c : m.collectives) {
    c.enqueueNs -= epoch;
    if (c.startNs) *c.startNs -= epoch;
    if (c.endNs) *c.endNs -= epoch;
    if (Status s = writer.upsertCollective(c); !s) return s;
  }
  stats.collectives += static_cast<int64_t>(m.collectives.size());
  stats.threads += static_cast<int64_t>(m.threads.size());
  stats.flows += m.flowsUsed;
  for (const auto& [reason, count] : m.skipped) stats.skipped[reason] += count;
  stats.seqByOrder.insert(m.seqByOrder.begin(), m.seqByOrder.end());
  stats.kernelTimedCollectives += m.kernelTimed;
  return Status::ok();
}

Status writeMeta(tracedb::Writer& writer, int64_t epoch, const InputsMeta& inputs, const KinetoImportStats& stats,
                 std::string_view format) {
  std::string skippedJson = "{";
  for (const auto& [reason, count] : stats.skipped) {
    if (skippedJson.size() > 1) skippedJson += ",";
    appendJsonString(skippedJson, reason);
    skippedJson += ":" + std::to_string(count);
  }
  skippedJson += "}";
  for (auto [key, value] : std::initializer_list<std::pair<std::string_view, std::string>>{
           {tracedb::meta_keys::kEpochUnixNs, std::to_string(epoch)},
           {tracedb::meta_keys::kTool, "tpscope import " + std::string(format)},
           {tracedb::meta_keys::kSource, std::string(format)},
           {"kineto_inputs", inputs.inputsJson},
           {"kineto_import_skipped", skippedJson}}) {
    if (Status s = writer.setMeta(key, value); !s) return s;
  }
  if (inputs.devicesJson.size() > 2)
    if (Status s = writer.setMeta("kineto_device_properties", inputs.devicesJson); !s) return s;
  if (!stats.seqByOrder.empty()) {
    std::string groups;
    for (const std::string& g : stats.seqByOrder) groups += (groups.empty() ? "" : ",") + g;
    if (Status s = writer.setMeta(tracedb::meta_keys::kSeqByOrder, groups); !s) return s;
  }
  // Every collective timed by its kernel: the ranks' arrivals are their kernels' starts (a mixed trace keeps the
  // host's enqueue, the one arrival every record has).
  if (stats.collectives > 0 && stats.kernelTimedCollectives == stats.collectives)
    if (Status s = writer.setMeta(tracedb::meta_keys::kCollectiveArrival, "device"); !s) return s;
  return Status::ok();
}

// The pipeline of the run (pipeline_import.h): its point-to-point records into the models, meta 'pipeline' as JSON
// ("" without one). Ranks with pipeline coordinates that are not a whole run's world get world_size = the ranks.
std::string assemblePipeline(std::vector<LoadedFile>& loaded, std::map<std::string, tracedb::GroupInfo>& groups,
                             KinetoImportStats& stats) {
  std::vector<kineto::PipelineRankRef> refs;
  int ranks = 0;
  for (LoadedFile& f : loaded)
    for (LoadedRank& r : f.ranks) {
      refs.push_back({r.model.rank, r.coords, &r.pipe, &r.model});
      ++ranks;
    }
  std::map<std::string, int64_t> skipped;
  std::string json = kineto::assemblePipeline(refs, groups, skipped);
  for (const auto& [reason, count] : skipped) stats.skipped[reason] += count;
  for (LoadedFile& f : loaded)
    for (LoadedRank& r : f.ranks)
      if (r.coords.any() && r.model.info.worldSize < ranks) r.model.info.worldSize = ranks;
  return json;
}

// Groups that only collective records name (tpscope's Chrome export carries no process groups): their members are
// the ranks that hold a record of them.
void addRecordGroups(const std::vector<LoadedFile>& loaded, std::map<std::string, tracedb::GroupInfo>& groups) {
  std::map<std::string, std::set<int>> members;
  for (const LoadedFile& f : loaded)
    for (const LoadedRank& r : f.ranks)
      for (const tracedb::CollectiveRow& c : r.model.collectives)
        if (!groups.count(c.group)) members[c.group].insert(c.rank);
  for (const auto& [name, ranks] : members) groups[name] = tracedb::GroupInfo{name, {ranks.begin(), ranks.end()}, ""};
}

// The output while the inputs are read, one transaction into a temporary file (CreateOptions::bulkLoad) renamed
// onto the output when complete. Each file's spans and counters, the bulk of a run, are written as soon as its turn
// comes (consume), and freed: the import holds a few files' spans, never the run's. Their times are relative to a
// provisional epoch (the first file's earliest event) until the run's earliest event is known, then shifted once
// (finish; 0.35 s for 1.3 M spans). A rank's other rows wait for the run: its rank where only its coordinates name
// it, the pipeline's pairing of sends and receives, and the epoch need every file.
class StreamedOutput {
 public:
  StreamedOutput(std::span<const fs::path> inputs, const fs::path& output, const fs::path& dir, std::string_view format)
      : inputs_(inputs), staged_(output, dir), format_(format) {}

  Status open() {
    tracedb::CreateOptions options;
    options.overwrite = true;
    options.runId = runIdFor(inputs_, format_);
    options.source = std::string(format_);
    options.bulkLoad = true;
    auto created = tracedb::Writer::create(staged_.temp(), options);
    if (!created) return created.status();
    writer_ = std::move(*created);
    return writer_->begin();
  }

  // One loaded file, in input order: its names interned, its spans and counters written where its rank is known.
  Status consume(LoadedFile& f, KinetoImportStats& stats) {
    if (!f.status) return f.status;
    f.nameIds.reserve(f.names.size());
    for (const std::string& name : f.names) {
      auto id = writer_->intern(name);
      if (!id) return id.status();
      f.nameIds.push_back(*id);
    }
    release(f.names);
    for (const LoadedRank& r : f.ranks) epoch_ = std::min(epoch_.value_or(r.model.minNs), r.model.minNs);
    if (!provisionalEpoch_) provisionalEpoch_ = epoch_;
    for (LoadedRank& r : f.ranks)
      if (r.rankKnown)
        if (Status s = writeSpansAndCounters(*writer_, r.model, f.nameIds, *provisionalEpoch_, stats); !s) return s;
    return Status::ok();
  }

  // Every file consumed and its ranks resolved: the spans of ranks known only by coordinates, the time shift, every
  // rank's other rows, groups, pipeline and meta; then the indexes, and the file moved into place.
  Status finish(std::vector<LoadedFile>& loaded, const InputsMeta& meta, KinetoImportStats& stats) {
    if (!epoch_) return Status::error("import " + std::string(format_) + ": the inputs hold no rank");
    for (LoadedFile& f : loaded)
      for (LoadedRank& r : f.ranks)
        if (Status s = writeSpansAndCounters(*writer_, r.model, f.nameIds, *provisionalEpoch_, stats); !s) return s;
    if (Status s = writer_->shiftSpanAndCounterTimes(*provisionalEpoch_ - *epoch_); !s) return s;
    std::map<std::string, tracedb::GroupInfo> groups;
    const std::string pipeline = assemblePipeline(loaded, groups, stats);
    for (const LoadedFile& f : loaded)
      for (const LoadedRank& r : f.ranks)
        if (Status s = writeRankRows(*writer_, r.model, *epoch_, groups, stats); !s) return s;
    addRecordGroups(loaded, groups);
    for (const auto& [name, g] : groups)
      if (Status s = writer_->putGroup(g); !s) return s;
    if (!pipeline.empty())
      if (Status s = writer_->setMeta(tracedb::meta_keys::kPipeline, pipeline); !s) return s;
    if (Status s = writeMeta(*writer_, *epoch_, meta, stats, format_); !s) return s;
    if (Status s = writer_->commit(); !s) return s;
    // Every row is in the file: free the models before SQLite sorts the indexes. They were freed into the load
    // workers' heaps, which SQLite (on this thread) cannot reuse: give them back to the system.
    release(loaded);
    releaseFreedMemory();
    if (Status s = writer_->createIndexes(); !s) return s;
    if (Status s = writer_->close(); !s) return s;
    writer_.reset();
    return staged_.moveIntoPlace();
  }

 private:
  std::span<const fs::path> inputs_;
  detail::ImportOutput staged_;
  std::string_view format_;
  std::unique_ptr<tracedb::Writer> writer_;
  std::optional<int64_t> provisionalEpoch_, epoch_;  // the first file's earliest event; the run's
};

}  // namespace

std::string KinetoImportStats::summary() const {
  std::string s = "imported " + std::to_string(ranks) + (ranks == 1 ? " rank" : " ranks") + " from " +
                  std::to_string(files) + (files == 1 ? " file" : " files") + " (" + formatBytes(inputBytes) +
                  " of JSON";
  if (seconds > 0) {
    char buf[64];
    std::snprintf(buf, sizeof buf, " in %.2f s, %.0f MB/s", seconds, inputBytes / 1e6 / seconds);
    s += buf;
  }
  s += "): " + std::to_string(spans) + " spans, " + std::to_string(collectives) + " collectives, " +
       std::to_string(counters) + " counter samples, " + std::to_string(threads) + " threads/streams";
  int64_t skippedTotal = 0;
  for (const auto& [reason, count] : skipped) skippedTotal += count;
  if (skippedTotal > 0) {
    s += "\nnot imported: " + std::to_string(skippedTotal) + " events (";
    bool first = true;
    for (const auto& [reason, count] : skipped) {
      s += (first ? "" : "; ") + reason + ": " + std::to_string(count);
      first = false;
    }
    s += ")";
  }
  return s;
}

namespace {

Result<KinetoImportStats> importTraces(std::span<const fs::path> inputs, const fs::path& output,
                                       std::string_view format) {
  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::time_point from) { return std::chrono::duration<double>(Clock::now() - from).count(); };
  const auto t0 = Clock::now();
  const fs::path dir = output.has_parent_path() ? output.parent_path() : fs::path(".");
  if (Status s = checkPaths(inputs, output, dir, format); !s) return s;
  StreamedOutput out(inputs, output, dir, format);
  if (Status s = out.open(); !s) return s;
  KinetoImportStats stats;
  std::vector<LoadedFile> loaded;
  double consumeSeconds = 0;
  Status s = loadFiles(inputs, loaded, [&](size_t, LoadedFile& f) {
    const auto start = Clock::now();
    Status consumed = out.consume(f, stats);
    consumeSeconds += seconds(start);
    return consumed;
  });
  if (!s) return s;
  auto meta = collectInputs(inputs, loaded, stats);
  if (!meta) return meta.status();
  for (const LoadedFile& f : loaded) stats.ranks += static_cast<int>(f.ranks.size());
  const auto finishStart = Clock::now();
  if (Status f = out.finish(loaded, *meta, stats); !f) return f;
  stats.writeSeconds = consumeSeconds + seconds(finishStart);
  stats.files = static_cast<int>(inputs.size());
  stats.seconds = seconds(t0);
  return stats;
}

}  // namespace

Result<KinetoImportStats> importKineto(std::span<const fs::path> inputs, const fs::path& output) {
  return importTraces(inputs, output, "kineto");
}

Result<KinetoImportStats> importChrome(std::span<const fs::path> inputs, const fs::path& output) {
  return importTraces(inputs, output, "chrome");
}

}  // namespace tpscope::formats
