#include "tpscope/analysis/run_info.h"

#include "tpscope/analysis/collectives.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <cctype>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "analysis_internal.h"
#include "tpscope/tracedb/merge.h"
#include "tpscope/tracedb/query.h"

namespace tpscope::analysis {

using tracedb::Query;

const tracedb::RankInfo* RunInfo::rank(int r) const {
  auto it = std::lower_bound(ranks.begin(), ranks.end(), r,
                             [](const tracedb::RankInfo& a, int b) { return a.rank < b; });
  return it != ranks.end() && it->rank == r ? &*it : nullptr;
}

const tracedb::GroupInfo* RunInfo::group(const std::string& name) const {
  auto it = std::lower_bound(groups.begin(), groups.end(), name,
                             [](const tracedb::GroupInfo& a, const std::string& b) { return a.name < b; });
  return it != groups.end() && it->name == name ? &*it : nullptr;
}

bool RunInfo::spansStages(const std::string& name) const {
  const tracedb::GroupInfo* g = group(name);
  if (g == nullptr || stageOfRank.empty()) return false;
  int first = -1;
  for (int r : g->ranks) {
    const int s = r >= 0 && r < static_cast<int>(stageOfRank.size()) ? stageOfRank[static_cast<size_t>(r)] : -1;
    if (s < 0) continue;
    if (first < 0) first = s;
    else if (s != first) return true;
  }
  return false;
}

std::string RunInfo::describeRank(int r) const {
  const tracedb::RankInfo* info = rank(r);
  if (!info) return "";
  std::string out;
  auto add = [&](const std::string& part) {
    if (!out.empty()) out += ", ";
    out += part;
  };
  if (info->tpSize > 1) add("tp " + std::to_string(info->tpRank));
  if (info->dpSize > 1) add("dp " + std::to_string(info->dpRank));
  if (!info->host.empty()) add("host " + info->host);
  return out;
}

namespace {
// The items of a comma-separated meta value ("2,3"); none for an absent or empty one.
std::vector<std::string> commaList(const std::optional<std::string>& value) {
  std::vector<std::string> out;
  if (!value) return out;
  std::string_view rest = *value;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    if (comma != 0) out.emplace_back(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
  }
  return out;
}

std::optional<ModelConfig> parseModel(const std::string& text) {
  const auto json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object()) return std::nullopt;
  ModelConfig m;
  bool any = false;
  auto num = [&](const char* key, auto& out) {
    auto it = json.find(key);
    if (it != json.end() && it->is_number()) {
      out = it->template get<std::remove_reference_t<decltype(out)>>();
      any = true;
    }
  };
  num("layers", m.layers);
  num("hidden", m.hidden);
  num("seq_len", m.seqLen);
  num("micro_batch_size", m.microBatchSize);
  // tpscope-train writes "grad_accum"; other engines' names are accepted too.
  num("grad_accum", m.gradAccumSteps);
  num("grad_accum_steps", m.gradAccumSteps);
  num("gradient_accumulation_steps", m.gradAccumSteps);
  auto flag = [&](const char* key, bool& out) {
    if (auto it = json.find(key); it != json.end() && it->is_boolean()) out = *it;
  };
  flag("sequence_parallel", m.sequenceParallel);
  flag("activation_checkpointing", m.activationCheckpointing);
  if (auto it = json.find("vocab_size"); it != json.end() && it->is_number() && it->get<double>() > 0)
    m.vocabParallel = true;
  if (m.gradAccumSteps < 1) m.gradAccumSteps = 1;
  return any ? std::optional<ModelConfig>(m) : std::nullopt;
}

// The mesh dimensions that shard some parameter, from meta param_placements: each value lists "dim:placement"
// tokens; Shard is "S(d)", FSDP2's strided shard "_S(d, k)". Replicate ("R") and Partial ("P(sum)") are not shards.
std::set<std::string> shardedMeshDims(const std::string& text) {
  std::set<std::string> dims;
  if (text.empty()) return dims;
  const auto json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object()) return dims;
  for (const auto& [param, placement] : json.items()) {
    if (!placement.is_string()) continue;
    std::istringstream tokens(placement.get<std::string>());
    std::string token;
    while (tokens >> token) {
      const size_t colon = token.find(':');
      if (colon == std::string::npos || colon == 0) continue;
      const std::string_view what = std::string_view(token).substr(colon + 1);
      if (what.starts_with("S(") || what.starts_with("_S(")) dims.insert(token.substr(0, colon));
    }
  }
  return dims;
}

// Host CPU counts and emulated collectives from the meta table.
void readMeta(tracedb::Reader& reader, RunInfo& info) {
  if (auto meta = reader.meta()) {
    const std::string_view prefix = tracedb::meta_keys::kHostCpusPrefix;
    for (const auto& [key, value] : *meta)
      if (std::string_view(key).starts_with(prefix)) {
        const int cpus = std::atoi(value.c_str());
        if (cpus > 0) info.hostCpus[key.substr(prefix.size())] = cpus;
      }
  }
  for (const std::string& r : commaList(reader.metaValue(tracedb::meta_keys::kMissingRankDumps)))
    if (const int rank = std::atoi(r.c_str()); rank >= 0) info.missingRankDumps.push_back(rank);
  info.seqByOrder = commaList(reader.metaValue(tracedb::meta_keys::kSeqByOrder));
  info.deviceArrival = reader.metaValue(tracedb::meta_keys::kCollectiveArrival).value_or("") == "device";
  info.gradShardDims = shardedMeshDims(reader.metaValue(tracedb::meta_keys::kParamPlacements).value_or(""));
  for (const std::string& item : commaList(reader.metaValue("emulated_ops")))
    if (const size_t eq = item.find('='); eq != std::string::npos)
      info.emulatedOps[canonicalOpName(std::string_view(item).substr(0, eq))] =
          canonicalOpName(std::string_view(item).substr(eq + 1));
}

// The steps of loadRunInfo after the ranks and groups tables: ranks and groups that only appear in records, each
// rank's span extent, and the run's time extent.
class RunInfoLoader {
 public:
  RunInfoLoader(tracedb::Reader& reader, RunInfo& info) : reader_(reader), info_(info) {
    for (const auto& r : info_.ranks) known_.insert(r.rank);
  }

  // Groups and ranks seen in the collectives, by a plain scan (DISTINCT would sort); the collectives' time extent.
  tracedb::Status scanCollectives() {
    Query q(reader_, "SELECT group_name, rank, enqueue_ns, coalesce(end_ns, start_ns, enqueue_ns) FROM collectives",
            "table 'collectives'");
    auto s = q.each([&](Query& row) { addCollective(row.view(0), row.i32(1), row.i64(2), row.i64(3)); });
    if (!s) return s;
    addSeenRanks();
    return tracedb::Status::ok();
  }

  // The same from the collectives already loaded (diagnose and report load them anyway): no second scan.
  void takeCollectives(const detail::CollectiveTable& table) {
    for (const detail::CollectiveRecord& c : table.rows)
      addCollective(table.str(c.group), c.rank, c.enqueueNs, c.lastNs());
    addSeenRanks();
  }

  tracedb::Status scanStepStatRanks() {
    Query q(reader_, "SELECT DISTINCT rank FROM step_stats", "table 'step_stats'");
    return q.each([&](Query& row) { addRank(row.i32(0)); });
  }

  // Each rank's span extent: through the index when there is one, else one plain scan.
  tracedb::Status readSpanExtents() {
    info_.indexed = reader_.hasIndex("spans_rank_begin");
    std::map<int, RankExtent> extents;
    auto s = info_.indexed ? spanExtentsByIndex(extents) : spanExtentsByScan(extents);
    if (!s) return s;
    for (const auto& [r, ext] : extents) info_.spanExtents.push_back(ext);
    std::sort(info_.ranks.begin(), info_.ranks.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
    return tracedb::Status::ok();
  }

  // Groups seen only in the collectives join the groups table's; a listed group without members gets the seen ones.
  void mergeSeenGroups() {
    for (auto& [name, members] : seen_) {
      auto it = std::find_if(info_.groups.begin(), info_.groups.end(), [&](const auto& g) { return g.name == name; });
      if (it == info_.groups.end()) {
        info_.groups.push_back(tracedb::GroupInfo{name, std::vector<int>(members.begin(), members.end()), ""});
      } else if (it->ranks.empty()) {
        it->ranks.assign(members.begin(), members.end());
      }
    }
    std::sort(info_.groups.begin(), info_.groups.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  }

  // The run's time extent over spans, collectives and step windows.
  tracedb::Status timeExtent() {
    bool any = false;
    auto take = [&](int64_t b, int64_t e) {
      info_.beginNs = any ? std::min(info_.beginNs, b) : b;
      info_.endNs = any ? std::max(info_.endNs, e) : e;
      any = true;
    };
    for (const RankExtent& e : info_.spanExtents) take(e.firstNs, e.lastNs);
    if (collFirst_ <= collLast_) take(collFirst_, collLast_);
    Query q(reader_, "SELECT min(begin_ns), max(end_ns) FROM step_stats", "table 'step_stats'");
    return q.each([&](Query& row) {
      if (!row.isNull(0)) take(row.i64(0), row.i64(1));
    });
  }

 private:
  // One collective record; `lastNs` is its latest time (CollectiveRecord::lastNs). Records mostly come in runs
  // of one group and one rank: the group's set is looked up and the rank inserted only when they change.
  void addCollective(std::string_view group, int rank, int64_t enqueueNs, int64_t lastNs) {
    if (members_ == nullptr || group != lastGroup_) {
      lastGroup_.assign(group);
      members_ = &seen_[lastGroup_];
      lastRank_ = INT32_MIN;
    }
    if (rank != lastRank_) {
      members_->insert(rank);
      lastRank_ = rank;
    }
    collFirst_ = std::min(collFirst_, enqueueNs);
    collLast_ = std::max(collLast_, lastNs);
  }

  void addSeenRanks() {
    for (const auto& [g, m] : seen_)
      for (int r : m) addRank(r);
  }

  void addRank(int r) {
    if (known_.insert(r).second) {
      tracedb::RankInfo ri;
      ri.rank = r;
      info_.ranks.push_back(ri);
    }
  }

  // Distinct ranks of spans through the index: one probe per rank (skip-scan by hand), then its extent.
  tracedb::Status spanExtentsByIndex(std::map<int, RankExtent>& extents) {
    int64_t next = INT64_MIN;
    for (;;) {
      Query q(reader_, "SELECT rank, begin_ns FROM spans WHERE rank >= ? ORDER BY rank, begin_ns LIMIT 1",
              "table 'spans'");
      q.bind(1, next);
      std::optional<int> found;
      int64_t first = 0;
      if (auto s = q.each([&](Query& row) {
            found = row.i32(0);
            first = row.i64(1);
          });
          !s)
        return s;
      if (!found) break;
      addRank(*found);
      RankExtent& e = extents[*found];
      e.rank = *found;
      e.firstNs = e.lastNs = first;
      // The newest kEndSpans: a diagnosis file keeps just these and the first (tracedb/merge.h).
      Query last(reader_,
                 "SELECT begin_ns + dur_ns, step FROM spans WHERE rank = ? ORDER BY begin_ns DESC LIMIT " +
                     std::to_string(tracedb::kEndSpans),
                 "table 'spans'");
      last.bind(1, int64_t{*found});
      if (auto s = last.each([&](Query& row) {
            e.lastNs = std::max(e.lastNs, row.i64(0));
            e.lastStep = std::max(e.lastStep, row.i32(1));
          });
          !s)
        return s;
      next = int64_t{*found} + 1;
    }
    return tracedb::Status::ok();
  }

  // One plain scan (DISTINCT or GROUP BY would sort the whole table).
  tracedb::Status spanExtentsByScan(std::map<int, RankExtent>& extents) {
    Query q(reader_, "SELECT rank, begin_ns, dur_ns, step FROM spans", "table 'spans'");
    int lastRank = INT32_MIN;
    RankExtent* e = nullptr;
    auto s = q.each([&](Query& row) {
      const int r = row.i32(0);
      const int64_t b = row.i64(1), end = b + row.i64(2);
      if (e == nullptr || r != lastRank) {
        auto [it, fresh] = extents.try_emplace(r, RankExtent{r, b, end, -1});
        e = &it->second;
        lastRank = r;
      }
      e->firstNs = std::min(e->firstNs, b);
      e->lastNs = std::max(e->lastNs, end);
      e->lastStep = std::max(e->lastStep, row.i32(3));
    });
    if (!s) return s;
    for (const auto& [r, ext] : extents) addRank(r);
    return tracedb::Status::ok();
  }

  tracedb::Reader& reader_;
  RunInfo& info_;
  std::set<int> known_;
  std::map<std::string, std::set<int>> seen_;  // group → ranks seen in its collectives
  std::string lastGroup_;                      // addCollective's current run of records
  std::set<int>* members_ = nullptr;
  int lastRank_ = INT32_MIN;
  int64_t collFirst_ = INT64_MAX, collLast_ = INT64_MIN;
};

}  // namespace

namespace {

// loadRunInfo, with the collectives' part from `table` where given, else from a scan of the file.
tracedb::Result<RunInfo> loadRunInfoFrom(tracedb::Reader& reader, const detail::CollectiveTable* table) {
  RunInfo info;
  auto ranks = reader.ranks();
  if (!ranks) return ranks.status();
  info.ranks = std::move(*ranks);
  readMeta(reader, info);
  auto groups = reader.groups();
  if (!groups) return groups.status();
  info.groups = std::move(*groups);

  RunInfoLoader load(reader, info);
  if (table) load.takeCollectives(*table);
  else if (auto s = load.scanCollectives(); !s) return s;
  if (auto s = load.scanStepStatRanks(); !s) return s;
  if (auto s = load.readSpanExtents(); !s) return s;
  load.mergeSeenGroups();
  if (auto s = load.timeExtent(); !s) return s;
  if (auto config = reader.metaValue(tracedb::meta_keys::kConfig)) info.model = parseModel(*config);
  if (auto pipeline = detail::readPipelineLayout(reader)) info.stageOfRank = std::move(pipeline->stageOfRank);
  return info;
}

}  // namespace

std::optional<detail::PipelineLayout> detail::readPipelineLayout(tracedb::Reader& reader) {
  const auto text = reader.metaValue(tracedb::meta_keys::kPipeline);
  if (!text) return std::nullopt;
  const auto json = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object()) return std::nullopt;
  auto integer = [&](const char* key, int otherwise) {
    const auto it = json.find(key);
    return it != json.end() && it->is_number_integer() ? it->get<int>() : otherwise;
  };
  PipelineLayout layout;
  if (auto it = json.find("schedule"); it != json.end() && it->is_string()) layout.schedule = it->get<std::string>();
  layout.stages = integer("stages", 0);
  layout.microbatches = integer("microbatches", 0);
  layout.virtualStages = integer("virtual_stages", 1);
  if (auto it = json.find("stage_of_rank"); it != json.end() && it->is_array())
    for (const auto& stage : *it) layout.stageOfRank.push_back(stage.is_number_integer() ? stage.get<int>() : -1);
  return layout;
}

tracedb::Result<RunInfo> loadRunInfo(tracedb::Reader& reader) { return loadRunInfoFrom(reader, nullptr); }

tracedb::Result<RunInfo> detail::loadRunInfo(tracedb::Reader& reader, const CollectiveTable& table) {
  return loadRunInfoFrom(reader, &table);
}

std::string formatRanks(std::vector<int> ranks) {
  if (ranks.empty()) return "none";
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += std::to_string(ranks[i]);
    if (j > i + 1) out += "–" + std::to_string(ranks[j]);
    else if (j == i + 1) out += ", " + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

std::string rankList(const std::vector<int>& ranks) {
  std::vector<int> u = ranks;
  std::sort(u.begin(), u.end());
  u.erase(std::unique(u.begin(), u.end()), u.end());
  return (u.size() == 1 ? "rank " : "ranks ") + formatRanks(u);
}

std::string groupClass(const std::string& group) {
  const auto dash = group.rfind('-');
  if (dash == std::string::npos || dash + 1 == group.size()) return group;
  for (size_t i = dash + 1; i < group.size(); ++i)
    if (!std::isdigit(static_cast<unsigned char>(group[i]))) return group;
  return group.substr(0, dash);
}

namespace {
// Ranks on `host` and its CPUs (CPUs 0 when unknown).
std::pair<int, int> ranksAndCpus(const RunInfo& info, const std::string& host) {
  auto it = info.hostCpus.find(host);
  if (it == info.hostCpus.end()) return {0, 0};
  int ranksHere = 0;
  for (const auto& r : info.ranks) ranksHere += r.host == host ? 1 : 0;
  return {ranksHere, it->second};
}
}  // namespace

bool RunInfo::oversubscribed(const std::string& host) const {
  const auto [ranksHere, cpus] = ranksAndCpus(*this, host);
  return cpus > 0 && ranksHere > cpus;
}

bool RunInfo::cpusFull(const std::string& host) const {
  const auto [ranksHere, cpus] = ranksAndCpus(*this, host);
  return cpus > 0 && ranksHere >= cpus;
}

}  // namespace tpscope::analysis
