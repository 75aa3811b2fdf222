// The one definition of a spike: the baseline of a series at a step and whether a value is a spike against it,
// shared by the live health rules (rules/: grad_spike, loss_spike) and the anomaly analysis (probes/analysis:
// grad_spike, loss_spike findings). Header-only and dependency-free (the vocabulary's rule).
//
// The window: the previous `capacity` usable values of the series that were not spikes, with their steps. A value
// is tested against it (at least `minHistory` values) on one of two scales (SpikeScale): a loss against the median, a
// gradient norm in decades against the series' own trend. Usable values: finite (and > 0 on the Norm scale); others
// are neither tested nor learned. Which values enter the window is the caller's (SpikeWindow says who does what).
// docs/diagnosis.md ("Gradient and loss anomalies") tells the whole test with the figures behind its thresholds.
// Threading: plain values; no shared state.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

namespace tpscope::vocabulary {

// 1.4826·MAD estimates σ of a normal distribution.
inline constexpr double kMadToSigma = 1.4826;

// A gradient spike nothing else can tell from a hard batch (no TP peer saw the same batch; the live rules see no
// peer) must take the whole model's norm this many times past the largest value the run has shown before: an order
// of magnitude past its own range (anomalies.h, materiality; rules/health_rules.h).
inline constexpr double kRunRangeRatio = 10.0;

// Median of `v` (the mean of the two middle values for an even count); 0 for none.
inline double medianOf(std::vector<double> v) {
  if (v.empty()) return 0.0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  double m = v[mid];
  if (v.size() % 2 == 0) m = 0.5 * (m + *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid)));
  return m;
}

// Median absolute deviation of `v` from `center` (unscaled).
inline double madOf(const std::vector<double>& v, double center) {
  std::vector<double> dev;
  dev.reserve(v.size());
  for (double x : v) dev.push_back(std::fabs(x - center));
  return medianOf(std::move(dev));
}

// y = intercept + slope·x.
struct TrendLine {
  double slope = 0, intercept = 0;
  double at(double x) const { return intercept + slope * x; }
};

// Theil–Sen line through (x, y): the median of the pairwise slopes, and the intercept that centres the residuals.
inline TrendLine theilSen(const std::vector<double>& x, const std::vector<double>& y) {
  std::vector<double> slopes;
  slopes.reserve(x.size() * (x.size() > 0 ? x.size() - 1 : 0) / 2);
  for (size_t i = 0; i < x.size(); ++i)
    for (size_t j = i + 1; j < x.size(); ++j)
      if (x[j] != x[i]) slopes.push_back((y[j] - y[i]) / (x[j] - x[i]));
  TrendLine line;
  line.slope = slopes.empty() ? 0.0 : medianOf(std::move(slopes));
  std::vector<double> icept(x.size());
  for (size_t i = 0; i < x.size(); ++i) icept[i] = y[i] - line.slope * x[i];
  line.intercept = medianOf(std::move(icept));
  return line;
}

// The test of a value x at step t against the window:
//   Level (a loss): y = x. Baseline = the median m of the window; d = MAD = median|y_i − m|, floored at 1e-3·|m|;
//     z = (y − m) / (1.4826·d) (1.4826·MAD estimates σ under normality). Spike: x ≥ ratio·m and z ≥ zMin.
//   Norm (a gradient norm; positive, it moves multiplicatively): y = log10 x, so a spike is a jump in decades; d is
//     floored at minSigmaDecades / 1.4826. A candidate (x ≥ ratio·10^m) is judged against the series' own trend:
//     the Theil–Sen line through the window predicts y_t, z is the residual over the residuals' robust σ (same
//     floor), and a spike is z ≥ zMin and x ≥ ratio·10^prediction. Warm-up and early training move norms by
//     decades: against the trend that is ordinary, and a spike on a steep trend still stands out (a plain median
//     would both flag the trend and, its MAD widened by it, miss the spike).
enum class SpikeScale : uint8_t { Level, Norm };  // a loss; a gradient norm (log10, trend-aware)

struct SpikeTest {
  double ratio = 2.0;             // x ≥ ratio × the baseline (the median; a norm's trend prediction)
  double zMin = 6.0;              // and the robust z ≥ zMin
  int minHistory = 5;             // window values needed before a value is tested
  double minSigmaDecades = 0.05;  // Norm: floor of the robust σ of log10 values (about ±12 %)
};

struct SpikeVerdict {
  bool tested = false;  // the window held at least minHistory values
  bool spike = false;
  double median = 0;    // the window's median on the value's scale (10^m for a norm)
  double mad = 0;       // the window's MAD on the test's scale (decades for a norm)
  double baseline = 0;  // what x was compared with, on the value's scale: the median, or a norm's trend prediction
  double z = 0;         // robust z of x (a norm candidate's: its residual from the trend)
};

// The window of one series and the test against it (the definition above). Who applies it, and how they differ —
// the test is the same; what each may add around it is not:
//   - The live rules (rules/health_rules.h) can only look backward: they fire during the step. A value they
//     flag never enters the window, nor does a step some rank found unhealthy or that was skipped; so a jump that
//     stays (a level shift) keeps firing until the policy acts.
//   - The analysis (probes/analysis/anomalies.h) sees the whole run and adds forward-looking checks on top:
//     transience (the next values must fall back below x / ratio; a jump that stays is a level shift, not a spike)
//     and, per parameter, materiality (the spike moves its rank's total norm). A confirmed spike never enters the
//     window (as live); a candidate that stays up does (it is the new level).
//   So on a transient spike both call the same steps spikes when they test the same series with the same ratio,
//   zMin, capacity and minHistory (tests/analysis/spike_agreement_test.cpp feeds one series through both).
class SpikeWindow {
 public:
  explicit SpikeWindow(int capacity, SpikeScale scale = SpikeScale::Level)
      : capacity_(capacity < 1 ? 1 : capacity), scale_(scale) {}

  bool usable(double x) const { return std::isfinite(x) && (scale_ == SpikeScale::Level || x > 0); }

  // Tests x (the value of `step`) against the window; does not add it.
  SpikeVerdict test(int step, double x, const SpikeTest& t) const {
    SpikeVerdict v;
    if (!usable(x) || size() < t.minHistory) return v;
    v.tested = true;
    const bool log = scale_ == SpikeScale::Norm;
    const double y = log ? std::log10(x) : x;
    std::vector<double> ys = values();
    const double m = medianOf(ys);
    v.mad = madOf(ys, m);
    const double floor = log ? t.minSigmaDecades / kMadToSigma : std::max(1e-3 * std::fabs(m), 1e-12);
    v.z = (y - m) / (kMadToSigma * std::max(v.mad, floor));
    v.median = v.baseline = log ? std::pow(10.0, m) : m;
    // Level: the median decides. Norm: the ratio to the median is the cheap gate; the trend decides.
    v.spike = x >= t.ratio * v.baseline && (log || v.z >= t.zMin);
    if (v.spike && log) {
      std::vector<double> xs;
      xs.reserve(values_.size());
      for (const auto& p : values_) xs.push_back(p.first);
      const TrendLine line = theilSen(xs, ys);
      std::vector<double> res(xs.size());
      for (size_t i = 0; i < xs.size(); ++i) res[i] = std::fabs(ys[i] - line.at(xs[i]));
      const double predicted = line.at(step);
      v.z = (y - predicted) / (kMadToSigma * std::max(medianOf(std::move(res)), floor));
      v.baseline = std::pow(10.0, predicted);
      v.spike = v.z >= t.zMin && x >= t.ratio * v.baseline;
    }
    return v;
  }

  // Learns x as the value of `step` (the caller decides which values: see above). Unusable values are ignored.
  void add(double x, int step) {
    if (!usable(x)) return;
    values_.emplace_back(step, scale_ == SpikeScale::Norm ? std::log10(x) : x);
    while (static_cast<int>(values_.size()) > capacity_) values_.pop_front();
  }
  // Learns x as the value of the step after the last one.
  void add(double x) { add(x, values_.empty() ? 0 : values_.back().first + 1); }

  int size() const { return static_cast<int>(values_.size()); }
  // The window's median on the value's scale and its MAD on the test's scale (as in SpikeVerdict).
  double median() const {
    const double m = medianOf(values());
    return scale_ == SpikeScale::Norm ? std::pow(10.0, m) : m;
  }
  double mad() const {
    const std::vector<double> ys = values();
    return madOf(ys, medianOf(ys));
  }
  // The largest value of the window on the value's scale (0 when empty): the range the series has shown.
  double max() const {
    double m = -HUGE_VAL;
    for (const auto& p : values_) m = std::max(m, p.second);
    if (values_.empty()) return 0.0;
    return scale_ == SpikeScale::Norm ? std::pow(10.0, m) : m;
  }

 private:
  std::vector<double> values() const {
    std::vector<double> ys;
    ys.reserve(values_.size());
    for (const auto& p : values_) ys.push_back(p.second);
    return ys;
  }

  int capacity_;
  SpikeScale scale_;
  std::deque<std::pair<int, double>> values_;  // (step, value on the test's scale), oldest first
};

}  // namespace tpscope::vocabulary
