#include "tpscope/gui/pipeline_model.h"

#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <algorithm>
#include <charconv>
#include <map>
#include <set>
#include <string_view>

#include "tpscope/tracedb/records.h"

namespace tpscope::gui {

namespace {

// "forward mb K" / "backward mb K" [" chunk C"] → (backward, K, C); false for any other name.
bool parsePass(std::string_view name, bool& backward, int& mb, int& chunk) {
  constexpr std::string_view kForward = "forward mb ", kBackward = "backward mb ";
  if (name.substr(0, kForward.size()) == kForward) {
    backward = false;
    name.remove_prefix(kForward.size());
  } else if (name.substr(0, kBackward.size()) == kBackward) {
    backward = true;
    name.remove_prefix(kBackward.size());
  } else {
    return false;
  }
  auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), mb);
  if (ec != std::errc()) return false;
  name.remove_prefix(static_cast<size_t>(end - name.data()));
  chunk = -1;
  constexpr std::string_view kChunk = " chunk ";
  if (name.substr(0, kChunk.size()) == kChunk) {
    name.remove_prefix(kChunk.size());
    std::from_chars(name.data(), name.data() + name.size(), chunk);
  }
  return true;
}

// Every pass span of `rank`, by step.
std::map<int, std::vector<PipelineBlock>> passesOf(const TimelineData& t, int rank) {
  struct Pass {
    bool is = false, backward = false;
    int mb = -1, chunk = -1;
  };
  std::vector<Pass> byName(t.strings().size());  // each name parsed once
  for (size_t id = 0; id < byName.size(); ++id)
    byName[id].is = parsePass(t.strings()[id], byName[id].backward, byName[id].mb, byName[id].chunk);
  std::map<int, std::vector<PipelineBlock>> out;
  for (size_t l = 0; l < t.lanes().size(); ++l) {
    if (t.lanes()[l].rank != rank) continue;
    for (size_t d = 0; d < t.lanes()[l].rows.size(); ++d) {
      const LaneRow& r = t.lanes()[l].rows[d];
      for (size_t i = 0; i < r.size(); ++i) {
        if (r.kind[i] != static_cast<uint8_t>(tracedb::SpanKind::Compute) || r.name[i] >= byName.size() ||
            !byName[r.name[i]].is)
          continue;
        const Pass& pass = byName[r.name[i]];
        PipelineBlock b;
        b.backward = pass.backward;
        b.microbatch = pass.mb;
        b.chunk = pass.chunk;
        b.beginNs = r.begin[i];
        b.endNs = r.end[i];
        b.span = {static_cast<int>(l), static_cast<int>(d), static_cast<uint32_t>(i)};
        out[r.step[i]].push_back(b);
      }
    }
  }
  for (auto& [step, blocks] : out)
    std::sort(blocks.begin(), blocks.end(), [](const auto& a, const auto& b) { return a.beginNs < b.beginNs; });
  return out;
}

int64_t unionNs(const std::vector<PipelineBlock>& blocks) {  // blocks sorted by begin
  int64_t total = 0, end = INT64_MIN;
  for (const auto& b : blocks) {
    const int64_t from = std::max(b.beginNs, end);
    if (b.endNs > from) total += b.endNs - from;
    end = std::max(end, b.endNs);
  }
  return total;
}

}  // namespace

PipelineChart pipelineChart(const RunData& run, int step) {
  PipelineChart chart;
  auto it = run.meta.find(std::string(tracedb::meta_keys::kPipeline));
  if (it == run.meta.end() || !run.timeline) return chart;
  const QJsonObject meta = QJsonDocument::fromJson(QByteArray::fromStdString(it->second)).object();
  chart.schedule = meta.value("schedule").toString().toStdString();
  chart.stages = meta.value("stages").toInt();
  chart.microbatches = meta.value("microbatches").toInt();
  chart.virtualStages = std::max(1, meta.value("virtual_stages").toInt(1));
  const QJsonArray stageOfRank = meta.value("stage_of_rank").toArray();
  if (chart.stages < 2) return chart;
  // Each stage's first rank that has pass spans.
  std::map<int, std::map<int, std::vector<PipelineBlock>>> passes;  // stage → step → blocks
  std::map<int, int> rankOfStage;
  for (int rank : run.rankIds()) {
    if (rank < 0 || rank >= stageOfRank.size()) continue;
    const int stage = stageOfRank[rank].toInt(-1);
    if (stage < 0 || rankOfStage.count(stage)) continue;
    auto p = passesOf(*run.timeline, rank);
    if (p.empty()) continue;
    rankOfStage[stage] = rank;
    passes[stage] = std::move(p);
  }
  std::set<int> steps;
  for (const auto& [stage, bySteps] : passes)
    for (const auto& [s, blocks] : bySteps) steps.insert(s);
  chart.steps.assign(steps.begin(), steps.end());
  if (chart.steps.empty()) return chart;
  chart.step = steps.count(step) ? step : chart.steps[chart.steps.size() / 2];
  chart.beginNs = INT64_MAX;
  chart.endNs = INT64_MIN;
  int64_t longest = -1;
  for (auto& [stage, bySteps] : passes) {
    PipelineRow row;
    row.stage = stage;
    row.rank = rankOfStage[stage];
    if (auto b = bySteps.find(chart.step); b != bySteps.end()) row.blocks = std::move(b->second);
    for (const auto& b : row.blocks) {
      chart.beginNs = std::min(chart.beginNs, b.beginNs);
      chart.endNs = std::max(chart.endNs, b.endNs);
    }
    row.busyNs = unionNs(row.blocks);
    if (row.busyNs > longest) {
      longest = row.busyNs;
      chart.longestStage = stage;
    }
    chart.rows.push_back(std::move(row));
  }
  if (chart.beginNs > chart.endNs) chart.beginNs = chart.endNs = 0;
  return chart;
}

}  // namespace tpscope::gui
