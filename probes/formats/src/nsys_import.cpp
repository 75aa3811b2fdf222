#include "tpscope/formats/nsys_import.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <memory>
#include <set>

#include "json_text.h"
#include "kineto_names.h"
#include "nsys_model.h"
#include "nsys_read.h"
#include "import_output.h"
#include "tpscope/tracedb/writer.h"

namespace tpscope::formats {

using tracedb::Result;
using tracedb::Status;
namespace fs = std::filesystem;

namespace {

struct LoadedNsys {
  nsys::NsysFile file;
  nsys::FileModel model;
};


Status checkPaths(std::span<const fs::path> inputs, const fs::path& output, const fs::path& dir) {
  if (inputs.empty()) return Status::error("import nsys: no input files");
  if (output.empty()) return Status::error("import nsys: no output file");
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return Status::error(output.string() + ": folder " + dir.string() + " does not exist");
  for (const fs::path& input : inputs)
    if (fs::exists(output, ec) && fs::equivalent(input, output, ec))
      return Status::error(output.string() + ": the output file is also an input; choose another output");
  return Status::ok();
}

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
  std::snprintf(buf, sizeof buf, "nsys-%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// Ranks: an NVTX "rank N" hint, else (a file of one process) the file name, else the lowest free ranks in input
// order and, within a file, by pid. Duplicates are an error naming both files.
Status assignRanks(std::span<const fs::path> inputs, std::vector<LoadedNsys>& loaded) {
  std::map<int, size_t> owner;  // rank -> input index
  auto claim = [&](size_t i, nsys::ProcessModel& p, int rank, std::string source) -> Status {
    auto [it, inserted] = owner.emplace(rank, i);
    if (!inserted)
      return Status::error(inputs[i].string() + ": process " + std::to_string(p.pid) + " is rank " +
                           std::to_string(rank) + " (from its " + source + "), which " +
                           inputs[it->second].string() + " holds too; give each rank once");
    p.info.rank = rank;
    p.rankSource = std::move(source);
    return Status::ok();
  };
  std::vector<std::pair<size_t, nsys::ProcessModel*>> pending;
  for (size_t i = 0; i < loaded.size(); ++i) {
    auto& procs = loaded[i].model.processes;
    for (nsys::ProcessModel& p : procs) {
      std::optional<int> fromName;
      if (procs.size() == 1) fromName = kineto::rankFromFileName(inputs[i].filename().string());
      Status s = Status::ok();
      if (p.rankHint) s = claim(i, p, *p.rankHint, "NVTX 'rank " + std::to_string(*p.rankHint) + "'");
      else if (fromName) s = claim(i, p, *fromName, "file name");
      else pending.emplace_back(i, &p);
      if (!s) return s;
    }
  }
  int next = 0;
  for (auto& [i, p] : pending) {
    while (owner.count(next)) ++next;
    const bool several = loaded[i].model.processes.size() > 1;
    if (Status s = claim(i, *p, next, several ? "pid order in the file" : "input order"); !s) return s;
  }
  return Status::ok();
}

std::string skippedJson(const std::map<std::string, int64_t>& skipped) {
  std::string j = "{";
  for (const auto& [reason, count] : skipped) {
    if (j.size() > 1) j += ",";
    appendJsonString(j, reason);
    j += ":" + std::to_string(count);
  }
  return j + "}";
}

std::string inputsJson(std::span<const fs::path> inputs, const std::vector<LoadedNsys>& loaded) {
  std::string j = "[";
  for (size_t i = 0; i < loaded.size(); ++i)
    for (const nsys::ProcessModel& p : loaded[i].model.processes) {
      if (j.size() > 1) j += ",";
      j += "{\"file\":";
      appendJsonString(j, inputs[i].filename().string());
      j += ",\"schema_version\":";
      appendJsonString(j, loaded[i].file.schemaVersion);
      j += ",\"pid\":" + std::to_string(p.pid) + ",\"rank\":" + std::to_string(p.info.rank) + ",\"rank_from\":";
      appendJsonString(j, p.rankSource);
      auto name = loaded[i].file.processNames.find(p.key);
      j += ",\"process\":";
      appendJsonString(j, name != loaded[i].file.processNames.end() ? name->second : std::string());
      j += ",\"session_start_utc_ns\":" +
           (loaded[i].file.sessionUtcNs ? std::to_string(*loaded[i].file.sessionUtcNs) : std::string("null")) + "}";
    }
  return j + "]";
}

Status writeProcess(tracedb::Writer& w, const LoadedNsys& l, const nsys::ProcessModel& p, int64_t shift,
                    std::vector<int64_t>& nameIds, int worldSize, NsysImportStats& stats) {
  const int rank = p.info.rank;
  tracedb::RankInfo info = p.info;
  info.worldSize = worldSize;
  info.startNs = p.minNs + shift;
  info.endNs = p.maxNs + shift;
  if (Status s = w.putRank(info); !s) return s;
  for (tracedb::ThreadInfo t : p.threads) {
    t.rank = rank;
    if (Status s = w.putThread(t); !s) return s;
  }
  std::vector<tracedb::SpanRow> chunk;
  chunk.reserve(8192);
  auto flush = [&]() -> Status {
    Status s = w.addSpans(chunk);
    chunk.clear();
    return s;
  };
  for (const tracedb::SpanRow& s : p.spans) {
    tracedb::SpanRow row = s;
    row.rank = rank;
    row.beginNs += shift;
    if (nameIds[row.name] < 0) {
      auto id = w.intern(l.file.names[row.name]);
      if (!id) return id.status();
      nameIds[row.name] = *id;
    }
    row.name = static_cast<uint32_t>(nameIds[row.name]);
    if (row.kind == tracedb::SpanKind::Kernel || row.kind == tracedb::SpanKind::NcclKernel) ++stats.kernels;
    chunk.push_back(row);
    if (chunk.size() == 8192)
      if (Status st = flush(); !st) return st;
  }
  if (Status st = flush(); !st) return st;
  for (tracedb::CollectiveRow c : p.collectives) {
    c.rank = rank;
    c.enqueueNs += shift;
    if (c.startNs) *c.startNs += shift;
    if (c.endNs) *c.endNs += shift;
    if (Status s = w.upsertCollective(c); !s) return s;
  }
  stats.spans += static_cast<int64_t>(p.spans.size());
  stats.collectives += static_cast<int64_t>(p.collectives.size());
  stats.threads += static_cast<int64_t>(p.threads.size());
  stats.ncclKernels += p.ncclKernels;
  stats.pairedByRange += p.pairedByRange;
  stats.kernelTimed += p.kernelTimed;
  return Status::ok();
}

Status writeOutput(std::span<const fs::path> inputs, const fs::path& output, const fs::path& dir,
                   std::vector<LoadedNsys>& loaded, NsysImportStats& stats) {
  int worldSize = 0;
  int64_t epoch = std::numeric_limits<int64_t>::max();
  std::map<std::string, std::set<int>> groups;
  for (const LoadedNsys& l : loaded)
    for (const nsys::ProcessModel& p : l.model.processes) {
      ++worldSize;
      epoch = std::min(epoch, l.file.sessionUtcNs.value_or(0) + p.minNs);
      for (const tracedb::CollectiveRow& c : p.collectives) groups[c.group].insert(p.info.rank);
    }
  if (worldSize == 0)
    return Status::error(inputs.front().string() + (inputs.size() > 1 ? " (and the other inputs)" : "") +
                         ": no CUDA kernels, memory copies, runtime calls or NVTX ranges to import");

  detail::ImportOutput staged(output, dir);
  tracedb::CreateOptions options;
  options.overwrite = true;
  options.runId = runIdFor(inputs);
  options.source = "nsys";
  options.bulkLoad = true;
  auto created = tracedb::Writer::create(staged.temp(), options);
  if (!created) return created.status();
  std::unique_ptr<tracedb::Writer> writer = std::move(*created);
  if (Status s = writer->begin(); !s) return s;
  for (LoadedNsys& l : loaded) {
    std::vector<int64_t> nameIds(l.file.names.size(), -1);
    const int64_t shift = l.file.sessionUtcNs.value_or(0) - epoch;
    for (const nsys::ProcessModel& p : l.model.processes)
      if (Status s = writeProcess(*writer, l, p, shift, nameIds, worldSize, stats); !s) return s;
    for (const auto& [reason, count] : l.model.skipped) stats.skipped[reason] += count;
  }
  for (const auto& [name, ranks] : groups)
    if (Status s = writer->putGroup(tracedb::GroupInfo{name, {ranks.begin(), ranks.end()}, "nccl"}); !s) return s;
  for (auto [key, value] : std::initializer_list<std::pair<std::string_view, std::string>>{
           {tracedb::meta_keys::kEpochUnixNs, std::to_string(epoch)},
           {tracedb::meta_keys::kTool, "tpscope import nsys"},
           {tracedb::meta_keys::kSource, "nsys"},
           {"nsys_inputs", inputsJson(inputs, loaded)},
           {"nsys_import_skipped", skippedJson(stats.skipped)}})
    if (Status s = writer->setMeta(key, value); !s) return s;
  // Every collective timed by its kernel: the ranks' arrivals are their kernels' starts (collectives.h).
  if (stats.collectives > 0 && stats.kernelTimed == stats.collectives)
    if (Status s = writer->setMeta(tracedb::meta_keys::kCollectiveArrival, "device"); !s) return s;
  if (Status s = writer->commit(); !s) return s;
  if (Status s = writer->createIndexes(); !s) return s;
  if (Status s = writer->close(); !s) return s;
  writer.reset();
  if (Status s = staged.moveIntoPlace(); !s) return s;
  stats.ranks = worldSize;
  return Status::ok();
}

}  // namespace

std::string NsysImportStats::summary() const {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f MB", inputBytes / 1e6);
  std::string s = "imported " + std::to_string(ranks) + (ranks == 1 ? " rank" : " ranks") + " from " +
                  std::to_string(files) + (files == 1 ? " nsys export" : " nsys exports") + " (" + buf;
  if (seconds > 0) {
    std::snprintf(buf, sizeof buf, " in %.2f s", seconds);
    s += buf;
  }
  s += "): " + std::to_string(spans) + " spans, " + std::to_string(kernels) + " kernels (" +
       std::to_string(ncclKernels) + " NCCL, " + std::to_string(pairedByRange) + " of them in NVTX collective ranges), " +
       std::to_string(collectives) + " collectives, " + std::to_string(threads) + " threads/streams";
  int64_t total = 0;
  for (const auto& [reason, count] : skipped) total += count;
  if (total > 0) {
    s += "\nnot imported: " + std::to_string(total) + " rows (";
    bool first = true;
    for (const auto& [reason, count] : skipped) {
      s += (first ? "" : "; ") + reason + ": " + std::to_string(count);
      first = false;
    }
    s += ")";
  }
  return s;
}

Result<NsysImportStats> importNsys(std::span<const fs::path> inputs, const fs::path& output) {
  const auto t0 = std::chrono::steady_clock::now();
  const fs::path dir = output.has_parent_path() ? output.parent_path() : fs::path(".");
  if (Status s = checkPaths(inputs, output, dir); !s) return s;
  NsysImportStats stats;
  std::vector<LoadedNsys> loaded;
  loaded.reserve(inputs.size());
  for (const fs::path& input : inputs) {
    auto file = nsys::readNsysFile(input);
    if (!file) return file.status();
    LoadedNsys l;
    l.file = std::move(*file);
    l.model = nsys::buildFileModel(l.file);
    stats.inputBytes += l.file.bytes;
    loaded.push_back(std::move(l));
  }
  if (Status s = assignRanks(inputs, loaded); !s) return s;
  if (Status s = writeOutput(inputs, output, dir, loaded, stats); !s) return s;
  stats.files = static_cast<int>(inputs.size());
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return stats;
}

}  // namespace tpscope::formats
