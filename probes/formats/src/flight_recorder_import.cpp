#include "tpscope/formats/flight_recorder_import.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>

#include "flight_recorder_dump.h"
#include "flight_recorder_model.h"
#include "flight_recorder_value.h"
#include "json_text.h"
#include "import_output.h"
#include "tpscope/tracedb/writer.h"

namespace tpscope::formats {

using tracedb::Result;
using tracedb::Status;
namespace fs = std::filesystem;

namespace {

constexpr uintmax_t kMaxDumpBytes = uintmax_t{1} << 32;  // 4 GiB: far beyond any ring of entries

// The rank at the end of a dump's name, before an optional .json/.pkl/.pickle: "nccl_trace_rank_12" -> 12.
std::optional<int> rankOfDumpName(std::string name) {
  for (const char* ext : {".json", ".pkl", ".pickle"})
    if (name.size() > std::strlen(ext) && name.ends_with(ext)) {
      name.resize(name.size() - std::strlen(ext));
      break;
    }
  size_t k = name.size();
  while (k > 0 && name[k - 1] >= '0' && name[k - 1] <= '9') --k;
  if (k == name.size() || name.size() - k > 7) return std::nullopt;
  return std::stoi(name.substr(k));
}

Result<std::string> readWhole(const fs::path& path) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) return Status::error(path.string() + ": cannot read: " + ec.message());
  if (size > kMaxDumpBytes) return Status::error(path.string() + ": larger than 4 GiB; not a Flight Recorder dump");
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::error(path.string() + ": cannot open");
  std::string bytes(static_cast<size_t>(size), '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(size));
  if (in.gcount() != static_cast<std::streamsize>(size)) return Status::error(path.string() + ": cannot read");
  return bytes;
}

Result<fr::RankDump> loadDump(const fs::path& path, int rank) {
  auto bytes = readWhole(path);
  if (!bytes) return bytes.status();
  const std::string what = path.string();
  if (bytes->empty()) return Status::error(what + ": empty file");
  fr::RankDump out;
  out.rank = rank;
  out.file = path.filename().string();
  Result<fr::ValueTree> tree = Status::error("");
  if (fr::looksLikePickle(*bytes)) {
    out.form = "pickle";
    tree = fr::parsePickle(*bytes, what);
  } else {
    size_t k = 0;
    while (k < bytes->size() && std::isspace(static_cast<unsigned char>((*bytes)[k]))) ++k;
    if (k == bytes->size() || (*bytes)[k] != '{')
      return Status::error(what + ": neither a pickle (protocol 2-5) nor a JSON object: not a Flight Recorder dump");
    out.form = "json";
    tree = fr::parseJson(*bytes, what);
  }
  if (!tree) return tree.status();
  auto dump = fr::readDump(*tree, what);
  if (!dump) return dump.status();
  out.dump = std::move(*dump);
  return out;
}


std::string runIdFor(const std::vector<fr::RankDump>& dumps) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a over the dumps' names and entry counts: same folder, same run id
  auto mix = [&](std::string_view s) {
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  };
  for (const auto& d : dumps) {
    mix(d.file);
    mix(std::to_string(d.dump.entries.size()));
  }
  char buf[40];
  std::snprintf(buf, sizeof buf, "flight_recorder-%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string ranksText(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ",") + std::to_string(r);
  return s;
}

std::string inputsJson(const std::vector<fr::RankDump>& dumps) {
  std::string j = "[";
  for (const auto& d : dumps) {
    if (j.size() > 1) j += ",";
    j += "{\"file\":";
    appendJsonString(j, d.file);
    j += ",\"rank\":" + std::to_string(d.rank) + ",\"form\":\"" + d.form + "\",\"version\":";
    appendJsonString(j, d.dump.version);
    j += ",\"entries\":" + std::to_string(d.dump.entries.size()) + "}";
  }
  return j + "]";
}

Status writeRun(const fs::path& output, const fs::path& outDir, const std::vector<fr::RankDump>& dumps,
                fr::RunModel& model, FlightRecorderImportStats& stats) {
  detail::ImportOutput staged(output, outDir);
  tracedb::CreateOptions options;
  options.overwrite = true;
  options.runId = runIdFor(dumps);
  options.source = "flight_recorder";
  options.bulkLoad = true;
  auto created = tracedb::Writer::create(staged.temp(), options);
  if (!created) return created.status();
  std::unique_ptr<tracedb::Writer> writer = std::move(*created);
  if (Status s = writer->begin(); !s) return s;
  const int64_t epoch = model.minNs;
  for (tracedb::RankInfo r : model.ranks) {
    if (r.startNs) *r.startNs -= epoch;
    if (r.endNs) *r.endNs -= epoch;
    if (Status s = writer->putRank(r); !s) return s;
  }
  for (const auto& t : model.threads)
    if (Status s = writer->putThread(t); !s) return s;
  for (const auto& g : model.groups)
    if (Status s = writer->putGroup(g); !s) return s;
  for (tracedb::CollectiveRow c : model.collectives) {
    c.enqueueNs -= epoch;
    if (c.startNs) *c.startNs -= epoch;
    if (c.endNs) *c.endNs -= epoch;
    if (Status s = writer->upsertCollective(c); !s) return s;
  }
  std::string skipped = "{";
  for (const auto& [reason, count] : stats.skipped) {
    if (skipped.size() > 1) skipped += ",";
    appendJsonString(skipped, reason);
    skipped += ":" + std::to_string(count);
  }
  skipped += "}";
  std::string versions;
  for (const auto& v : stats.versions) versions += (versions.empty() ? "" : ",") + v;
  for (auto [key, value] : std::initializer_list<std::pair<std::string_view, std::string>>{
           {tracedb::meta_keys::kEpochUnixNs, std::to_string(epoch)},
           {tracedb::meta_keys::kTool, "tpscope import flight-recorder"},
           {tracedb::meta_keys::kSource, "flight_recorder"},
           {"flight_recorder_inputs", inputsJson(dumps)},
           {"flight_recorder_versions", versions},
           {"flight_recorder_import_skipped", skipped}})
    if (Status s = writer->setMeta(key, value); !s) return s;
  if (!model.missingRanks.empty())
    if (Status s = writer->setMeta(tracedb::meta_keys::kMissingRankDumps, ranksText(model.missingRanks)); !s)
      return s;
  if (Status s = writer->commit(); !s) return s;
  if (Status s = writer->createIndexes(); !s) return s;
  if (Status s = writer->close(); !s) return s;
  writer.reset();
  if (Status s = staged.moveIntoPlace(); !s) return s;
  return Status::ok();
}

// The dumps in `dir` by rank (names ending in the rank); other files are counted in `skipped`.
Result<std::vector<fr::RankDump>> loadFolder(const fs::path& dir, FlightRecorderImportStats& stats) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return Status::error(dir.string() + ": not a folder of Flight Recorder dumps");
  std::map<int, fs::path> byRank;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_regular_file(ec)) continue;
    const std::string name = e.path().filename().string();
    if (name.starts_with(".")) continue;
    auto rank = rankOfDumpName(name);
    if (!rank) {
      ++stats.skipped["files whose name does not end in a rank"];
      continue;
    }
    auto [it, fresh] = byRank.emplace(*rank, e.path());
    if (!fresh)
      return Status::error(e.path().string() + ": rank " + std::to_string(*rank) + " has a dump already (" +
                           it->second.filename().string() + "); put one form of each rank's dump in the folder");
  }
  if (ec) return Status::error(dir.string() + ": cannot list: " + ec.message());
  if (byRank.empty())
    return Status::error(dir.string() + ": no Flight Recorder dumps (files named <prefix><rank>, e.g. "
                                        "nccl_trace_rank_0, optionally .json or .pkl)");
  std::vector<fr::RankDump> dumps;
  for (const auto& [rank, path] : byRank) {
    auto d = loadDump(path, rank);
    if (!d) return d.status();
    dumps.push_back(std::move(*d));
  }
  return dumps;
}

}  // namespace

std::string FlightRecorderImportStats::summary() const {
  std::string forms_;
  for (const auto& [form, n] : forms) forms_ += (forms_.empty() ? "" : ", ") + form;
  std::string v;
  for (const auto& x : versions) v += (v.empty() ? "" : ", ") + x;
  std::string s = "imported " + std::to_string(ranks.size()) + (ranks.size() == 1 ? " rank" : " ranks") + " from " +
                  std::to_string(files) + " Flight Recorder dump" + (files == 1 ? "" : "s") + " (" + forms_ +
                  ", version " + v + "): " + std::to_string(entries) + " entries -> " + std::to_string(collectives) +
                  " collectives in " + std::to_string(groups) + (groups == 1 ? " group" : " groups");
  if (!missingRanks.empty()) {
    s += "\nmissing dumps: rank";
    s += missingRanks.size() == 1 ? " " : "s ";
    for (size_t i = 0; i < missingRanks.size(); ++i) s += (i ? ", " : "") + std::to_string(missingRanks[i]);
    s += " (below the highest rank named, no file): whether they joined their collectives cannot be decided";
  }
  if (!skipped.empty()) {
    s += "\nnot imported as rows: ";
    bool first = true;
    for (const auto& [reason, count] : skipped) {
      s += (first ? "" : "; ") + reason + ": " + std::to_string(count);
      first = false;
    }
  }
  return s;
}

Result<FlightRecorderImportStats> importFlightRecorder(const fs::path& dir, const fs::path& output) {
  const auto t0 = std::chrono::steady_clock::now();
  FlightRecorderImportStats stats;
  if (output.empty()) return Status::error("import flight-recorder: no output file");
  const fs::path outDir = output.has_parent_path() ? output.parent_path() : fs::path(".");
  std::error_code ec;
  if (!fs::is_directory(outDir, ec))
    return Status::error(output.string() + ": folder " + outDir.string() + " does not exist");
  if (fs::exists(output, ec) && fs::equivalent(output.parent_path().empty() ? "." : output.parent_path(), dir, ec) &&
      rankOfDumpName(output.filename().string()))
    return Status::error(output.string() + ": the output would be read as a dump of the folder; choose another name");
  auto dumps = loadFolder(dir, stats);
  if (!dumps) return dumps.status();
  fr::RunModel model = fr::buildRunModel(*dumps);
  for (const auto& [reason, count] : model.skipped) stats.skipped[reason] += count;
  for (const auto& d : *dumps) {
    stats.ranks.push_back(d.rank);
    ++stats.forms[d.form];
    if (std::find(stats.versions.begin(), stats.versions.end(), d.dump.version) == stats.versions.end())
      stats.versions.push_back(d.dump.version);
    stats.entries += static_cast<int64_t>(d.dump.entries.size());
    for (const auto& [reason, count] : d.dump.skipped) stats.skipped[reason] += count;
  }
  stats.files = static_cast<int>(dumps->size());
  stats.missingRanks = model.missingRanks;
  stats.collectives = static_cast<int64_t>(model.collectives.size());
  stats.groups = static_cast<int64_t>(model.groups.size());
  if (Status s = writeRun(output, outDir, *dumps, model, stats); !s) return s;
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return stats;
}

}  // namespace tpscope::formats
