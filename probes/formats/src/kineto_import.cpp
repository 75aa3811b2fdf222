#include "tpscope/formats/kineto_import.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <system_error>
#include <thread>
#include <unordered_map>

#include "json_text.h"
#include "kineto_model.h"
#include "kineto_names.h"
#include "kineto_parse.h"
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

void removeWithSidecars(const fs::path& path) {
  std::error_code ec;
  for (const char* suffix : {"", "-wal", "-shm", "-journal"}) fs::remove(path.string() + suffix, ec);
}

// Removes the temporary output unless released (every early return is a failure).
struct TempFileGuard {
  fs::path path;
  bool keep = false;
  ~TempFileGuard() {
    if (!keep) removeWithSidecars(path);
  }
};

std::string runIdFor(std::span<const fs::path> inputs) {
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
  std::snprintf(buf, sizeof buf, "kineto-%016llx", static_cast<unsigned long long>(h));
  return buf;
}


// Files parsed at once (each holds about 3x its JSON in memory while it is parsed).
constexpr size_t kMaxLoadThreads = 8;

// One input, parsed and interpreted; span names are ids into `names` until the write phase interns them.
struct LoadedFile {
  Status status;
  kineto::RankModel model;
  std::vector<std::string> names;
  std::string rankSource;
  std::string deviceProperties;
  int64_t events = 0, jsonBytes = 0;
  bool compressed = false;
  double parseSeconds = 0, modelSeconds = 0;
};

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
  std::optional<int> rank = file.rank;
  out.rankSource = "distributedInfo.rank";
  if (!rank) {
    rank = kineto::rankFromFileName(path.filename().string());
    out.rankSource = "file name";
  }
  if (!rank) {
    rank = static_cast<int>(index);
    out.rankSource = "input order";
  }
  if (*rank < 0) {
    out.status = Status::error(path.string() + ": negative rank " + std::to_string(*rank));
    return out;
  }
  std::unordered_map<std::string_view, uint32_t> ids;  // views into `file`, alive until the model is built
  kineto::InternFn intern = [&](std::string_view name) -> Result<uint32_t> {
    auto [it, inserted] = ids.emplace(name, static_cast<uint32_t>(out.names.size()));
    if (inserted) out.names.emplace_back(name);
    return it->second;
  };
  const auto modelStart = Clock::now();
  auto model = kineto::buildRankModel(file, *rank, intern);
  out.modelSeconds = std::chrono::duration<double>(Clock::now() - modelStart).count();
  if (!model) {
    out.status = model.status();
    return out;
  }
  out.model = std::move(*model);
  out.deviceProperties = file.deviceProperties;
  out.events = file.events;
  out.jsonBytes = static_cast<int64_t>(file.buffer.size);
  out.compressed = file.buffer.compressed;
  return out;
}

// The inputs and the output can be used: some inputs, an output in an existing folder, not one of the inputs.
Status checkPaths(std::span<const fs::path> inputs, const fs::path& output, const fs::path& dir) {
  if (inputs.empty()) return Status::error("import kineto: no input files");
  if (output.empty()) return Status::error("import kineto: no output file");
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return Status::error(output.string() + ": folder " + dir.string() + " does not exist");
  for (const fs::path& input : inputs)
    if (fs::exists(output, ec) && fs::equivalent(input, output, ec))
      return Status::error(output.string() + ": the output file is also an input; choose another output");
  return Status::ok();
}

// Load: read, parse and interpret the files in parallel (one file per worker; files are independent).
std::vector<LoadedFile> loadFiles(std::span<const fs::path> inputs) {
  std::vector<LoadedFile> loaded(inputs.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < inputs.size(); i = next++) loaded[i] = loadFile(inputs[i], i);
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

// The loaded files' errors in input order (whichever worker met them first), one file per rank, their costs summed.
Result<InputsMeta> collectInputs(std::span<const fs::path> inputs, const std::vector<LoadedFile>& loaded,
                                 KinetoImportStats& stats) {
  InputsMeta meta;
  std::map<int, fs::path> rankOwner;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const LoadedFile& f = loaded[i];
    if (!f.status) return f.status;
    auto [owner, inserted] = rankOwner.emplace(f.model.rank, inputs[i]);
    if (!inserted)
      return Status::error(inputs[i].string() + ": holds rank " + std::to_string(f.model.rank) + " (from its " +
                           f.rankSource + "), which " + owner->second.string() +
                           " holds too; give each rank's trace once");
    stats.parseSeconds += f.parseSeconds;
    stats.modelSeconds += f.modelSeconds;
    stats.events += f.events;
    stats.inputBytes += f.jsonBytes;
    std::string& in = meta.inputsJson;
    if (i) in += ",";
    in += "{\"file\":";
    appendJsonString(in, inputs[i].filename().string());
    in += ",\"rank\":" + std::to_string(f.model.rank) + ",\"rank_from\":";
    appendJsonString(in, f.rankSource);
    in += ",\"bytes\":" + std::to_string(f.jsonBytes) + ",\"gzip\":" + (f.compressed ? "true" : "false") + "}";
    if (!f.deviceProperties.empty()) {
      if (meta.devicesJson.size() > 1) meta.devicesJson += ",";
      meta.devicesJson += "\"" + std::to_string(f.model.rank) + "\":" + f.deviceProperties;
    }
  }
  meta.inputsJson += "]";
  meta.devicesJson += "}";
  return meta;
}

// One rank's model into the output, times shifted by `epoch`; its groups merge into `groups` (the largest member
// list of a name wins). The model's spans are released once written.
Status writeRank(tracedb::Writer& writer, LoadedFile& f, int64_t epoch,
                 std::map<std::string, tracedb::GroupInfo>& groups, KinetoImportStats& stats) {
  kineto::RankModel& m = f.model;
  // Span names were interned per file while loading; map them to the output's string ids once per name.
  std::vector<uint32_t> nameIds;
  nameIds.reserve(f.names.size());
  for (const std::string& name : f.names) {
    auto id = writer.intern(name);
    if (!id) return id.status();
    nameIds.push_back(*id);
  }
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
  m.spans = {};
  return Status::ok();
}

Status writeMeta(tracedb::Writer& writer, int64_t epoch, const InputsMeta& inputs, const KinetoImportStats& stats) {
  std::string skippedJson = "{";
  for (const auto& [reason, count] : stats.skipped) {
    if (skippedJson.size() > 1) skippedJson += ",";
    appendJsonString(skippedJson, reason);
    skippedJson += ":" + std::to_string(count);
  }
  skippedJson += "}";
  for (auto [key, value] : std::initializer_list<std::pair<std::string_view, std::string>>{
           {tracedb::meta_keys::kEpochUnixNs, std::to_string(epoch)},
           {tracedb::meta_keys::kTool, "tpscope import kineto"},
           {tracedb::meta_keys::kSource, "kineto"},
           {"kineto_inputs", inputs.inputsJson},
           {"kineto_import_skipped", skippedJson}}) {
    if (Status s = writer.setMeta(key, value); !s) return s;
  }
  if (inputs.devicesJson.size() > 2)
    if (Status s = writer.setMeta("kineto_device_properties", inputs.devicesJson); !s) return s;
  return Status::ok();
}

// Write: one transaction into a temporary file (CreateOptions::bulkLoad), renamed onto the output when complete.
Status writeOutput(std::span<const fs::path> inputs, const fs::path& output, const fs::path& dir,
                   std::vector<LoadedFile>& loaded, const InputsMeta& meta, KinetoImportStats& stats) {
  TempFileGuard temp{dir / ("." + output.filename().string() + ".tmp-" + std::to_string(::getpid()))};
  removeWithSidecars(temp.path);
  tracedb::CreateOptions options;
  options.overwrite = true;
  options.runId = runIdFor(inputs);
  options.source = "kineto";
  options.bulkLoad = true;
  auto created = tracedb::Writer::create(temp.path, options);
  if (!created) return created.status();
  std::unique_ptr<tracedb::Writer> writer = std::move(*created);
  if (Status s = writer->begin(); !s) return s;

  int64_t epoch = loaded.front().model.minNs;
  for (const LoadedFile& f : loaded) epoch = std::min(epoch, f.model.minNs);
  std::map<std::string, tracedb::GroupInfo> groups;
  for (LoadedFile& f : loaded)
    if (Status s = writeRank(*writer, f, epoch, groups, stats); !s) return s;
  for (const auto& [name, g] : groups)
    if (Status s = writer->putGroup(g); !s) return s;
  if (Status s = writeMeta(*writer, epoch, meta, stats); !s) return s;

  if (Status s = writer->commit(); !s) return s;
  if (Status s = writer->createIndexes(); !s) return s;
  if (Status s = writer->close(); !s) return s;
  writer.reset();
  std::error_code ec;
  fs::rename(temp.path, output, ec);
  if (ec) return Status::error(output.string() + ": cannot move the finished import into place: " + ec.message());
  temp.keep = true;
  removeWithSidecars(temp.path);  // stray sidecars only; the file itself was renamed
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

Result<KinetoImportStats> importKineto(std::span<const fs::path> inputs, const fs::path& output) {
  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::time_point from) { return std::chrono::duration<double>(Clock::now() - from).count(); };
  const auto t0 = Clock::now();
  const fs::path dir = output.has_parent_path() ? output.parent_path() : fs::path(".");
  if (Status s = checkPaths(inputs, output, dir); !s) return s;
  std::vector<LoadedFile> loaded = loadFiles(inputs);
  KinetoImportStats stats;
  auto meta = collectInputs(inputs, loaded, stats);
  if (!meta) return meta.status();
  const auto writeStart = Clock::now();
  if (Status s = writeOutput(inputs, output, dir, loaded, *meta, stats); !s) return s;
  stats.writeSeconds = seconds(writeStart);
  stats.files = static_cast<int>(inputs.size());
  stats.ranks = static_cast<int>(loaded.size());
  stats.seconds = seconds(t0);
  return stats;
}

}  // namespace tpscope::formats
