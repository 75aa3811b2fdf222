#include "tpscope/analysis/anomalies.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <set>

#include "evidence_util.h"
#include "tpscope/tracedb/query.h"

namespace tpscope::analysis {

using tracedb::Query;

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<long>(mid), v.end());
  double m = v[mid];
  if (v.size() % 2 == 0) m = (m + *std::max_element(v.begin(), v.begin() + static_cast<long>(mid))) / 2;
  return m;
}

// Theil–Sen trend of (x, y) points: the median of the pairwise slopes, and the intercept that centres the residuals.
std::pair<double, double> theilSen(const std::vector<double>& x, const std::vector<double>& y) {
  std::vector<double> slopes;
  slopes.reserve(x.size() * (x.size() - 1) / 2);
  for (size_t i = 0; i < x.size(); ++i)
    for (size_t j = i + 1; j < x.size(); ++j)
      if (x[j] != x[i]) slopes.push_back((y[j] - y[i]) / (x[j] - x[i]));
  const double slope = slopes.empty() ? 0.0 : median(std::move(slopes));
  std::vector<double> icept(x.size());
  for (size_t i = 0; i < x.size(); ++i) icept[i] = y[i] - slope * x[i];
  return {slope, median(std::move(icept))};
}

// Spikes in one series of (step, value) in step order (the baseline definition in anomalies.h).
template <class Emit>
void findSpikes(const std::vector<std::pair<int, double>>& series, const AnomalyOptions& o, bool logScale,
                Emit&& emit) {
  std::deque<std::pair<int, double>> window;  // (step, value on the test's scale)
  const double kSigma = 1.4826;               // MAD → σ under normality
  auto usable = [&](double v) { return std::isfinite(v) && (!logScale || v > 0); };
  // A spike is transient: where later steps exist, the median of the next (up to) transientSteps values must fall
  // back by the same ratio. A jump that stays is a level shift (layer trends show it), not a spike.
  auto fallsBack = [&](size_t i, double x) {
    std::vector<double> next;
    for (size_t j = i + 1; j < series.size() && static_cast<int>(next.size()) < o.transientSteps; ++j)
      if (usable(series[j].second)) next.push_back(series[j].second);
    return next.empty() || x >= o.ratioThreshold * median(std::move(next));
  };
  for (size_t i = 0; i < series.size(); ++i) {
    const auto [step, x] = series[i];
    if (!usable(x)) continue;
    const double y = logScale ? std::log10(x) : x;
    if (static_cast<int>(window.size()) >= o.minHistory) {
      std::vector<double> w;
      for (const auto& p : window) w.push_back(p.second);
      const double m = median(w);
      for (double& v : w) v = std::fabs(v - m);
      const double mad = median(w);
      const double floor = logScale ? o.minSigmaDecades / kSigma : std::max(1e-3 * std::fabs(m), 1e-12);
      double z = (y - m) / (kSigma * std::max(mad, floor));
      const double base = logScale ? std::pow(10.0, m) : m;
      // Linear series: the median baseline decides. Log series: the ratio to the median is the cheap gate; the
      // trend-aware test below decides (a steep trend widens the MAD and would hide a spike from the plain z).
      bool spike = x >= o.ratioThreshold * base && (logScale || z >= o.zThreshold);
      if (spike && logScale) {
        // Confirm against the series' own trend (warm-up and early training move norms by decades): residuals of
        // the Theil–Sen line through the window, the value's residual in units of their robust σ.
        std::vector<double> sx, sy;
        for (const auto& p : window) {
          sx.push_back(p.first);
          sy.push_back(p.second);
        }
        const auto [slope, icept] = theilSen(sx, sy);
        std::vector<double> res;
        for (size_t i = 0; i < sx.size(); ++i) res.push_back(std::fabs(sy[i] - (icept + slope * sx[i])));
        const double rmad = median(std::move(res));
        const double predicted = icept + slope * step;
        z = (y - predicted) / (kSigma * std::max(rmad, floor));
        spike = z >= o.zThreshold && x >= o.ratioThreshold * std::pow(10.0, predicted);
      }
      if (spike && fallsBack(i, x)) emit(step, x, base, mad, z);
    }
    window.emplace_back(step, y);
    if (static_cast<int>(window.size()) > o.window) window.pop_front();
  }
}

}  // namespace

tracedb::Result<AnomalyReport> analyzeAnomalies(tracedb::Reader& reader, const RunInfo& info,
                                                const AnomalyOptions& options) {
  AnomalyReport out;
  // Per (rank, param) grad norm series, and per (layer, step) norms for trends.
  std::map<std::pair<int, int64_t>, std::vector<std::pair<int, double>>> series;
  std::map<int64_t, std::pair<std::string, int>> params;  // id → name, layer
  std::map<int, std::map<int, std::vector<double>>> layerNorms;
  std::map<std::pair<int, int>, double> rankStepSq;  // (rank, step) → Σ l2² over its parameters
  {
    Query q(reader,
            "SELECT rank, param, step, l2_norm, layer FROM grad_stats WHERE nan_count = 0 AND inf_count = 0",
            "table 'grad_stats'");
    auto s = q.each([&](Query& r) {
      const int rank = r.i32(0);
      const int64_t param = r.i64(1);
      const int step = r.i32(2);
      const double norm = r.f64(3);
      const int layer = r.i32(4);
      series[{rank, param}].emplace_back(step, norm);
      if (std::isfinite(norm)) rankStepSq[{rank, step}] += norm * norm;
      params.try_emplace(param, std::string(), layer);
      if (layer >= 0 && std::isfinite(norm) && norm > 0) layerNorms[layer][step].push_back(norm);
    });
    if (!s) return s;
  }
  for (auto& [id, p] : params) p.first = reader.string(static_cast<uint32_t>(id));
  // Rows come in file order (usually step by step); each series must be in step order.
  for (auto& [key, s] : series)
    if (!std::is_sorted(s.begin(), s.end())) std::sort(s.begin(), s.end());
  // One parameter's norm swings several-fold in a healthy run (warm-up, early steps): flag an order of magnitude.
  AnomalyOptions perParam = options;
  perParam.minHistory = std::max(options.minHistory, options.paramMinHistory);
  perParam.ratioThreshold = std::max(options.ratioThreshold, options.paramRatioThreshold);
  for (const auto& [key, s] : series) {
    const auto& [name, layer] = params[key.second];
    findSpikes(s, perParam, /*logScale=*/true, [&](int step, double x, double m, double mad, double z) {
      Spike sp{key.first, step, layer, name, x, m, mad, z};
      // Material: it moves its rank's gradient — the rank's total norm (√Σ l2² over its parameters) at that step is
      // ≥ normRatioThreshold × its median over the previous steps. A spike in a tiny parameter does not.
      std::vector<double> totals;
      for (auto it = rankStepSq.lower_bound({key.first, step - options.window}); it != rankStepSq.end() &&
                                                                               it->first.first == key.first &&
                                                                               it->first.second < step;
           ++it)
        totals.push_back(std::sqrt(it->second));
      const auto now = rankStepSq.find({key.first, step});
      sp.material = totals.empty() || now == rankStepSq.end() ||
                    std::sqrt(now->second) >= options.normRatioThreshold * median(std::move(totals));
      out.gradSpikes.push_back(std::move(sp));
    });
  }

  // Step stats: global grad norm per rank, loss per step, and agreement of the post-reduction grad norm.
  std::map<int, std::vector<double>> losses;
  std::map<int, std::vector<std::pair<int, double>>> normsByStep;  // step → (rank, norm)
  auto stats = reader.stepStats();
  if (!stats) return stats.status();
  for (const auto& st : *stats) {
    if (st.gradNorm && std::isfinite(*st.gradNorm)) {
      normsByStep[st.step].emplace_back(st.rank, *st.gradNorm);
    }
    if (st.loss && std::isfinite(*st.loss)) losses[st.step].push_back(*st.loss);
  }
  // The global norm is the same on every rank (it is taken after reduction): one run-wide series, the mean.
  std::vector<std::pair<int, double>> normSeries;
  for (const auto& [step, v] : normsByStep) {
    double sum = 0;
    for (const auto& [r, x] : v) sum += x;
    normSeries.emplace_back(step, sum / static_cast<double>(v.size()));
  }
  AnomalyOptions globalNorm = options;
  globalNorm.ratioThreshold = std::max(options.ratioThreshold, options.normRatioThreshold);
  findSpikes(normSeries, globalNorm, /*logScale=*/true, [&](int step, double x, double m, double mad, double z) {
    out.gradSpikes.push_back(Spike{-1, step, -1, "", x, m, mad, z});
  });
  std::vector<std::pair<int, double>> lossSeries;
  for (const auto& [step, v] : losses) {
    double sum = 0;
    for (double x : v) sum += x;
    lossSeries.emplace_back(step, sum / static_cast<double>(v.size()));
  }
  findSpikes(lossSeries, options, /*logScale=*/false, [&](int step, double x, double m, double mad, double z) {
    out.lossSpikes.push_back(Spike{-1, step, -1, "", x, m, mad, z});
  });

  auto diverge = [&](int step, const std::string& what, int tpRank, const std::vector<std::pair<int, double>>& v) {
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
  };
  for (const auto& [step, v] : normsByStep) diverge(step, "grad_norm", -1, v);

  if (reader.metaValue("grad_stats_after_reduction").value_or("") == "1") {
    // (step, tp_rank, param) → DP replicas' norms.
    std::map<std::tuple<int, int, int64_t>, std::vector<std::pair<int, double>>> replicas;
    for (const auto& [key, s] : series) {
      const auto* ri = info.rank(key.first);
      const int tp = ri ? ri->tpRank : 0;
      for (const auto& [step, norm] : s) replicas[{step, tp, key.second}].emplace_back(key.first, norm);
    }
    for (const auto& [key, v] : replicas)
      diverge(std::get<0>(key), params[std::get<2>(key)].first, std::get<1>(key), v);
  }

  for (const auto& [layer, bySteps] : layerNorms) {
    LayerTrend t;
    t.layer = layer;
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (const auto& [step, norms] : bySteps) {
      const double m = median(norms);
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
  std::sort(out.gradSpikes.begin(), out.gradSpikes.end(), [](const Spike& a, const Spike& b) {
    return std::tie(a.step, a.rank) != std::tie(b.step, b.rank) ? std::tie(a.step, a.rank) < std::tie(b.step, b.rank)
                                                                 : a.z > b.z;
  });
  return out;
}

namespace {
using detail::f;
using detail::g3;
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
    for (size_t k = i; k < j; ++k) material = material || report.gradSpikes[k].material;
    fd.severity = material ? Severity::Warning : Severity::Info;
    fd.rank = s.rank;
    fd.step = s.step;
    fd.layer = s.layer;
    const std::string what = s.param.empty() ? "global grad norm" : s.param + " grad norm";
    const std::string on = s.rank >= 0 ? " on rank " + std::to_string(s.rank) : std::string();
    fd.message = what + " " + g3(s.value) + on + " at step " +
                 std::to_string(s.step) + " (median " + g3(s.median) + ", " + g3(s.value / std::max(s.median, 1e-300)) +
                 "×, robust z " + g3(s.z) + ")";
    if (j - i > 1) fd.details.push_back(std::to_string(j - i) + " parameters spiked on this rank at this step");
    if (auto rw = runWide.find(s.step); s.rank >= 0 && rw != runWide.end())
      fd.details.push_back("the run's global grad norm spiked with it: " + g3(rw->second->value) + " (median " +
                           g3(rw->second->median) + ")");
    for (size_t k = i; k < j; ++k) {
      const Spike& x = report.gradSpikes[k];
      if (x.param.empty()) fd.cite("step_stats", {f("step", int64_t{x.step})});
      else fd.cite("grad_stats", {f("rank", int64_t{x.rank}), f("step", int64_t{x.step}), f("param", x.param)});
    }
    fd.number("value", s.value).number("median", s.median).number("mad", s.mad).number("z", s.z);
    out.push_back(std::move(fd));
    i = j;
  }
  for (const Spike& s : report.lossSpikes) {
    Finding fd;
    fd.kind = FindingKind::LossSpike;
    fd.severity = Severity::Warning;
    fd.step = s.step;
    fd.message = "loss " + g3(s.value) + " at step " + std::to_string(s.step) + " (median of the previous steps " +
                 g3(s.median) + ", robust z " + g3(s.z) + ")";
    fd.cite("step_stats", {f("step", int64_t{s.step})});
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
                 g3(d.minValue) + " (rank " + std::to_string(d.minRank) + ") vs " + g3(d.maxValue) + " (rank " +
                 std::to_string(d.maxRank) + "), relative spread " + g3(d.relSpread);
    if (d.tpRank >= 0) fd.details.push_back("DP replicas of tp rank " + std::to_string(d.tpRank));
    for (int r : d.ranks) {
      if (d.what == "grad_norm") fd.cite("step_stats", {f("rank", int64_t{r}), f("step", int64_t{d.step})});
      else fd.cite("grad_stats", {f("rank", int64_t{r}), f("step", int64_t{d.step}), f("param", d.what)});
    }
    fd.number("min", d.minValue).number("max", d.maxValue).number("rel_spread", d.relSpread);
    out.push_back(std::move(fd));
  }
  (void)info;
  return out;
}

}  // namespace tpscope::analysis
