#include "tpscope/rules/replica_vote.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

namespace tpscope::rules {

ReplicaVote voteReplicas(std::span<const int64_t> values, std::span<const int> members) {
  ReplicaVote v;
  std::map<int64_t, int> counts;
  for (int64_t x : values) ++counts[x];
  if (counts.size() <= 1) return v;
  v.agree = false;
  for (const auto& [value, n] : counts)
    if (2 * n > static_cast<int>(values.size())) {
      v.majority = true;
      v.majorityValue = value;
    }
  for (size_t i = 0; i < values.size(); ++i)
    if (!v.majority || values[i] != v.majorityValue) v.suspects.push_back(members[i]);
  return v;
}

size_t fingerprintRowSize(const FingerprintLayout& layout, size_t historySteps) {
  return historySteps * layout.historyTensors.size() + layout.names.size();
}

namespace {

// The first tensor (model order) among `candidates` whose copies on `group` disagree; `at(rank, tensor)` reads one.
template <class At>
std::optional<SdcIncident> firstDisagreement(const std::vector<size_t>& candidates, const std::vector<int>& group,
                                             At at) {
  std::optional<SdcIncident> out;
  for (size_t t : candidates) {
    std::vector<int64_t> values;
    for (int r : group) values.push_back(at(r, t));
    ReplicaVote v = voteReplicas(values, group);
    if (v.agree) continue;
    if (!out) {
      out = SdcIncident{};
      out->tensor = t;
      out->group = group;
      out->vote = std::move(v);
      out->values = std::move(values);
    }
    ++out->tensorsDisagreeing;
  }
  return out;
}

}  // namespace

std::optional<SdcIncident> findSdcIncident(const FingerprintLayout& layout, const std::vector<std::vector<int64_t>>& rows,
                                           const std::vector<int>& historySteps, int checkStep, int lastCheckStep) {
  const size_t width = layout.historyTensors.size();
  std::vector<int> world(layout.worldSize);
  for (int r = 0; r < layout.worldSize; ++r) world[r] = r;
  // Replicated tensors, step by step: the first step where any copy disagrees dates the incident exactly.
  std::vector<size_t> cols(width);
  for (size_t c = 0; c < width; ++c) cols[c] = c;
  for (size_t h = 0; h < historySteps.size(); ++h) {
    auto inc = firstDisagreement(cols, world, [&](int r, size_t c) { return rows[r][h * width + c]; });
    if (!inc) continue;
    inc->tensor = layout.historyTensors[inc->tensor];
    inc->replicatedTensor = true;
    inc->step = inc->earliestStep = historySteps[h];
    inc->checkStep = checkStep;
    return inc;
  }
  // Sharded tensors at the check: within each DP group (the ranks that hold the same TP shard).
  const size_t base = historySteps.size() * width;
  std::vector<size_t> sharded;
  for (size_t t = 0; t < layout.names.size(); ++t)
    if (!layout.replicated[t]) sharded.push_back(t);
  std::optional<SdcIncident> best;
  int tpSize = 0;
  for (int r = 0; r < layout.worldSize; ++r) tpSize = std::max(tpSize, layout.tpRankOf[r] + 1);
  for (int tp = 0; tp < tpSize; ++tp) {
    std::vector<int> group;
    for (int r = 0; r < layout.worldSize; ++r)
      if (layout.tpRankOf[r] == tp) group.push_back(r);
    if (group.size() < 2) continue;
    auto inc = firstDisagreement(sharded, group, [&](int r, size_t t) { return rows[r][base + t]; });
    if (!inc) continue;
    if (best) {
      best->tensorsDisagreeing += inc->tensorsDisagreeing;
      if (inc->tensor >= best->tensor) continue;
      inc->tensorsDisagreeing = best->tensorsDisagreeing;
    }
    best = std::move(inc);
  }
  if (best) {
    best->step = checkStep;
    best->earliestStep = lastCheckStep + 1;
    best->checkStep = checkStep;
  }
  return best;
}

namespace {
std::string rankList(const std::vector<int>& ranks) {
  if (ranks.size() == 1) return fmt::format("rank {}", ranks[0]);
  return fmt::format("ranks {}", fmt::join(ranks, ", "));
}
std::string hex(int64_t v) { return fmt::format("{:016x}", static_cast<uint64_t>(v)); }
}  // namespace

std::string describeSdcIncident(const FingerprintLayout& layout, const SdcIncident& inc) {
  const std::string& name = layout.names[inc.tensor];
  const int layer = layout.layers[inc.tensor];
  const std::string where = layer >= 0 ? fmt::format("{} (layer {})", name, layer) : name;
  const std::string when = inc.earliestStep == inc.step
                               ? fmt::format("at step {}", inc.step)
                               : fmt::format("between steps {} and {}", inc.earliestStep, inc.step);
  const std::string what = inc.replicatedTensor ? "replicated on every rank" : "a DP replica";
  const size_t copies = inc.group.size();
  if (inc.vote.majority)
    return fmt::format("{}'s copy of {} ({}) differs from the {} other{} that agree, {} (found at the check of step {})",
                       rankList(inc.vote.suspects), where, what, copies - inc.vote.suspects.size(),
                       copies - inc.vote.suspects.size() == 1 ? " copy" : " copies", when, inc.checkStep);
  return fmt::format("{} disagree on {} ({}) {}, with no majority among {} copies: each is a suspect (found at the "
                     "check of step {})",
                     rankList(inc.vote.suspects), where, what, when, copies, inc.checkStep);
}

std::string sdcEvidence(const FingerprintLayout& layout, const SdcIncident& inc, std::string_view policy) {
  nlohmann::json fps = nlohmann::json::object();
  for (size_t i = 0; i < inc.group.size(); ++i) fps[std::to_string(inc.group[i])] = hex(inc.values[i]);
  nlohmann::json ev{{"tensor", layout.names[inc.tensor]},
                    {"layer", layout.layers[inc.tensor]},
                    {"replicated", inc.replicatedTensor},
                    {"suspects", inc.vote.suspects},
                    {"majority", inc.vote.majority},
                    {"group", inc.group},
                    {"copies", inc.group.size()},
                    {"first_step", inc.step},
                    {"earliest_step", inc.earliestStep},
                    {"check_step", inc.checkStep},
                    {"tensors_disagreeing", inc.tensorsDisagreeing},
                    {"fingerprints", fps},
                    {"policy", std::string(policy)}};
  if (inc.vote.majority) ev["majority_fingerprint"] = hex(inc.vote.majorityValue);
  return ev.dump();
}

}  // namespace tpscope::rules
