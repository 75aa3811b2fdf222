// The time breakdown (analysis/breakdown.h) of every shared Kineto trace, against an independent computation here:
// the trace's events read with nlohmann, interval unions over the events on GPU streams (kernels, NCCL kernels,
// memcpy/memset) per ProfilerStep window, and HTA's idle rule on the gaps between them. Times are parsed as long
// double, so they convert to ns exactly, as the importer converts them, and the figures must agree to the ns.
// A trace without GPU events (the Gloo CPU trace) must be read on its host lanes, by the host rules.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <unordered_map>

#include "test_support.h"
#include "tpscope/analysis/breakdown.h"
#include "tpscope/formats/kineto_import.h"
#include "tpscope/tracedb/reader.h"

namespace tpscope::formats {
namespace {

using namespace testing;
// Doubles hold a unix-epoch µs value to about 1 ns; long double (strtold) holds it exactly enough to round to ns.
using ExactJson = nlohmann::basic_json<std::map, std::vector, std::string, bool, std::int64_t, std::uint64_t,
                                       long double>;
using Iv = std::pair<int64_t, int64_t>;

int64_t ns(const ExactJson& us) { return static_cast<int64_t>(std::llround(us.get<long double>() * 1000.0L)); }

ExactJson loadExactEvents(const fs::path& path) { return loadEvents<ExactJson>(path); }

std::vector<Iv> unite(std::vector<Iv> v) {
  std::sort(v.begin(), v.end());
  std::vector<Iv> out;
  for (const Iv& i : v) {
    if (i.second <= i.first) continue;
    if (!out.empty() && i.first <= out.back().second) out.back().second = std::max(out.back().second, i.second);
    else out.push_back(i);
  }
  return out;
}

int64_t measure(const std::vector<Iv>& u, int64_t a, int64_t b) {
  int64_t sum = 0;
  for (const Iv& i : u) sum += std::max<int64_t>(0, std::min(i.second, b) - std::max(i.first, a));
  return sum;
}

std::vector<Iv> intersect(const std::vector<Iv>& a, const std::vector<Iv>& b) {
  std::vector<Iv> out;
  for (size_t i = 0, j = 0; i < a.size() && j < b.size();) {
    const int64_t lo = std::max(a[i].first, b[j].first), hi = std::min(a[i].second, b[j].second);
    if (lo < hi) out.emplace_back(lo, hi);
    (a[i].second < b[j].second ? i : j)++;
  }
  return out;
}

struct Figures {
  int64_t step = 0, compute = 0, comm = 0, exposed = 0, other = 0, idle = 0, memcpy = 0;
  int64_t hostWait = 0, kernelWait = 0, idleOther = 0;
};

// The figures of each ProfilerStep window, in time order, computed on the file's GPU-stream events.
std::vector<Figures> deviceFigures(const ExactJson& events) {
  std::vector<Iv> windows, compute, comm, memory;
  std::vector<std::pair<int64_t, int64_t>> starts;   // (begin, correlation) of GPU work
  std::unordered_map<int64_t, int64_t> launch;       // correlation -> begin of the host call (cuda_runtime)
  int64_t first = std::numeric_limits<int64_t>::max();
  for (const auto& e : events) {
    if (!e.is_object() || e.value("ph", "") != "X") continue;
    const int64_t b = ns(e["ts"]), end = b + ns(e["dur"]);
    first = std::min(first, b);
    const std::string cat = e.value("cat", ""), name = e.value("name", "");
    const int64_t corr = e.contains("args") ? e["args"].value("correlation", int64_t{-1}) : -1;
    if (name.rfind("ProfilerStep#", 0) == 0) windows.emplace_back(b, end);
    if (cat == "kernel") {
      const bool nccl = name.rfind("nccl", 0) == 0 || e["args"].contains("Collective name");
      (nccl ? comm : compute).emplace_back(b, end);
    } else if (cat == "gpu_memcpy" || cat == "gpu_memset") {
      memory.emplace_back(b, end);
    } else if (cat == "cuda_runtime" && corr >= 0) {
      launch[corr] = b;
      continue;
    } else {
      continue;
    }
    starts.emplace_back(b, corr);
  }
  std::sort(windows.begin(), windows.end());
  std::sort(starts.begin(), starts.end());
  compute = unite(compute);
  comm = unite(comm);
  memory = unite(memory);
  std::vector<Iv> all = compute;
  all.insert(all.end(), comm.begin(), comm.end());
  all.insert(all.end(), memory.begin(), memory.end());
  const std::vector<Iv> busy = unite(all), both = intersect(compute, comm);

  // HTA's idle rule on each gap: launched after the gap began -> host wait; else shorter than 30 µs -> kernel wait.
  std::vector<Iv> hostWait, kernelWait, idleOther;
  int64_t g0 = std::min(first, windows.front().first);
  for (const Iv& w : busy) {
    if (w.first > g0) {
      int64_t earliest = std::numeric_limits<int64_t>::max();
      for (auto it = std::lower_bound(starts.begin(), starts.end(), std::pair(w.first, int64_t{-2}));
           it != starts.end() && it->first == w.first; ++it)
        if (launch.count(it->second)) earliest = std::min(earliest, launch[it->second]);
      const Iv gap(g0, w.first);
      if (earliest != std::numeric_limits<int64_t>::max() && earliest > g0) hostWait.push_back(gap);
      else if (w.first - g0 < 30'000) kernelWait.push_back(gap);
      else idleOther.push_back(gap);
    }
    g0 = std::max(g0, w.second);
  }
  idleOther.emplace_back(g0, std::numeric_limits<int64_t>::max() / 2);

  std::vector<Figures> out;
  for (const auto& [a, b] : windows) {
    Figures f;
    f.step = b - a;
    f.compute = measure(compute, a, b);
    f.comm = measure(comm, a, b);
    f.exposed = f.comm - measure(both, a, b);
    f.idle = f.step - measure(busy, a, b);
    f.other = f.step - f.compute - f.exposed - f.idle;
    f.memcpy = measure(memory, a, b);
    f.hostWait = measure(hostWait, a, b);
    f.kernelWait = measure(kernelWait, a, b);
    f.idleOther = measure(idleOther, a, b);
    out.push_back(f);
  }
  return out;
}

class SharedTraceBreakdown : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::is_directory(sharedKineto()))
      GTEST_SKIP() << "shared Kineto traces not found at " << sharedKineto()
                   << " (../shared/testdata beside the checkout)";
  }
  // Imports one trace and returns its breakdown, steps in time order.
  analysis::Breakdown breakdownOf(const fs::path& path) {
    const std::vector<fs::path> inputs{path};
    auto stats = importKineto(inputs, dir_ / "run.db");
    EXPECT_TRUE(stats) << stats.error();
    auto reader = tracedb::Reader::open(dir_ / "run.db");
    EXPECT_TRUE(reader) << reader.error();
    if (!stats || !reader) return {};
    auto b = analysis::computeBreakdown(**reader);
    EXPECT_TRUE(b) << b.error();
    if (!b) return {};
    std::sort(b->steps.begin(), b->steps.end(), [](const auto& x, const auto& y) { return x.beginNs < y.beginNs; });
    return std::move(*b);
  }
  ScratchDir dir_;
};

void expectFigures(const analysis::TimeShares& got, const Figures& want, const std::string& where) {
  SCOPED_TRACE(where);
  EXPECT_EQ(got.stepNs, want.step);
  EXPECT_EQ(got.computeNs, want.compute);
  EXPECT_EQ(got.commNs, want.comm);
  EXPECT_EQ(got.exposedCommNs, want.exposed);
  EXPECT_EQ(got.otherNs, want.other);
  EXPECT_EQ(got.idleNs, want.idle);
  EXPECT_EQ(got.memcpyNs, want.memcpy);
  EXPECT_EQ(got.idleHostWaitNs, want.hostWait);
  EXPECT_EQ(got.idleKernelWaitNs, want.kernelWait);
  EXPECT_EQ(got.idleOtherNs, want.idleOther);
}

class GpuTraceBreakdown : public SharedTraceBreakdown, public ::testing::WithParamInterface<const char*> {};

TEST_P(GpuTraceBreakdown, DeviceLanesMatchAnIndependentComputation) {
  const fs::path path = sharedKineto() / GetParam();
  ASSERT_TRUE(fs::exists(path)) << path;
  const std::vector<Figures> want = deviceFigures(loadExactEvents(path));
  const analysis::Breakdown b = breakdownOf(path);
  ASSERT_EQ(b.ranks.size(), 1u);
  EXPECT_EQ(b.ranks[0].lanes, analysis::Lanes::Device);
  EXPECT_EQ(b.source, analysis::StepSource::StepSpans);
  ASSERT_EQ(b.steps.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    expectFigures(b.steps[i].time, want[i], std::string(GetParam()) + " step " + std::to_string(b.steps[i].step));
  const analysis::TimeShares& run = b.run;
  EXPECT_EQ(run.idleHostWaitNs + run.idleKernelWaitNs + run.idleOtherNs, run.idleNs);
  // GPU work inside the steps at all (a breakdown of nothing would also "match").
  EXPECT_GT(b.run.computeNs, 0);
  EXPECT_GT(b.run.commNs, 0);
}

INSTANTIATE_TEST_SUITE_P(SharedTraces, GpuTraceBreakdown,
                         ::testing::Values("nccl_parser_config_nccl_data.json.gz",
                                           "negative_queue_length_values_check_rank0.json.gz",
                                           "trace_filter_sampled_rank-0.json.gz",
                                           "trace_filter_sampled_rank-1.json.gz"));

// The HTA trace that made the report say 0.3 % exposed communication (host ops counted as compute): on its GPU
// stream the NCCL kernels run 7.0 % of the steps, 5.9 % with no kernel beside them.
TEST_F(SharedTraceBreakdown, NcclParserTraceExposesItsCommunication) {
  const analysis::Breakdown b = breakdownOf(sharedKineto() / "nccl_parser_config_nccl_data.json.gz");
  ASSERT_EQ(b.ranks.size(), 1u);
  EXPECT_NEAR(b.run.pct(b.run.exposedCommNs), 5.93, 0.01);
  EXPECT_NEAR(b.run.pct(b.run.commNs), 7.03, 0.01);
}

TEST_F(SharedTraceBreakdown, CpuGlooTraceStaysOnHostLanes) {
  const fs::path path = sharedKineto() / "cpu_only_rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz";
  ASSERT_TRUE(fs::exists(path)) << path;
  // Host rules by hand: the gloo ops (on Gloo's threads) are communication, nothing else in the step computes,
  // every other span (the profiler's own "Trace" span covers it all) is other; ProfilerStep is the window.
  std::vector<Iv> windows, comm, busy;
  for (const auto& e : loadExactEvents(path)) {
    if (!e.is_object() || e.value("ph", "") != "X") continue;
    const int64_t b = ns(e["ts"]), end = b + ns(e["dur"]);
    const std::string name = e.value("name", "");
    if (name.rfind("ProfilerStep#", 0) == 0) {
      windows.emplace_back(b, end);
      continue;
    }
    if (name.rfind("gloo:", 0) == 0) comm.emplace_back(b, end);
    busy.emplace_back(b, end);
  }
  ASSERT_EQ(windows.size(), 1u);
  comm = unite(comm);
  busy = unite(busy);
  const auto [a, z] = windows[0];
  const analysis::Breakdown b = breakdownOf(path);
  ASSERT_EQ(b.ranks.size(), 1u);
  EXPECT_EQ(b.ranks[0].lanes, analysis::Lanes::Host);
  ASSERT_EQ(b.steps.size(), 1u);
  Figures want;
  want.step = z - a;
  want.comm = want.exposed = measure(comm, a, z);
  want.idle = want.step - measure(busy, a, z);
  want.other = want.step - want.exposed - want.idle;
  expectFigures(b.steps[0].time, want, "cpu_only step");
  EXPECT_NEAR(b.run.pct(b.run.exposedCommNs), 85.1, 0.05);  // as before device lanes existed
}

}  // namespace
}  // namespace tpscope::formats
