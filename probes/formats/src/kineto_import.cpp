#include "tpscope/formats/kineto_import.h"

#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <system_error>
#include <thread>
#include <unordered_map>

#include "json_text.h"
#include "kineto_model.h"
#include "kineto_names.h"
#include "kineto_parse.h"
#include "chrome_places.h"
#include "pipeline_import.h"
#include "rank_parts.h"
#include "import_output.h"
#include "tpscope/tracedb/writer.h"

namespace tpscope::formats {

using tracedb::Result;
using tracedb::Status;
namespace fs = std::filesystem;

namespace {

constexpr size_t kSpanChunk = 8192;

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

LoadedFile loadFile(const fs::path& path, size_t index) {
  using Clock = std::chrono::steady_clock;
  LoadedFile out;
  const auto parseStart = Clock::now();
  auto parsed = kineto::parseKinetoFile(path);
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

// Load: read, parse and interpret the files in parallel (one file per worker; files are independent). Each file's
// parsed document is freed as soon as its ranks are interpreted (loadFile); its memory stays in the worker's heap for
// the next file's parse (giving it back to the system after each file costs ~10% more CPU in page faults).
std::vector<LoadedFile> loadFiles(std::span<const fs::path> inputs) {
  std::vector<LoadedFile> loaded(inputs.size());
  std::atomic<size_t> next{0};
  std::mutex mutex;
  std::condition_variable changed;
  uintmax_t heldBytes = 0;
  size_t parsing = 0;
  auto work = [&] {
    for (size_t i = next++; i < inputs.size(); i = next++) {
      const uintmax_t bytes = jsonBytesOf(inputs[i]);
      {
        std::unique_lock lock(mutex);
        changed.wait(lock, [&] { return parsing == 0 || heldBytes + bytes <= kMaxParseJsonBytes; });
        heldBytes += bytes;
        ++parsing;
      }
      loaded[i] = loadFile(inputs[i], i);
      std::lock_guard lock(mutex);
      heldBytes -= bytes;
      --parsing;
      changed.notify_all();
    }
  };
  const size_t workers =
      std::min<size_t>({inputs.size(), std::max(1u, std::thread::hardware_concurrency()), kMaxLoadThreads});
  std::vector<std::thread> threads;
  for (size_t t = 1; t < workers; ++t) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();
  return loaded;
}

// What the meta table says about the inputs: per file its rank and where the rank came from; per rank its devices.
struct InputsMeta {
  std::string inputsJson = "[", devicesJson = "{";
};

// The loaded files' errors in input order (whichever worker met them first), each rank held once, their costs summed.
Result<InputsMeta> collectInputs(std::span<const fs::path> inputs, std::vector<LoadedFile>& loaded,
                                 KinetoImportStats& stats) {
  for (const LoadedFile& f : loaded)
    if (!f.status) return f.status;
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

// One rank's model into the output, times shifted by `epoch`; its groups merge into `groups` (the largest member
// list of a name wins). The model's spans are released once written.
Status writeRank(tracedb::Writer& writer, kineto::RankModel& m, const std::vector<uint32_t>& nameIds, int64_t epoch,
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
  std::vector<tracedb::SpanRow> chunk;
  chunk.reserve(kSpanChunk);
  for (size_t k = 0; k < m.spans.size(); k += kSpanChunk) {
    chunk.clear();
    for (size_t j = k; j < std::min(m.spans.size(), k + kSpanChunk); ++j) {
      chunk.push_back(m.spans[j]);
      chunk.back().beginNs -= epoch;
      chunk.back().name = nameIds[chunk.back().name];
    }
    if (Status s = writer.addSpans(chunk); !s) return s;
  }
  for (tracedb::CollectiveRow c : m.collectives) {
    c.enqueueNs -= epoch;
    if (c.startNs) *c.startNs -= epoch;
    if (c.endNs) *c.endNs -= epoch;
    if (Status s = writer.upsertCollective(c); !s) return s;
  }
  for (tracedb::CounterRow c : m.counters) {
    c.tsNs -= epoch;
    if (Status s = writer.addCounter(c); !s) return s;
  }
  stats.spans += static_cast<int64_t>(m.spans.size());
  stats.collectives += static_cast<int64_t>(m.collectives.size());
  stats.counters += static_cast<int64_t>(m.counters.size());
  stats.threads += static_cast<int64_t>(m.threads.size());
  stats.flows += m.flowsUsed;
  for (const auto& [reason, count] : m.skipped) stats.skipped[reason] += count;
  stats.seqByOrder.insert(m.seqByOrder.begin(), m.seqByOrder.end());
  stats.kernelTimedCollectives += m.kernelTimed;
  m.spans = {};
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

// Write: one transaction into a temporary file (CreateOptions::bulkLoad), renamed onto the output when complete.
Status writeOutput(std::span<const fs::path> inputs, const fs::path& output, const fs::path& dir,
                   std::vector<LoadedFile>& loaded, const InputsMeta& meta, KinetoImportStats& stats,
                   std::string_view format) {
  detail::ImportOutput staged(output, dir);
  tracedb::CreateOptions options;
  options.overwrite = true;
  options.runId = runIdFor(inputs, format);
  options.source = std::string(format);
  options.bulkLoad = true;
  auto created = tracedb::Writer::create(staged.temp(), options);
  if (!created) return created.status();
  std::unique_ptr<tracedb::Writer> writer = std::move(*created);
  if (Status s = writer->begin(); !s) return s;

  int64_t epoch = loaded.front().ranks.front().model.minNs;
  for (const LoadedFile& f : loaded)
    for (const LoadedRank& r : f.ranks) epoch = std::min(epoch, r.model.minNs);
  std::map<std::string, tracedb::GroupInfo> groups;
  const std::string pipeline = assemblePipeline(loaded, groups, stats);
  for (LoadedFile& f : loaded) {
    // Span names were interned per file while loading; map them to the output's string ids once per name.
    std::vector<uint32_t> nameIds;
    nameIds.reserve(f.names.size());
    for (const std::string& name : f.names) {
      auto id = writer->intern(name);
      if (!id) return id.status();
      nameIds.push_back(*id);
    }
    for (LoadedRank& r : f.ranks)
      if (Status s = writeRank(*writer, r.model, nameIds, epoch, groups, stats); !s) return s;
  }
  addRecordGroups(loaded, groups);
  for (const auto& [name, g] : groups)
    if (Status s = writer->putGroup(g); !s) return s;
  if (!pipeline.empty())
    if (Status s = writer->setMeta(tracedb::meta_keys::kPipeline, pipeline); !s) return s;
  if (Status s = writeMeta(*writer, epoch, meta, stats, format); !s) return s;

  if (Status s = writer->commit(); !s) return s;
  // Every row is in the file: free the models before SQLite sorts the indexes, the import's largest use of memory.
  // Models that a second load worker built were freed into that worker's heap, which SQLite (on this thread) cannot
  // reuse: give it back to the system (one file: nothing to give, and the index build would fault the pages back in).
  for (LoadedFile& f : loaded) f.ranks = {};
  if (loaded.size() > 1) releaseFreedMemory();
  if (Status s = writer->createIndexes(); !s) return s;
  if (Status s = writer->close(); !s) return s;
  writer.reset();
  if (Status s = staged.moveIntoPlace(); !s) return s;
  return Status::ok();
}

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
  std::vector<LoadedFile> loaded = loadFiles(inputs);
  KinetoImportStats stats;
  auto meta = collectInputs(inputs, loaded, stats);
  if (!meta) return meta.status();
  for (const LoadedFile& f : loaded) stats.ranks += static_cast<int>(f.ranks.size());
  const auto writeStart = Clock::now();
  if (Status s = writeOutput(inputs, output, dir, loaded, *meta, stats, format); !s) return s;
  stats.writeSeconds = seconds(writeStart);
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
