// Kineto import of the real traces in ../shared/testdata/kineto (Holistic Trace Analysis test data, MIT licence).
// Expectations are computed here by walking the JSON with nlohmann — no code shared with the importer — and a few
// known numbers are pinned. Skipped, with the reason, where the shared folder is absent.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "test_support.h"
#include "tpscope/formats/kineto_import.h"
#include "tpscope/tracedb/reader.h"

namespace tpscope::formats {
namespace {

using namespace testing;
using nlohmann::json;

class SharedKinetoTraces : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::is_directory(sharedKineto()))
      GTEST_SKIP() << "shared Kineto traces not found at " << sharedKineto() << " (../shared/testdata beside the checkout)";
  }
  fs::path trace(const std::string& name) {
    const fs::path p = sharedKineto() / name;
    if (!fs::exists(p)) ADD_FAILURE() << "missing " << p;
    return p;
  }
  std::unique_ptr<tracedb::Reader> importOne(std::vector<fs::path> inputs) {
    auto stats = importKineto(inputs, dir_ / "run.db");
    EXPECT_TRUE(stats) << stats.error();
    if (!stats) return nullptr;
    stats_ = *stats;
    auto r = tracedb::Reader::open(dir_ / "run.db");
    EXPECT_TRUE(r) << r.error();
    return r ? std::move(*r) : nullptr;
  }
  ScratchDir dir_;
  KinetoImportStats stats_;
};

bool isGpu(const json& e) {
  const std::string cat = e.value("cat", "");
  return cat == "kernel" || cat == "gpu_memcpy" || cat == "gpu_memset" || cat == "gpu_user_annotation";
}

// op -> (count, total duration ns) from the run.
std::map<std::string, std::pair<int, int64_t>> collectivesByOp(tracedb::Reader& run, std::optional<int> rank = {}) {
  tracedb::CollectiveQuery q;
  q.rank = rank;
  auto cols = run.collectives(q);
  EXPECT_TRUE(cols) << cols.error();
  std::map<std::string, std::pair<int, int64_t>> out;
  if (!cols) return out;
  for (const auto& c : *cols) {
    out[c.op].first++;
    out[c.op].second += *c.endNs - *c.startNs;
  }
  return out;
}

TEST_F(SharedKinetoTraces, CollectivesFromMetadataMatchTheFile) {
  // PyTorch 2.x trace: record_param_comms carries "Collective name", nelems, dtype, group; so do the NCCL kernels.
  const fs::path path = trace("nccl_parser_config_nccl_data.json.gz");
  const json events = loadEvents(path);
  std::map<std::string, std::pair<int, int64_t>> expected;  // normalised op -> (host ops, kernel ns)
  std::map<std::string, int64_t> expectedBytes;
  const std::map<std::string, std::string> opName{{"allreduce", "all_reduce"}, {"broadcast", "broadcast"}};
  for (const auto& e : events) {
    if (!e.is_object() || e.value("ph", "") != "X") continue;
    const json args = e.value("args", json::object());
    if (!args.contains("Collective name") || args["Collective name"] == "wait") continue;
    const std::string op = opName.at(args["Collective name"].get<std::string>());
    if (isGpu(e)) {
      expected[op].second += usToNs(e["dur"]);
    } else {
      expected[op].first++;
      const int64_t size = args["dtype"] == "Float" ? 4 : args["dtype"] == "Long" ? 8 : 0;
      expectedBytes[op] += args["In msg nelems"].get<int64_t>() * size;  // the input's size (schema)
    }
  }
  auto run = importOne({path});
  ASSERT_TRUE(run);
  auto got = collectivesByOp(*run);
  EXPECT_EQ(got, expected);
  EXPECT_EQ(got["broadcast"].first, 6);  // pinned
  EXPECT_EQ(got["all_reduce"].first, 15);
  auto cols = run->collectives();
  ASSERT_TRUE(cols);
  std::map<std::string, int64_t> bytes;
  for (const auto& c : *cols) bytes[c.op] += c.bytes;
  EXPECT_EQ(bytes, expectedBytes);
  for (const auto& c : *cols) {
    EXPECT_EQ(c.group, "0");
    EXPECT_EQ(c.state, tracedb::CollectiveState::Completed);
  }
}

// PyTorch 2.0-era traces: no metadata; a collective is a c10d::*/nccl:* op (each nccl:* annotation is one).
std::map<std::string, int> ncclAnnotationsByOp(const json& events) {
  const std::map<std::string, std::string> opName{{"nccl:all_reduce", "all_reduce"},
                                                  {"nccl:all_to_all", "all_to_all"},
                                                  {"nccl:_all_gather_base", "all_gather"},
                                                  {"nccl:_reduce_scatter_base", "reduce_scatter"},
                                                  {"nccl:broadcast", "broadcast"}};
  std::map<std::string, int> out;
  for (const auto& e : events) {
    if (!e.is_object() || e.value("ph", "") != "X" || isGpu(e)) continue;
    auto it = opName.find(e.value("name", ""));
    if (it != opName.end()) out[it->second]++;
  }
  return out;
}

// For each nccl:* host op: the kernels launched from inside it (runtime events on its thread within its time, joined
// to kernels by correlation id) give the duration, first kernel start to last kernel end.
std::map<std::string, int64_t> kernelTimeByOp(const json& events) {
  std::map<int64_t, std::pair<double, double>> kernelByCorr;  // correlation -> (ts, end) µs
  for (const auto& e : events)
    if (e.is_object() && e.value("cat", "") == "kernel")
      kernelByCorr[e["args"]["correlation"].get<int64_t>()] = {e["ts"].get<double>(),
                                                              e["ts"].get<double>() + e["dur"].get<double>()};
  std::map<std::pair<int64_t, int64_t>, std::vector<const json*>> runtimeByLane;
  for (const auto& e : events)
    if (e.is_object() && e.value("cat", "") == "cuda_runtime")
      runtimeByLane[{e["pid"].get<int64_t>(), e["tid"].get<int64_t>()}].push_back(&e);
  std::map<std::string, int64_t> out;
  for (const auto& e : events) {
    const std::string name = e.is_object() ? e.value("name", "") : "";
    if (name.rfind("nccl:", 0) != 0 || isGpu(e)) continue;
    const double b = e["ts"].get<double>(), end = b + e["dur"].get<double>();
    double kb = 1e300, ke = -1e300;
    for (const json* r : runtimeByLane[{e["pid"].get<int64_t>(), e["tid"].get<int64_t>()}]) {
      const double t = (*r)["ts"].get<double>();
      if (t < b || t > end) continue;
      auto k = kernelByCorr.find((*r)["args"]["correlation"].get<int64_t>());
      if (k == kernelByCorr.end()) continue;
      kb = std::min(kb, k->second.first);
      ke = std::max(ke, k->second.second);
    }
    out[name] += kb <= ke ? static_cast<int64_t>(std::llround((ke - kb) * 1000)) : usToNs(e["dur"]);
  }
  return out;
}

TEST_F(SharedKinetoTraces, TwoRanksWithoutMetadata) {
  const fs::path r0 = trace("trace_filter_sampled_rank-0.json.gz");
  const fs::path r1 = trace("trace_filter_sampled_rank-1.json.gz");
  const json e0 = loadEvents(r0), e1 = loadEvents(r1);
  auto run = importOne({r1, r0});  // input order does not matter: the ranks come from distributedInfo
  ASSERT_TRUE(run);
  EXPECT_EQ(stats_.ranks, 2);
  for (auto [rank, events] : {std::pair<int, const json*>{0, &e0}, {1, &e1}}) {
    auto got = collectivesByOp(*run, rank);
    std::map<std::string, int> counts;
    for (const auto& [op, v] : got) counts[op] = v.first;
    EXPECT_EQ(counts, ncclAnnotationsByOp(*events)) << "rank " << rank;
    EXPECT_EQ(counts, (std::map<std::string, int>{{"all_gather", 2}, {"all_reduce", 4}, {"all_to_all", 4}}));
    const auto times = kernelTimeByOp(*events);
    int64_t expectedTotal = 0, gotTotal = 0;
    for (const auto& [name, ns] : times) expectedTotal += ns;
    for (const auto& [op, v] : got) gotTotal += v.second;
    EXPECT_EQ(gotTotal, expectedTotal) << "rank " << rank;
  }
  // Sizes are the input's: nccl:_all_gather_base's one tensor (16 MiB of int8), not c10d's 1 GiB output.
  auto gathers = run->collectives();
  ASSERT_TRUE(gathers);
  for (const auto& c : *gathers)
    if (c.op == "all_gather") {
      EXPECT_EQ(c.shape, (std::vector<int64_t>{16777216}));
      EXPECT_EQ(c.bytes, 16777216);
      EXPECT_EQ(c.dtype, "int8");
    }
  auto ranks = run->ranks();
  ASSERT_TRUE(ranks);
  ASSERT_EQ(ranks->size(), 2u);
  EXPECT_EQ((*ranks)[0].worldSize, 128);
  EXPECT_EQ((*ranks)[1].device, "cuda:1");
  // Without metadata every collective is in "default_pg", numbered by order per rank: each seq exists on both
  // ranks. These two ranks issue the all-to-alls (main thread) and the DDP all-reduces (autograd thread) from two
  // process groups in different interleavings, which the trace cannot tell apart: seqs 7 and 8 pair an all-to-all
  // with an all-reduce (the limit documented in docs/formats.md).
  auto cols = run->collectives();
  ASSERT_TRUE(cols);
  std::map<std::pair<std::string, int64_t>, std::set<std::string>> ops;
  std::map<std::pair<std::string, int64_t>, int> members;
  for (const auto& c : *cols) {
    EXPECT_EQ(c.group, "default_pg");
    ops[{c.group, c.seq}].insert(c.op);
    members[{c.group, c.seq}]++;
  }
  ASSERT_EQ(members.size(), 10u);
  std::set<int64_t> mixed;
  for (const auto& [key, set] : ops) {
    EXPECT_EQ(members[key], 2) << key.first << "#" << key.second;
    if (set.size() > 1) mixed.insert(key.second);
  }
  EXPECT_EQ(mixed, (std::set<int64_t>{7, 8}));
  // ... which the file says, so that the desync analysis does not take them for a desync.
  EXPECT_EQ(run->metaValue(tracedb::meta_keys::kSeqByOrder).value_or(""), "default_pg");
}

TEST_F(SharedKinetoTraces, LargeTraceWithManyCollectives) {
  const fs::path path = trace("negative_queue_length_values_check_rank0.json.gz");
  const json events = loadEvents(path);
  auto run = importOne({path});
  ASSERT_TRUE(run);
  auto got = collectivesByOp(*run);
  std::map<std::string, int> counts;
  for (const auto& [op, v] : got) counts[op] = v.first;
  EXPECT_EQ(counts, ncclAnnotationsByOp(events));
  EXPECT_EQ(counts, (std::map<std::string, int>{
                        {"all_gather", 10}, {"all_reduce", 10}, {"all_to_all", 55}, {"reduce_scatter", 10}}));
  int64_t expectedTotal = 0, gotTotal = 0;
  for (const auto& [name, ns] : kernelTimeByOp(events)) expectedTotal += ns;
  for (const auto& [op, v] : got) gotTotal += v.second;
  EXPECT_EQ(gotTotal, expectedTotal);
  auto spans = run->spanCount();
  ASSERT_TRUE(spans);
  int64_t complete = 0;
  for (const auto& e : events) complete += e.is_object() && e.value("ph", "") == "X";
  EXPECT_EQ(*spans, complete);
}

TEST_F(SharedKinetoTraces, CpuOnlyGlooTrace) {
  const fs::path path = trace("cpu_only_rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz");
  const json events = loadEvents(path);
  std::multiset<int64_t> durations;
  for (const auto& e : events)
    if (e.is_object() && e.value("name", "") == "gloo:all_reduce") durations.insert(usToNs(e["dur"]));
  auto run = importOne({path});
  ASSERT_TRUE(run);
  auto cols = run->collectives();
  ASSERT_TRUE(cols);
  EXPECT_EQ(cols->size(), 10u);
  std::multiset<int64_t> got;
  std::set<int64_t> numels;
  for (const auto& c : *cols) {
    EXPECT_EQ(c.rank, 34);
    EXPECT_EQ(c.op, "all_reduce");
    EXPECT_EQ(c.dtype, "float32");
    got.insert(*c.endNs - *c.startNs);
    numels.insert(c.numel);
  }
  EXPECT_EQ(got, durations);
  EXPECT_EQ(numels, (std::set<int64_t>{321271, 2082411}));
  // The trace's times are relative to baseTimeNanoseconds; the epoch is absolute.
  EXPECT_EQ(run->metaValue("epoch_unix_ns"), "1721065959525586016");
}

}  // namespace
}  // namespace tpscope::formats
