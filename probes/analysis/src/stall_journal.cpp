#include "tpscope/analysis/stall_journal.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>
#include <type_traits>

#include "tpscope/tracedb/rank_file.h"
#include "tpscope/tracedb/reader.h"

namespace tpscope::analysis {

std::filesystem::path stallJournalPath(const std::filesystem::path& dir, int firstRank) {
  if (firstRank < 0) return dir / kStallJournalName;
  return dir / ("stalls-rank" + std::to_string(firstRank) + ".jsonl");
}

std::vector<std::filesystem::path> stallJournalsIn(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> out;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const bool journal = name == kStallJournalName || (name.starts_with("stalls-rank") && name.ends_with(".jsonl"));
    if (journal && it->is_regular_file(ec)) out.push_back(it->path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

tracedb::Status writeStallJournal(const std::filesystem::path& file, std::span<const tracedb::AlertRow> alerts,
                                  int64_t epochUnixNs) {
  std::string text;
  for (const tracedb::AlertRow& a : alerts) {
    nlohmann::json line{{"rank", a.rank},         {"step", a.step},      {"ts_unix_ns", a.tsNs + epochUnixNs},
                        {"severity", a.severity}, {"kind", a.kind},      {"layer", a.layer},
                        {"param", a.param},       {"message", a.message}};
    line["evidence"] = nlohmann::json::parse(a.evidence, nullptr, /*allow_exceptions=*/false);
    if (line["evidence"].is_discarded()) line["evidence"] = nlohmann::json::object();
    text += line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  }
  const std::filesystem::path tmp = file.string() + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return tracedb::Status::error("cannot write " + tmp.string() + ": " + std::strerror(errno));
  const bool written =
      std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0 && ::fsync(fileno(f)) == 0;
  const int err = errno;
  if (std::fclose(f) != 0 || !written) {
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    return tracedb::Status::error("cannot write " + tmp.string() + ": " + std::strerror(written ? errno : err));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, file, ec);
  if (ec) return tracedb::Status::error("cannot replace " + file.string() + ": " + ec.message());
  return tracedb::Status::ok();
}

namespace {
// One journal line as an alert; false when a field is missing or of the wrong type.
bool alertOf(const nlohmann::json& j, int64_t epochUnixNs, tracedb::AlertRow& a) {
  if (!j.is_object()) return false;
  auto integer = [&](const char* key, auto& out) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number_integer()) return false;
    out = it->get<std::remove_reference_t<decltype(out)>>();
    return true;
  };
  auto text = [&](const char* key, std::string& out, bool required) {
    auto it = j.find(key);
    if (it == j.end()) return !required;
    if (!it->is_string()) return false;
    out = it->get<std::string>();
    return true;
  };
  int64_t unixNs = 0;
  if (!integer("rank", a.rank) || !integer("ts_unix_ns", unixNs) || !text("kind", a.kind, true) ||
      !text("severity", a.severity, true) || !text("message", a.message, true) || !text("param", a.param, false))
    return false;
  if (j.contains("step") && !integer("step", a.step)) return false;
  if (j.contains("layer") && !integer("layer", a.layer)) return false;
  a.tsNs = unixNs - epochUnixNs;
  auto ev = j.find("evidence");
  a.evidence = ev != j.end() && ev->is_object() ? ev->dump() : "{}";
  return true;
}
}  // namespace

tracedb::Result<std::vector<tracedb::AlertRow>> readStallJournal(const std::filesystem::path& file,
                                                                 int64_t epochUnixNs) {
  std::ifstream in(file);
  if (!in) return tracedb::Status::error("cannot read " + file.string());
  std::vector<tracedb::AlertRow> out;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    tracedb::AlertRow a;
    if (j.is_discarded() || !alertOf(j, epochUnixNs, a))
      return tracedb::Status::error(file.string() + " line " + std::to_string(n) + ": not a stall journal entry");
    out.push_back(std::move(a));
  }
  return out;
}

tracedb::Result<size_t> addStallJournal(const std::filesystem::path& dir, const std::filesystem::path& run) {
  const std::vector<std::filesystem::path> files = stallJournalsIn(dir);
  if (files.empty()) return size_t{0};
  int64_t epoch = 0;
  {
    auto reader = tracedb::Reader::open(run);
    if (!reader) return reader.status();
    epoch = std::atoll((*reader)->metaValue(tracedb::meta_keys::kEpochUnixNs).value_or("0").c_str());
  }
  std::vector<tracedb::AlertRow> all;
  for (const auto& file : files) {
    auto alerts = readStallJournal(file, epoch);
    if (!alerts) return alerts.status();
    all.insert(all.end(), alerts->begin(), alerts->end());
  }
  if (all.empty()) return size_t{0};
  if (tracedb::Status s = tracedb::addAlerts(run, all); !s) return s;
  return all.size();
}

}  // namespace tpscope::analysis
