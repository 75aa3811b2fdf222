#include "tpscope/analysis/anomalies.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>

#include "evidence_util.h"
#include "tpscope/vocabulary/spike_baseline.h"
#include "tpscope/tracedb/query.h"

namespace tpscope::analysis {

using tracedb::Query;

namespace {

using vocabulary::medianOf;

// Spikes in one series of (step, value) in step order: the causal test of vocabulary/spike_baseline.h, confirmed by the
// analysis' forward-looking check (transience). A confirmed spike does not enter the window; anything else usable does.
template <class Emit>
void findSpikes(const std::vector<std::pair<int, double>>& series, const AnomalyOptions& o, vocabulary::SpikeScale scale,
                Emit&& emit) {
  vocabulary::SpikeWindow window(o.window, scale);
  vocabulary::SpikeTest test;
  test.ratio = o.ratioThreshold;
  test.zMin = o.zThreshold;
  test.minHistory = o.minHistory;
  test.minSigmaDecades = o.minSigmaDecades;
  // A spike is transient: where later steps exist, the median of the next (up to) transientSteps values must fall
  // back by the same ratio. A jump that stays is a level shift (layer trends show it), not a spike.
  auto fallsBack = [&](size_t i, double x) {
    std::vector<double> next;
    for (size_t j = i + 1; j < series.size() && static_cast<int>(next.size()) < o.transientSteps; ++j)
      if (window.usable(series[j].second)) next.push_back(series[j].second);
    return next.empty() || x >= o.ratioThreshold * medianOf(std::move(next));
  };
  for (size_t i = 0; i < series.size(); ++i) {
    const auto [step, x] = series[i];
    const vocabulary::SpikeVerdict v = window.test(step, x, test);
    if (v.spike && fallsBack(i, x)) {
      emit(step, x, v.median, v.mad, v.z);
      continue;
    }
    window.add(x, step);
  }
}

using Series = std::vector<std::pair<int, double>>;  // (step, value) in step order

// The finite gradient statistics, per series and per layer.
struct GradSeries {
  std::map<std::pair<int, int64_t>, Series> byParam;      // (rank, param id) → norms
  std::map<int64_t, std::pair<std::string, int>> params;  // id → name, layer
  std::map<int, std::map<int, std::vector<double>>> layerNorms;  // layer → step → norms
  std::map<std::pair<int, int>, double> rankStepSq;              // (rank, step) → Σ l2² over its parameters
  // Pipeline runs: a rank holds one stage, its total is a part of the model's; the whole model's norm by (rank,
  // step), from step_stats.grad_norm (the clip's, over every stage). Empty otherwise.
  std::map<std::pair<int, int>, double> wholeNorm;
  Series loss;  // the run's loss per step (the mean over the ranks that recorded it), in step order
  std::map<int, std::vector<int>> tpPeers;  // rank → the other ranks of its TP group (they saw the same batch)
  // Under sequence parallelism instead: rank → the other ranks of its TP group, which saw the same batch in their
  // sharded parameters only (aPeerSharesTheJump).
  std::map<int, std::vector<int>> seqPeers;
};


tracedb::Result<GradSeries> readGradSeries(tracedb::Reader& reader) {
  GradSeries g;
  Query q(reader, "SELECT rank, param, step, l2_norm, layer FROM grad_stats WHERE nan_count = 0 AND inf_count = 0",
          "table 'grad_stats'");
  // Rows come a (rank, step) at a time, its parameters in turn: the current (rank, step)'s sum and each layer's
  // current step are kept at hand, so most rows look up no map but their series.
  std::pair<int, int> sqKey{INT32_MIN, INT32_MIN};
  double* sq = nullptr;
  std::map<int, std::pair<int, std::vector<double>*>> layerStep;  // layer → its current step and that step's norms
  auto s = q.each([&](Query& r) {
    const int rank = r.i32(0);
    const int64_t param = r.i64(1);
    const int step = r.i32(2);
    const double norm = r.f64(3);
    const int layer = r.i32(4);
    g.byParam[{rank, param}].emplace_back(step, norm);
    if (std::isfinite(norm)) {
      if (sq == nullptr || sqKey != std::pair{rank, step}) {
        sqKey = {rank, step};
        sq = &g.rankStepSq[sqKey];
      }
      *sq += norm * norm;
    }
    g.params.try_emplace(param, std::string(), layer);
    if (layer >= 0 && std::isfinite(norm) && norm > 0) {
      auto& [current, norms] = layerStep.try_emplace(layer, step, nullptr).first->second;
      if (norms == nullptr || current != step) {
        current = step;
        norms = &g.layerNorms[layer][step];
      }
      norms->push_back(norm);
    }
  });
  if (!s) return s;
  for (auto& [id, p] : g.params) p.first = reader.string(static_cast<uint32_t>(id));
  // Rows come in file order (usually step by step); each series must be in step order.
  for (auto& [key, v] : g.byParam)
    if (!std::is_sorted(v.begin(), v.end())) std::sort(v.begin(), v.end());
  return g;
}

// What a value is compared with: the median of the previous values (their level), or their largest (their range).
enum class Against { Median, Max };

// Whether `x` is ≥ ratio × the median or the largest of `before` (true without a history).
bool risesAbove(double x, std::vector<double> before, double ratio, Against against) {
  if (before.empty()) return true;
  const double base = against == Against::Median ? medianOf(std::move(before))
                                                 : *std::max_element(before.begin(), before.end());
  return x >= ratio * base;
}

// The same for the value of (rank, step) in `byRankStep` against the rank's previous `window` steps (true without a
// value). `transform` maps a stored value to the compared one.
template <class Transform>
bool risesAbove(const std::map<std::pair<int, int>, double>& byRankStep, int rank, int step, int window, double ratio,
                Against against, Transform&& transform) {
  std::vector<double> before;
  for (auto it = byRankStep.lower_bound({rank, step - window});
       it != byRankStep.end() && it->first.first == rank && it->first.second < step; ++it)
    before.push_back(transform(it->second));
  const auto now = byRankStep.find({rank, step});
  return now == byRankStep.end() || risesAbove(transform(now->second), std::move(before), ratio, against);
}

// The rank's total norm (√Σ l2² over its parameters) at `step` over its median over the previous `window` steps; 0
// without a value or a history.
// A rank's total norm at one step (the entry `at` of rankStepSq) and the median of its previous `window` steps.
struct RankTotal {
  double norm = 0, median = 0;  // median 0: no history
  int history = 0;              // previous steps it was taken over
};
RankTotal rankTotal(const GradSeries& g, std::map<std::pair<int, int>, double>::const_iterator at, int window) {
  const auto [rank, step] = at->first;
  std::vector<double> before;
  for (auto it = g.rankStepSq.lower_bound({rank, step - window}); it != at; ++it) before.push_back(std::sqrt(it->second));
  RankTotal t;
  t.norm = std::sqrt(at->second);
  t.history = static_cast<int>(before.size());
  t.median = before.empty() ? 0.0 : medianOf(std::move(before));
  return t;
}

double totalRatio(const GradSeries& g, int rank, int step, int window) {
  const auto now = g.rankStepSq.find({rank, step});
  if (now == g.rankStepSq.end()) return 0;
  const RankTotal t = rankTotal(g, now, window);
  return t.median > 0 ? t.norm / t.median : 0.0;
}

// A harder batch than the recent ones: the run's loss at `step` exceeds the largest of the `window` steps before it,
// or it stands kHardBatchRise above the median of the kRecentSteps before it (in a short run the window still holds
// the first steps' losses, above any later batch: a healthy run's loss rose 3.10 → 4.56 with its gradient's 68× jump
// at step 20, under step 1's 5.5). Its gradient jumps with it; an injected or corrupted gradient leaves the loss as
// it was.
constexpr int kRecentSteps = 5;
constexpr double kHardBatchRise = 1.25;
bool hardBatch(const Series& loss, int step, int window) {
  std::vector<double> before, recent;
  double now = NAN;
  for (const auto& [s, v] : loss) {
    if (s >= step - window && s < step) before.push_back(v);
    if (s >= step - kRecentSteps && s < step) recent.push_back(v);
    if (s == step) now = v;
  }
  if (!std::isfinite(now) || before.empty()) return false;
  return now > *std::max_element(before.begin(), before.end()) ||
         (recent.size() >= 3 && now >= kHardBatchRise * vocabulary::medianOf(std::move(recent)));
}

// A parameter's norm at `step` on `rank` over its median over the previous `window` steps; 0 without a value or a
// history.
double paramJump(const GradSeries& g, int rank, int64_t param, int step, int window) {
  const auto it = g.byParam.find({rank, param});
  if (it == g.byParam.end()) return 0;
  const Series& s = it->second;
  const auto now = std::lower_bound(s.begin(), s.end(), std::pair{step, -HUGE_VAL});
  if (now == s.end() || now->first != step) return 0;
  std::vector<double> before;
  for (auto b = std::lower_bound(s.begin(), now, std::pair{step - window, -HUGE_VAL}); b != now; ++b)
    before.push_back(b->second);
  const double median = before.empty() ? 0.0 : medianOf(std::move(before));
  return median > 0 ? now->second / median : 0.0;
}

// Under sequence parallelism a TP peer computes its sharded parameters' gradients (the column- and row-parallel
// weights) on the same gathered sequence, while the layer norms, the row-parallel biases and the positions see its
// own part. A batch that moves one rank's sharded gradient moves its peer's in the same parameter by a like factor (a
// healthy TP2 × PP2 run, step 34: attention.qkv.weight 1434× on rank 0 and 1066× on rank 1, mlp.fc1.weight 186× and
// 182×, while its layer norms went 2500× and 3×); a fault on one rank's gradients moves its own alone. The first
// parameter that jumped ≥ normRatioThreshold× on `rank` and on a peer, within a factor of normRatioThreshold of each
// other, told as the finding's line; "" where there is none.
std::string aPeerSharesTheJump(const GradSeries& g, int rank, int step, const AnomalyOptions& options) {
  const auto peers = g.seqPeers.find(rank);
  if (peers == g.seqPeers.end()) return {};
  const double ratio = options.normRatioThreshold;
  for (auto it = g.byParam.lower_bound({rank, INT64_MIN}); it != g.byParam.end() && it->first.first == rank; ++it) {
    const auto& key = it->first;
    const double own = paramJump(g, rank, key.second, step, options.window);
    if (own < ratio) continue;
    for (int p : peers->second) {
      const double peer = paramJump(g, p, key.second, step, options.window);
      if (peer >= ratio && peer * ratio >= own)
        return "the batch's: " + g.params.at(key.second).first + " jumped " + detail::threeDigits(own) + "× here and " +
               detail::threeDigits(peer) + "× on TP peer rank " + std::to_string(p) +
               ", which computes it on the same sequence (sequence parallelism)";
    }
  }
  return {};
}

// Material: the spike moves the update beyond what the run's own batches do. Three parts, each a thing healthy runs
// showed otherwise (docs/diagnosis.md, "Gradient and loss anomalies"):
//   1. the rank's total norm at that step is ≥ normRatioThreshold × its median over the previous steps: a spike in a
//      tiny parameter does not move the rank's gradient;
//   2. the whole model's norm (step_stats.grad_norm: the clip's, after reduction over every TP/DP/PP rank — what the
//      update is made of) is ≥ normRatioThreshold × the largest it reached over the previous window: a rank's total
//      is a part of the model's — one DP replica's batch, one pipeline stage (stage 0's is mostly the embedding's,
//      whose rows spike with a batch's rare tokens) — which the reduction may average away;
//   3. the batch does not explain it: where the rank has TP peers that computed on the same batch (no sequence
//      parallelism: see analyzeAnomalies), its total's jump is ≥ normRatioThreshold × each peer's — a batch moves
//      every peer's gradient; where it has none (DP or PP without TP: a stage's rare-token batch moves that stage
//      alone), nothing but size tells a hard batch from a fault: the run's loss that step is no higher than the
//      recent ones (hardBatch: a harder batch than any recent one makes its own gradient jump, and its loss with
//      it), and the whole model's norm is at least vocabulary::kRunRangeRatio × the largest it reached anywhere
//      before in the run — an order of magnitude past its own range (healthy hard batches reached 2.5–8.7× of it; an
//      injected spike 1000×). Under sequence parallelism the peers are evidence in their sharded parameters alone: a
//      peer whose same parameter jumped with the rank's tells the batch (aPeerSharesTheJump, its line in `why`);
//      without one the test without peers decides.
// Without step_stats parts 1 and 3's peer test decide.
bool material(const GradSeries& g, int rank, int step, const AnomalyOptions& options, std::string& why) {
  const double ratio = options.normRatioThreshold;
  const double own = totalRatio(g, rank, step, options.window);
  if (own > 0 && own < ratio) return false;
  if (!risesAbove(g.wholeNorm, rank, step, options.window, ratio, Against::Max, [](double x) { return x; }))
    return false;
  const auto peers = g.tpPeers.find(rank);
  if (peers == g.tpPeers.end()) {
    why = aPeerSharesTheJump(g, rank, step, options);
    if (!why.empty()) return false;
    return !hardBatch(g.loss, step, options.window) &&
           risesAbove(g.wholeNorm, rank, step, step + 1, vocabulary::kRunRangeRatio, Against::Max, [](double x) { return x; });
  }
  for (int p : peers->second)
    if (own < ratio * totalRatio(g, p, step, options.window)) return false;
  return true;
}

// Per-parameter spikes. One parameter's norm swings several-fold in a healthy run (warm-up, early steps): flag an
// order of magnitude, after more history.
void paramSpikes(const GradSeries& g, const AnomalyOptions& options, AnomalyReport& out) {
  AnomalyOptions perParam = options;
  perParam.minHistory = std::max(options.minHistory, options.paramMinHistory);
  perParam.ratioThreshold = std::max(options.ratioThreshold, options.paramRatioThreshold);
  // Materiality is the rank's at the step, whichever of its parameters spiked: judged once per (rank, step).
  std::map<std::pair<int, int>, std::pair<bool, std::string>> judged;
  for (const auto& [key, s] : g.byParam) {
    const auto& [name, layer] = g.params.at(key.second);
    findSpikes(s, perParam, vocabulary::SpikeScale::Norm, [&](int step, double x, double m, double mad, double z) {
      Spike sp{key.first, step, layer, name, x, m, mad, z};
      auto [it, fresh] = judged.try_emplace({key.first, step});
      if (fresh) it->second.first = material(g, key.first, step, options, it->second.second);
      sp.material = it->second.first;
      sp.explained = it->second.second;
      out.gradSpikes.push_back(std::move(sp));
    });
  }
}

// The mean over the ranks of each step's values: one run-wide series.
Series meanPerStep(const std::map<int, std::vector<double>>& byStep) {
  Series out;
  for (const auto& [step, v] : byStep) {
    double sum = 0;
    for (double x : v) sum += x;
    out.emplace_back(step, sum / static_cast<double>(v.size()));
  }
  return out;
}

// Values that must agree across ranks do not: relative spread (max − min) / max above the tolerance.
void addDivergence(int step, const std::string& what, int tpRank, const std::vector<std::pair<int, double>>& v,
                   const AnomalyOptions& options, AnomalyReport& out) {
  if (v.size() < 2) return;
  auto [lo, hi] = std::minmax_element(v.begin(), v.end(), [](auto& a, auto& b) { return a.second < b.second; });
  const double denom = std::max(std::fabs(hi->second), std::fabs(lo->second));
  if (denom <= 0) return;
  const double rel = (hi->second - lo->second) / denom;
  if (rel <= options.divergenceTolerance) return;
  Divergence d;
  d.step = step;
  d.what = what;
  d.tpRank = tpRank;
  for (auto& [r, x] : v) d.ranks.push_back(r);
  d.minValue = lo->second;
  d.maxValue = hi->second;
  d.minRank = lo->first;
  d.maxRank = hi->first;
  d.relSpread = rel;
  out.divergences.push_back(std::move(d));
}

// Step stats: the run-wide global grad norm and loss spikes, and the agreement of the post-reduction grad norm.
void stepStatAnomalies(const std::vector<tracedb::StepStatRow>& stats, const AnomalyOptions& options,
                       AnomalyReport& out) {
  std::map<int, std::vector<double>> losses, norms;
  std::map<int, std::vector<std::pair<int, double>>> normsByStep;  // step → (rank, norm)
  for (const auto& st : stats) {
    if (st.gradNorm && std::isfinite(*st.gradNorm)) {
      normsByStep[st.step].emplace_back(st.rank, *st.gradNorm);
      norms[st.step].push_back(*st.gradNorm);
    }
    if (st.loss && std::isfinite(*st.loss)) losses[st.step].push_back(*st.loss);
  }
  // The global norm is the same on every rank (it is taken after reduction): one run-wide series, the mean.
  AnomalyOptions globalNorm = options;
  globalNorm.ratioThreshold = std::max(options.ratioThreshold, options.normRatioThreshold);
  const Series global = meanPerStep(norms), loss = meanPerStep(losses);
  findSpikes(global, globalNorm, vocabulary::SpikeScale::Norm, [&](int step, double x, double m, double mad, double z) {
    Spike sp{-1, step, -1, "", x, m, mad, z};
    // Material as a rank's spike without TP peers (material() above): beyond the largest norm of the previous
    // window, not a harder batch than any of them, an order of magnitude past the run's range.
    std::vector<double> before, earlier;  // its window; the whole run before it (no peers: material(), part 3)
    for (const auto& [s, v] : global) {
      if (s >= step) break;  // step order
      earlier.push_back(v);
      if (s >= step - options.window) before.push_back(v);
    }
    sp.material = risesAbove(x, std::move(before), options.normRatioThreshold, Against::Max) &&
                  !hardBatch(loss, step, options.window) &&
                  risesAbove(x, std::move(earlier), vocabulary::kRunRangeRatio, Against::Max);
    out.gradSpikes.push_back(std::move(sp));
  });
  findSpikes(loss, options, vocabulary::SpikeScale::Level,
             [&](int step, double x, double m, double mad, double z) {
               out.lossSpikes.push_back(Spike{-1, step, -1, "", x, m, mad, z});
             });
  for (const auto& [step, v] : normsByStep) addDivergence(step, "grad_norm", -1, v, options, out);
}

// With meta 'grad_stats_after_reduction' = "1": per (step, tp_rank, param) the DP replicas' norms must agree.
void replicaDivergences(const GradSeries& g, const RunInfo& info, const AnomalyOptions& options, AnomalyReport& out) {
  std::map<std::tuple<int, int, int64_t>, std::vector<std::pair<int, double>>> replicas;
  for (const auto& [key, s] : g.byParam) {
    const auto* ri = info.rank(key.first);
    const int tp = ri ? ri->tpRank : 0;
    for (const auto& [step, norm] : s) replicas[{step, tp, key.second}].emplace_back(key.first, norm);
  }
  for (const auto& [key, v] : replicas)
    addDivergence(std::get<0>(key), g.params.at(std::get<2>(key)).first, std::get<1>(key), v, options, out);
}

// Each rank's total gradient norm at each step against its own median over the previous `window` steps: the steps
// where exactly one rank reaches normRatioThreshold × (anomalies.h, "Rank jumps").
void rankJumps(const GradSeries& g, const AnomalyOptions& options, AnomalyReport& out) {
  struct Seen {
    int rank;
    double norm, median;
    int history;
  };
  std::map<int, std::vector<Seen>> byStep;
  for (auto it = g.rankStepSq.begin(); it != g.rankStepSq.end(); ++it) {
    const RankTotal t = rankTotal(g, it, options.window);
    if (t.median > 0) byStep[it->first.second].push_back({it->first.first, t.norm, t.median, t.history});
  }
  for (const auto& [step, seen] : byStep) {
    const Seen* top = nullptr;
    int over = 0;
    for (const Seen& s : seen)
      if (s.norm >= options.normRatioThreshold * s.median) {
        ++over;
        top = &s;
      }
    if (over != 1) continue;
    double others = 0;
    for (const Seen& s : seen)
      if (&s != top) others = std::max(others, s.norm / s.median);
    out.rankJumps.push_back(RankJump{top->rank, step, top->norm, top->median, top->history, others});
  }
}

// Per layer, the median norm per step and the least-squares slope of its log10 over steps.
void layerTrends(const GradSeries& g, AnomalyReport& out) {
  for (const auto& [layer, bySteps] : g.layerNorms) {
    LayerTrend t;
    t.layer = layer;
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (const auto& [step, norms] : bySteps) {
      const double m = medianOf(norms);
      if (t.steps == 0) t.firstNorm = m;
      t.lastNorm = m;
      const double y = std::log10(m);
      sx += step;
      sy += y;
      sxx += double(step) * step;
      sxy += step * y;
      ++t.steps;
    }
    const double n = t.steps;
    const double den = n * sxx - sx * sx;
    t.decadesPer100Steps = den > 0 ? 100.0 * (n * sxy - sx * sy) / den : 0.0;
    out.layerTrends.push_back(t);
  }
}

}  // namespace

tracedb::Result<AnomalyReport> analyzeAnomalies(tracedb::Reader& reader, const RunInfo& info,
                                                const AnomalyOptions& options) {
  AnomalyReport out;
  auto grads = readGradSeries(reader);
  if (!grads) return grads.status();
  auto stats = reader.stepStats();
  if (!stats) return stats.status();
  std::map<int, std::vector<double>> losses;
  for (const auto& st : *stats) {  // the clip's norm: over every stage and replica, what the update is made of
    if (st.gradNorm && std::isfinite(*st.gradNorm) && *st.gradNorm > 0)
      grads->wholeNorm[{st.rank, st.step}] = *st.gradNorm;
    if (st.loss && std::isfinite(*st.loss)) losses[st.step].push_back(*st.loss);
  }
  grads->loss = meanPerStep(losses);
  // TP peers computed on the same batch — except under sequence parallelism, where each holds its own part of the
  // sequence in the layer norms, dropout and the row-parallel biases: a rare token in one part moves those gradients
  // on its rank alone (a healthy TP2 x PP2 run: position 21.05 on one rank, 0.004 on its peer). There the peers are
  // evidence in their sharded parameters only (seqPeers, aPeerSharesTheJump).
  const bool sameBatch = !(info.model && info.model->sequenceParallel);
  for (const auto& grp : info.groups)
    if (grp.name.rfind("tp-", 0) == 0 && grp.ranks.size() > 1)
      for (int r : grp.ranks)
        for (int p : grp.ranks)
          if (p != r) (sameBatch ? grads->tpPeers : grads->seqPeers)[r].push_back(p);
  paramSpikes(*grads, options, out);
  stepStatAnomalies(*stats, options, out);
  if (reader.metaValue("grad_stats_after_reduction").value_or("") == "1")
    replicaDivergences(*grads, info, options, out);
  layerTrends(*grads, out);
  rankJumps(*grads, options, out);
  std::sort(out.gradSpikes.begin(), out.gradSpikes.end(), [](const Spike& a, const Spike& b) {
    return std::tie(a.step, a.rank) != std::tie(b.step, b.rank) ? std::tie(a.step, a.rank) < std::tie(b.step, b.rank)
                                                                 : a.z > b.z;
  });
  return out;
}

namespace {
using detail::field;
using detail::threeDigits;
}  // namespace

std::vector<Finding> anomalyFindings(const AnomalyReport& report, const RunInfo& info) {
  std::vector<Finding> out;
  // The run-wide norm spikes because some rank's gradients did: where a rank's own spike explains a step, the
  // run-wide spike is a line of that finding, not a finding of its own.
  std::map<int, const Spike*> runWide;
  std::set<int> rankSteps;
  for (const Spike& s : report.gradSpikes) {
    if (s.rank < 0) runWide[s.step] = &s;
    else rankSteps.insert(s.step);
  }
  // One grad_spike finding per (rank, step): the worst parameter, with the others cited.
  for (size_t i = 0; i < report.gradSpikes.size();) {
    size_t j = i;
    while (j < report.gradSpikes.size() && report.gradSpikes[j].rank == report.gradSpikes[i].rank &&
           report.gradSpikes[j].step == report.gradSpikes[i].step)
      ++j;
    const Spike& s = report.gradSpikes[i];  // highest z first within (step, rank)
    if (s.rank < 0 && rankSteps.count(s.step)) {
      i = j;
      continue;
    }
    Finding fd;
    fd.kind = FindingKind::GradSpike;
    // A spike of a parameter too small to move its rank's gradient is a figure, not a fault.
    bool material = false;
    const std::string* explained = nullptr;
    for (size_t k = i; k < j; ++k) {
      material = material || report.gradSpikes[k].material;
      if (explained == nullptr && !report.gradSpikes[k].explained.empty()) explained = &report.gradSpikes[k].explained;
    }
    fd.severity = material ? Severity::Warning : Severity::Info;
    fd.rank = s.rank;
    fd.step = s.step;
    fd.layer = s.layer;
    const std::string what = s.param.empty() ? "global grad norm" : s.param + " grad norm";
    const std::string on = s.rank >= 0 ? " on rank " + std::to_string(s.rank) : std::string();
    fd.message = what + " " + threeDigits(s.value) + on + " at step " + std::to_string(s.step) + " (median " +
                 threeDigits(s.median) + ", " + threeDigits(s.value / std::max(s.median, 1e-300)) + "×, robust z " +
                 threeDigits(s.z) + ")";
    if (j - i > 1) fd.details.push_back(std::to_string(j - i) + " parameters spiked on this rank at this step");
    if (!material && explained != nullptr) fd.details.push_back(*explained);
    const auto rw = runWide.find(s.step);
    const bool folded = s.rank >= 0 && rw != runWide.end();
    if (folded)
      fd.details.push_back("the run's global grad norm spiked with it: " + threeDigits(rw->second->value) +
                           " (median " + threeDigits(rw->second->median) + ")");
    for (size_t k = i; k < j; ++k) {
      const Spike& x = report.gradSpikes[k];
      if (x.param.empty()) fd.cite("step_stats", {field("step", int64_t{x.step})});
      else
        fd.cite("grad_stats",
                {field("rank", int64_t{x.rank}), field("step", int64_t{x.step}), field("param", x.param)});
    }
    fd.number("value", s.value).number("median", s.median).number("mad", s.mad).number("z", s.z);
    if (folded) fd.number("global_value", rw->second->value).number("global_median", rw->second->median);
    out.push_back(std::move(fd));
    i = j;
  }
  for (const Spike& s : report.lossSpikes) {
    Finding fd;
    fd.kind = FindingKind::LossSpike;
    fd.severity = Severity::Warning;
    fd.step = s.step;
    fd.message = "loss " + threeDigits(s.value) + " at step " + std::to_string(s.step) +
                 " (median of the previous steps " + threeDigits(s.median) + ", robust z " + threeDigits(s.z) + ")";
    fd.cite("step_stats", {field("step", int64_t{s.step})});
    fd.number("value", s.value).number("median", s.median).number("mad", s.mad).number("z", s.z);
    out.push_back(std::move(fd));
  }
  for (const Divergence& d : report.divergences) {
    Finding fd;
    fd.kind = FindingKind::ReplicaDivergence;
    fd.severity = Severity::Error;
    fd.step = d.step;
    fd.rank = d.maxRank;
    fd.ranks = d.ranks;
    fd.message = d.what + " differs across ranks that must agree at step " + std::to_string(d.step) + ": " +
                 threeDigits(d.minValue) + " (rank " + std::to_string(d.minRank) + ") vs " + threeDigits(d.maxValue) +
                 " (rank " + std::to_string(d.maxRank) + "), relative spread " + threeDigits(d.relSpread);
    if (d.tpRank >= 0) fd.details.push_back("DP replicas of tp rank " + std::to_string(d.tpRank));
    for (int r : d.ranks) {
      if (d.what == "grad_norm") fd.cite("step_stats", {field("rank", int64_t{r}), field("step", int64_t{d.step})});
      else fd.cite("grad_stats", {field("rank", int64_t{r}), field("step", int64_t{d.step}), field("param", d.what)});
    }
    fd.number("min", d.minValue).number("max", d.maxValue).number("rel_spread", d.relSpread);
    out.push_back(std::move(fd));
  }
  (void)info;
  return out;
}

Finding rankJumpFinding(const RankJump& jump, const AnomalyOptions& options) {
  Finding fd;
  fd.kind = FindingKind::GradSpike;
  fd.severity = Severity::Warning;
  fd.rank = jump.rank;
  fd.step = jump.step;
  fd.message = "rank " + std::to_string(jump.rank) + "'s gradient norm " + threeDigits(jump.norm) + " at step " +
               std::to_string(jump.step) + " (median of its previous " + std::to_string(jump.history) + " step" +
               (jump.history == 1 ? "" : "s") + " " + threeDigits(jump.median) + ", " +
               threeDigits(jump.norm / jump.median) + "×); no other rank's moved " +
               threeDigits(options.normRatioThreshold) + "× (at most " + threeDigits(jump.othersRatio) + "×)";
  fd.details.push_back("the rank's total over its parameters (√Σ l2², grad_stats) against its own previous steps; the "
                       "spike test did not flag it (too little history, or no fall back after it)");
  fd.cite("grad_stats", {field("rank", int64_t{jump.rank}), field("step", int64_t{jump.step})});
  fd.number("value", jump.norm)
      .number("median", jump.median)
      .number("ratio", jump.norm / jump.median)
      .number("history", int64_t{jump.history})
      .number("others_max_ratio", jump.othersRatio);
  return fd;
}

}  // namespace tpscope::analysis
