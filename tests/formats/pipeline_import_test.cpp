// Pipeline-parallel Chrome traces (issue #14): the names that carry ranks and schedules; a hand-written
// Megatron-style trace (fixtures/megatron_1f1b_pp2_tp2.json: 2 stages x 2 TP ranks, 4 micro-batches, 1F1B, stage 1
// twice as slow) whose bubble split and stage_imbalance finding the test computes itself from the fixture's events,
// by the rules docs/formats.md states; bad and partial inputs counted, never a crash.
#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <nlohmann/json.hpp>

#include "pipeline_names.h"
#include "test_support.h"
#include "tpscope/analysis/diagnose.h"
#include "tpscope/analysis/pipeline.h"
#include "tpscope/formats/kineto_import.h"
#include "tpscope/tracedb/reader.h"

namespace tpscope::formats {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;
using testing::ScratchDir;
using testing::fixture;

TEST(ChromePipelineNames, RanksFromProcessAndThreadNames) {
  using kineto::coordsFromName;
  auto c = coordsFromName("PP rank 2, TP rank 0");
  EXPECT_EQ(c.pp, 2);
  EXPECT_EQ(c.tp, 0);
  EXPECT_FALSE(c.rank);
  c = coordsFromName("pp_rank=1 tp_rank=3 dp_rank=2");
  EXPECT_EQ(c.pp, 1);
  EXPECT_EQ(c.tp, 3);
  EXPECT_EQ(c.dp, 2);
  c = coordsFromName("PP2 TP1");
  EXPECT_EQ(c.pp, 2);
  EXPECT_EQ(c.tp, 1);
  c = coordsFromName("rank 5 (node-a) tp 1/2 dp 0/1 pp 1/2");  // tpscope's export
  EXPECT_EQ(c.rank, 5);
  EXPECT_EQ(c.tp, 1);
  EXPECT_EQ(c.tpSize, 2);
  EXPECT_EQ(c.dpSize, 1);
  EXPECT_EQ(c.pp, 1);
  EXPECT_EQ(c.ppSize, 2);
  EXPECT_EQ(coordsFromName("global_rank=7").rank, 7);
  c = coordsFromName("rank 3 (pp07.cluster) pp 1/2");  // a host name is not read
  EXPECT_EQ(c.rank, 3);
  EXPECT_EQ(c.pp, 1);
  // Names that carry no rank: Kineto's own thread and process names, a stage without its number.
  for (const char* none : {"thread 1074 (pt_main_thread)", "pyper:trainer:0:0", "python3.10", "stream 7", "main",
                           "GPU 0", "http 2"})
    EXPECT_FALSE(coordsFromName(none).any()) << none;
  c = coordsFromName("PP rank, TP rank 0");
  EXPECT_FALSE(c.pp);
  EXPECT_EQ(c.tp, 0);
}

TEST(ChromePipelineNames, PassAndTransferNames) {
  using kineto::PipeName;
  using kineto::pipelineName;
  EXPECT_EQ(pipelineName("forward-compute").role, PipeName::Role::Pass);
  EXPECT_FALSE(pipelineName("backward_compute").forward);
  const PipeName native = pipelineName("backward mb 3 chunk 1");
  EXPECT_EQ(native.role, PipeName::Role::Pass);
  EXPECT_EQ(native.microbatch, 3);
  EXPECT_EQ(native.chunk, 1);
  EXPECT_EQ(pipelineName("forward mb 12").chunk, -1);
  const PipeName both = pipelineName("backward-send-forward-recv");
  ASSERT_EQ(both.messageCount, 2);
  EXPECT_TRUE(both.messages[0].send);
  EXPECT_FALSE(both.messages[0].activation);
  EXPECT_FALSE(both.messages[1].send);
  EXPECT_TRUE(both.messages[1].activation);
  EXPECT_EQ(pipelineName("Forward-Recv").messageCount, 1);
  for (const char* none : {"forward", "recv", "send wait", "forward mb", "forward mb x", "aten::mm", "optimizer"})
    EXPECT_EQ(pipelineName(none).role, PipeName::Role::None) << none;
  EXPECT_EQ(kineto::pipelineCallsite({true, true}, 3), "pipeline activation of micro-batch 3 forward send");
  EXPECT_EQ(kineto::pipelineCallsite({false, false}, 0), "pipeline activation gradient of micro-batch 0 backward recv");
}

// ---- Intervals, for the test's own reading of the fixture (µs). ----
using Iv = std::vector<std::pair<double, double>>;
Iv merged(Iv v) {
  std::sort(v.begin(), v.end());
  Iv out;
  for (auto [b, e] : v) {
    if (e <= b) continue;
    if (!out.empty() && b <= out.back().second) out.back().second = std::max(out.back().second, e);
    else out.push_back({b, e});
  }
  return out;
}
Iv intersect(const Iv& a, const Iv& b) {
  Iv out;
  for (auto [x0, x1] : merged(a))
    for (auto [y0, y1] : merged(b))
      if (std::max(x0, y0) < std::min(x1, y1)) out.push_back({std::max(x0, y0), std::min(x1, y1)});
  return merged(out);
}
Iv subtract(const Iv& a, const Iv& b) {
  Iv out = merged(a);
  for (auto [y0, y1] : merged(b)) {
    Iv next;
    for (auto [x0, x1] : out) {
      if (y1 <= x0 || y0 >= x1) next.push_back({x0, x1});
      else {
        if (x0 < y0) next.push_back({x0, y0});
        if (y1 < x1) next.push_back({y1, x1});
      }
    }
    out = next;
  }
  return out;
}
double total(const Iv& v) {
  double t = 0;
  for (auto [b, e] : merged(v)) t += e - b;
  return t;
}

struct Ev {
  std::string name;
  double b, e;
};

// The fixture's events per rank (rank = pp * 2 + tp, Megatron's order with TP 2) and step (split at "optimizer").
std::map<int, std::vector<std::vector<Ev>>> readFixture(const json& doc) {
  std::map<int, int> rankOfPid;
  for (const auto& e : doc["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "process_name") {
      const std::string n = e["args"]["name"];  // "PP rank S, TP rank T"
      rankOfPid[e["pid"].get<int>()] = (n[8] - '0') * 2 + (n[19] - '0');
    }
  std::map<int, std::vector<std::vector<Ev>>> out;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] != "X") continue;
    auto& steps = out[rankOfPid.at(e["pid"].get<int>())];
    if (steps.empty()) steps.emplace_back();
    const double b = e["ts"].get<double>(), d = e["dur"].get<double>();
    if (e["name"] == "optimizer") steps.emplace_back();
    else steps.back().push_back({e["name"], b, b + d});
  }
  for (auto& [rank, steps] : out)
    if (steps.back().empty()) steps.pop_back();
  return out;
}

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

struct Expected {
  double window = 0, compute = 0, transfer = 0, structural = 0, dependency = 0;
  std::vector<double> own;
};

// The bubble split by the rules of docs/diagnosis.md and docs/formats.md, from the fixture's own events: a receive
// waits from the end of the rank's previous event in the step, is a transfer from when its sender's span began (the
// k-th send of a directed pair with the k-th receive), and a send-only span is a transfer.
std::map<int, Expected> expectedSplit(const std::map<int, std::vector<std::vector<Ev>>>& ranks) {
  // Message post times per (tp, activation?) in order: activations from stage 0, gradients from stage 1.
  std::map<std::pair<int, bool>, std::vector<double>> posted;
  for (int tp = 0; tp < 2; ++tp)
    for (bool activation : {true, false})
      for (const auto& step : ranks.at((activation ? 0 : 2) + tp))
        for (const Ev& e : step)
          if (contains(e.name, activation ? "forward-send" : "backward-send")) posted[{tp, activation}].push_back(e.b);
  std::map<int, Expected> out;
  for (int tp = 0; tp < 2; ++tp) {
    std::map<std::pair<int, bool>, size_t> received;  // (tp, activation) -> receives so far
    for (size_t st = 0; st < ranks.at(tp).size(); ++st) {
      double w0 = 1e18, w1 = -1e18;
      for (int stage = 0; stage < 2; ++stage)
        for (const Ev& e : ranks.at(stage * 2 + tp)[st])
          if (contains(e.name, "-compute")) w0 = std::min(w0, e.b), w1 = std::max(w1, e.e);
      for (int stage = 0; stage < 2; ++stage) {
        const auto& events = ranks.at(stage * 2 + tp)[st];
        Iv passes, transfers;
        double firstBackward = w1, lastForwardEnd = w0;
        for (size_t k = 0; k < events.size(); ++k) {
          const Ev& e = events[k];
          if (contains(e.name, "-compute")) {
            passes.push_back({e.b, e.e});
            if (e.name[0] == 'b') firstBackward = std::min(firstBackward, e.b);
            else lastForwardEnd = std::max(lastForwardEnd, e.e);
            continue;
          }
          const bool recvActivation = contains(e.name, "forward-recv"), recvGradient = contains(e.name, "backward-recv");
          if (!recvActivation && !recvGradient) {  // a send-only span: blocked in the send
            transfers.push_back({e.b, e.e});
            continue;
          }
          const double waitFrom = k > 0 ? events[k - 1].e : e.b;
          const double post = posted.at({tp, recvActivation})[received[{tp, recvActivation}]++];
          transfers.push_back({std::max(waitFrom, post), e.e});
        }
        const Iv win{{w0, w1}};
        const Iv compute = intersect(passes, win);
        const Iv idle = subtract(win, compute);
        const Iv transfer = intersect(transfers, idle);
        const Iv rest = subtract(idle, transfer);
        const double structural = total(intersect(rest, {{w0, firstBackward}, {lastForwardEnd, w1}}));
        Expected& x = out[stage];
        x.window += w1 - w0;
        x.compute += total(compute);
        x.own.push_back(total(compute));
        x.transfer += total(transfer);
        x.structural += structural;
        x.dependency += total(rest) - structural;
      }
    }
  }
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

TEST(ChromePipelineImport, MegatronTraceBubbleAndImbalanceFromItsOwnNumbers) {
  ScratchDir dir;
  const fs::path trace = fixture("megatron_1f1b_pp2_tp2.json");
  const std::vector<fs::path> inputs{trace};
  auto stats = importChrome(inputs, dir / "run.db");
  ASSERT_TRUE(stats) << stats.error();
  EXPECT_EQ(stats->ranks, 4);
  EXPECT_TRUE(stats->skipped.empty()) << stats->summary();
  EXPECT_EQ(stats->collectives, 2 * 2 * 2 * 2 * 4);  // 2 pipelines x 2 directions x 2 sides x 2 steps x 4 mbs

  auto reader = tracedb::Reader::open(dir / "run.db");
  ASSERT_TRUE(reader) << reader.error();
  const json meta = json::parse(*(*reader)->metaValue("pipeline"));
  EXPECT_EQ(meta["schedule"], "1f1b");
  EXPECT_EQ(meta["stages"], 2);
  EXPECT_EQ(meta["microbatches"], 4);
  EXPECT_EQ(meta["virtual_stages"], 1);
  EXPECT_EQ(meta["stage_of_rank"], json({0, 0, 1, 1}));  // "PP rank 1, TP rank 0" is global rank 2
  auto ranks = (*reader)->ranks();
  ASSERT_TRUE(ranks);
  ASSERT_EQ(ranks->size(), 4u);
  EXPECT_EQ((*ranks)[3].tpRank, 1);
  EXPECT_EQ((*ranks)[3].tpSize, 2);

  const json doc = json::parse(testing::readFile(trace));
  const auto events = readFixture(doc);
  ASSERT_EQ(events.size(), 4u);
  ASSERT_EQ(events.at(0).size(), 2u);  // two steps, each ended by its optimizer span
  const std::map<int, Expected> want = expectedSplit(events);

  // Stage 0's receive spans show only the transfer: each receive record waits from the end of the rank's previous
  // event (times from the trace's first event, 1000 µs, in ns), its transfer is the span.
  std::vector<std::pair<int64_t, int64_t>> waits;  // (enqueue, start) of rank 0's receives, in order
  for (const auto& step : events.at(0))
    for (size_t k = 0; k < step.size(); ++k)
      if (contains(step[k].name, "recv"))
        waits.push_back({static_cast<int64_t>((k > 0 ? step[k - 1].e : step[k].b) - 1000) * 1000,
                         static_cast<int64_t>(step[k].b - 1000) * 1000});
  auto colls = (*reader)->collectives();
  ASSERT_TRUE(colls);
  std::vector<std::pair<int64_t, int64_t>> recorded;
  for (const auto& c : *colls)
    if (c.rank == 0 && c.op == "recv") recorded.push_back({c.enqueueNs, c.startNs.value_or(-1)});
  std::sort(recorded.begin(), recorded.end());
  ASSERT_EQ(recorded, waits);
  EXPECT_LT(waits[1].first, waits[1].second);  // a real wait before the transfer

  auto rep = analysis::analyzePipeline(**reader);
  ASSERT_TRUE(rep) << rep.error();
  ASSERT_TRUE(rep->present);
  EXPECT_EQ(rep->steps, 2);
  ASSERT_EQ(rep->perStage.size(), 2u);
  double ownSum = 0, ownMax = 0;
  for (int stage = 0; stage < 2; ++stage) {
    const Expected& x = want.at(stage);
    const analysis::PipelineStageBubble& got = rep->perStage[static_cast<size_t>(stage)];
    const double samples = 4;  // 2 ranks x 2 steps
    EXPECT_NEAR(got.stepNs, 1000 * x.window / samples, 1e-6) << "stage " << stage;
    EXPECT_NEAR(got.computeNs, 1000 * x.compute / samples, 1e-6) << "stage " << stage;
    EXPECT_NEAR(got.transferPct, 100 * x.transfer / x.window, 1e-9) << "stage " << stage;
    EXPECT_NEAR(got.warmupCooldownPct, 100 * x.structural / x.window, 1e-9) << "stage " << stage;
    EXPECT_NEAR(got.dependencyWaitPct, 100 * x.dependency / x.window, 1e-9) << "stage " << stage;
    EXPECT_NEAR(got.ownComputeNs, 1000 * median(x.own), 1e-6) << "stage " << stage;
    ownSum += median(x.own);
    ownMax = std::max(ownMax, median(x.own));
  }
  // The slow stage's waits are the fast stage's: stage 0 waits on stage 1 in the steady state, a real transfer
  // share remains, and stage 1 (forward 20 µs, backward 40 µs per micro-batch) is the longest.
  EXPECT_GT(want.at(0).dependency, 0);
  EXPECT_GT(want.at(0).transfer, 0);
  EXPECT_EQ(rep->longestStage, 1);
  const double overMean = 100 * (ownMax / (ownSum / 2) - 1);
  EXPECT_NEAR(rep->longestOverMeanPct, overMean, 1e-9);
  EXPECT_NEAR(overMean, 100.0 / 3, 1e-9);  // 240 µs vs the mean of 120 and 240

  // stage_imbalance: a warning where the stage is >= 25 % over the mean and the others wait on it >= 5 %.
  const double othersWait = 100 * want.at(0).dependency / want.at(0).window;
  auto diag = analysis::diagnose(**reader);
  std::vector<analysis::Finding> imbalance;
  for (const auto& f : diag.findings) {
    if (f.kind == analysis::FindingKind::StageImbalance) imbalance.push_back(f);
    // The waits are the schedule's (pipeline.h), not ranks arriving late: no straggler, hang or desync.
    EXPECT_TRUE(f.kind != analysis::FindingKind::Straggler && f.kind != analysis::FindingKind::Hang &&
                f.kind != analysis::FindingKind::PipelineHang && f.kind != analysis::FindingKind::Desync)
        << f.message;
  }
  ASSERT_EQ(imbalance.size(), 1u);
  EXPECT_EQ(imbalance[0].severity,
            overMean >= 25 && othersWait >= 5 ? analysis::Severity::Warning : analysis::Severity::Info);
  EXPECT_EQ(imbalance[0].ranks, std::vector<int>({2, 3}));
  EXPECT_TRUE(diag.errors.empty());
}

// One Chrome trace of `events` (JSON objects, comma-separated) in `dir`.
fs::path writeTrace(const ScratchDir& dir, const std::string& name, const std::string& events) {
  const fs::path p = dir / name;
  testing::writeFile(p, "{\"traceEvents\": [" + events + "]}");
  return p;
}

std::string process(int pid, const std::string& name) {
  return R"({"ph":"M","name":"process_name","pid":)" + std::to_string(pid) + R"(,"tid":0,"args":{"name":")" + name +
         "\"}}";
}
std::string span(int pid, const std::string& name, int ts, int dur, const std::string& args = "") {
  return R"({"ph":"X","cat":"user_annotation","pid":)" + std::to_string(pid) + ",\"tid\":" + std::to_string(pid) +
         R"(,"name":")" + name + "\",\"ts\":" + std::to_string(ts) + ",\"dur\":" + std::to_string(dur) +
         (args.empty() ? "" : ",\"args\":" + args) + "}";
}

std::map<std::string, int64_t> skippedOf(const fs::path& run) {
  auto reader = tracedb::Reader::open(run);
  EXPECT_TRUE(reader);
  std::map<std::string, int64_t> out;
  const json skipped = json::parse((*reader)->metaValue("kineto_import_skipped").value_or("{}"));
  for (auto it = skipped.begin(); it != skipped.end(); ++it) out[it.key()] = it.value().get<int64_t>();
  // The analyses run on whatever was imported.
  auto diag = analysis::diagnose(**reader);
  EXPECT_TRUE(diag.errors.empty());
  return out;
}

TEST(ChromePipelineImport, StageNameWithoutARankIsCountedNotGuessed) {
  ScratchDir dir;
  const fs::path trace = writeTrace(dir, "t.json",
                                    process(1, "PP rank, TP rank 0") + "," + process(2, "PP rank, TP rank 1") + "," +
                                        span(1, "forward-compute", 0, 10) + "," + span(1, "backward-compute", 10, 20) +
                                        "," + span(2, "forward-compute", 0, 10) + "," +
                                        span(2, "backward-compute", 10, 20) + "," + span(2, "backward-send", 30, 1));
  const std::vector<fs::path> inputs{trace};
  auto stats = importChrome(inputs, dir / "run.db");
  ASSERT_TRUE(stats) << stats.error();
  EXPECT_EQ(stats->ranks, 2);  // two ranks by their TP rank, no stage
  const auto skipped = skippedOf(dir / "run.db");
  EXPECT_EQ(skipped.at("pipeline passes on a rank whose stage is not named"), 2);
  EXPECT_EQ(skipped.at("pipeline passes but fewer than 2 stages named (no pipeline meta)"), 1);
  EXPECT_EQ(skipped.at("pipeline transfer on a rank whose stage is not named (no record)"), 1);
  auto reader = tracedb::Reader::open(dir / "run.db");
  ASSERT_TRUE(reader);
  EXPECT_FALSE((*reader)->metaValue("pipeline"));
}

TEST(ChromePipelineImport, UnmatchedSendsAndStrayEventsAreCounted) {
  ScratchDir dir;
  // Stage 0 sends two activations, stage 1 receives one; stage 1 also "sends forward" past the last stage; a
  // process without a rank in its name; a micro-batch id that is not a number.
  const std::string events =
      process(1, "pp_rank=0 tp_rank=0") + "," + process(2, "pp_rank=1 tp_rank=0") + "," + process(3, "dataloader") +
      "," + span(1, "forward-compute", 0, 10, R"({"mb_id":"x"})") + "," + span(1, "forward-send", 10, 1) + "," +
      span(1, "forward-compute", 11, 10) + "," + span(1, "forward-send", 21, 1) + "," +
      span(2, "forward-recv", 0, 11) + "," + span(2, "forward-compute", 11, 10) + "," +
      span(2, "forward-send", 21, 1) + "," + span(2, "backward-compute", 22, 20) + "," + span(3, "load", 0, 5);
  const fs::path trace = writeTrace(dir, "t.json", events);
  const std::vector<fs::path> inputs{trace};
  auto stats = importChrome(inputs, dir / "run.db");
  ASSERT_TRUE(stats) << stats.error();
  EXPECT_EQ(stats->ranks, 2);
  const auto skipped = skippedOf(dir / "run.db");
  EXPECT_EQ(skipped.at("pipeline send without a matching recv (no record)"), 1);
  EXPECT_EQ(skipped.at("pipeline transfer past the first or last stage (no record)"), 1);
  EXPECT_EQ(skipped.at("events of a process or thread without a rank in its name (file of several ranks)"), 1);
  auto reader = tracedb::Reader::open(dir / "run.db");
  ASSERT_TRUE(reader);
  auto colls = (*reader)->collectives();
  ASSERT_TRUE(colls);
  ASSERT_EQ(colls->size(), 2u);  // the matched pair only
  for (const auto& c : *colls) {
    EXPECT_EQ(c.group, "p2p-0-1");
    EXPECT_EQ(c.seq, 1);
    EXPECT_EQ(c.callsite, "pipeline activation of micro-batch 0 forward " + c.op);
  }
  EXPECT_TRUE((*reader)->metaValue("pipeline"));
}

std::string thread(int pid, int tid, const std::string& name) {
  return R"({"ph":"M","name":"thread_name","pid":)" + std::to_string(pid) + ",\"tid\":" + std::to_string(tid) +
         R"(,"args":{"name":")" + name + "\"}}";
}
std::string threadSpan(int tid, const std::string& name, int ts, int dur, const std::string& args) {
  return R"({"ph":"X","cat":"user_annotation","pid":1,"tid":)" + std::to_string(tid) + R"(,"name":")" + name +
         "\",\"ts\":" + std::to_string(ts) + ",\"dur\":" + std::to_string(dur) + ",\"args\":" + args + "}";
}

// Ranks as threads of one process ("pp_rank=S dp_rank=D"), two model chunks: global ranks in Megatron's order (DP
// before PP), schedule interleaved, chunk names, and the last stage's activations going around to the first stage.
TEST(ChromePipelineImport, InterleavedChunksOnThreadNamedDataParallelRanks) {
  ScratchDir dir;
  std::string events = process(1, "trainer");
  for (int pp = 0; pp < 2; ++pp)
    for (int dp = 0; dp < 2; ++dp) {
      const int tid = 10 + pp * 2 + dp;
      events += "," + thread(1, tid, "pp_rank=" + std::to_string(pp) + " dp_rank=" + std::to_string(dp));
      int t = 0;
      for (int chunk = 0; chunk < 2; ++chunk)
        for (int mb = 0; mb < 2; ++mb) {
          const std::string args = R"({"step":7,"mb_id":)" + std::to_string(mb) + R"(,"model_chunk":)" +
                                   std::to_string(chunk) + "}";
          if (pp == 0 && chunk == 1) events += "," + threadSpan(tid, "forward-recv", t, 1, args), t += 1;
          events += "," + threadSpan(tid, "forward-compute", t, 10, args), t += 10;
          if (pp == 1 && chunk == 0) events += "," + threadSpan(tid, "forward-send", t, 1, args), t += 1;
        }
      for (int chunk = 1; chunk >= 0; --chunk)
        for (int mb = 0; mb < 2; ++mb) {
          const std::string args = R"({"step":7,"mb_id":)" + std::to_string(mb) + R"(,"model_chunk":)" +
                                   std::to_string(chunk) + "}";
          events += "," + threadSpan(tid, "backward-compute", t, 20, args), t += 20;
        }
    }
  const fs::path trace = writeTrace(dir, "t.json", events);
  const std::vector<fs::path> inputs{trace};
  auto stats = importChrome(inputs, dir / "run.db");
  ASSERT_TRUE(stats) << stats.error();
  EXPECT_EQ(stats->ranks, 4);
  auto reader = tracedb::Reader::open(dir / "run.db");
  ASSERT_TRUE(reader);
  const json meta = json::parse(*(*reader)->metaValue("pipeline"));
  EXPECT_EQ(meta["schedule"], "interleaved");
  EXPECT_EQ(meta["virtual_stages"], 2);
  EXPECT_EQ(meta["microbatches"], 2);
  EXPECT_EQ(meta["stage_of_rank"], json({0, 0, 1, 1}));
  auto ranks = (*reader)->ranks();
  ASSERT_TRUE(ranks);
  EXPECT_EQ((*ranks)[1].dpRank, 1);
  EXPECT_EQ((*ranks)[1].dpSize, 2);
  auto spans = (*reader)->spans();
  ASSERT_TRUE(spans);
  int chunkOne = 0;
  for (const auto& sp : *spans) chunkOne += (*reader)->string(sp.name) == "forward mb 1 chunk 1" && sp.step == 7;
  EXPECT_EQ(chunkOne, 4);
  auto colls = (*reader)->collectives();
  ASSERT_TRUE(colls);
  std::map<std::string, int> byGroup;
  for (const auto& c : *colls) byGroup[c.group + " " + c.op]++;
  // Stage 1 (ranks 2, 3) sends each chunk-0 activation around to stage 0 of its own data-parallel replica.
  EXPECT_EQ(byGroup, (std::map<std::string, int>{
                         {"p2p-2-0 send", 2}, {"p2p-2-0 recv", 2}, {"p2p-3-1 send", 2}, {"p2p-3-1 recv", 2}}));
  auto rep = analysis::analyzePipeline(**reader);
  ASSERT_TRUE(rep) << rep.error();
  EXPECT_TRUE(rep->present);
  EXPECT_EQ(rep->virtualStages, 2);
}

TEST(ChromePipelineImport, DamagedPipelineTracesNeverCrash) {
  // The Megatron fixture with events dropped, digits changed (times, micro-batches, ranks in process names) and
  // timer names swapped: every import succeeds or fails naming the file, and the analyses run on what it wrote.
  ScratchDir dir;
  std::vector<std::string> lines;
  {
    std::istringstream in(testing::readFile(fixture("megatron_1f1b_pp2_tp2.json")));
    for (std::string line; std::getline(in, line);)
      if (line.rfind("{\"ph\"", 0) == 0) lines.push_back(line.back() == ',' ? line.substr(0, line.size() - 1) : line);
  }
  const std::vector<std::string> names{"forward-send", "backward-recv", "forward-send-backward-recv", "backward-send",
                                       "forward-recv", "backward-compute", "forward-compute", "optimizer"};
  uint64_t seed = 2026;
  auto next = [&seed] {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<size_t>(seed >> 33);
  };
  for (int round = 0; round < 40; ++round) {
    std::vector<std::string> damaged = lines;
    for (int k = 0; k < 4; ++k) {
      std::string& line = damaged[next() % damaged.size()];
      switch (next() % 3) {
        case 0: damaged.erase(damaged.begin() + static_cast<std::ptrdiff_t>(next() % damaged.size())); break;
        case 1:
          if (const size_t at = line.find_first_of("0123456789", next() % line.size()); at != std::string::npos)
            line[at] = static_cast<char>('0' + next() % 10);
          break;
        default:
          for (const std::string& n : names)
            if (const size_t at = line.find("\"" + n + "\""); at != std::string::npos) {
              line.replace(at + 1, n.size(), names[next() % names.size()]);
              break;
            }
      }
    }
    std::string text = "{\"traceEvents\": [\n";
    for (size_t k = 0; k < damaged.size(); ++k) text += (k ? ",\n" : "") + damaged[k];
    testing::writeFile(dir / "damaged.json", text + "\n]}\n");
    fs::remove(dir / "run.db");
    const std::vector<fs::path> inputs{dir / "damaged.json"};
    auto stats = importChrome(inputs, dir / "run.db");
    if (!stats) {
      EXPECT_NE(stats.error().find("damaged.json"), std::string::npos) << stats.error();
      EXPECT_FALSE(fs::exists(dir / "run.db"));
      continue;
    }
    auto reader = tracedb::Reader::open(dir / "run.db");
    ASSERT_TRUE(reader) << reader.error();
    EXPECT_TRUE(analysis::analyzePipeline(**reader)) << "round " << round;
    EXPECT_TRUE(analysis::diagnose(**reader).errors.empty()) << "round " << round;
  }
}

TEST(ChromePipelineImport, TracesWithoutPipelineNamesGetNoPipeline) {
  ScratchDir dir;
  const std::vector<fs::path> inputs{fixture("nccl_meta_rank-0.json")};
  ASSERT_TRUE(importChrome(inputs, dir / "run.db"));
  auto reader = tracedb::Reader::open(dir / "run.db");
  ASSERT_TRUE(reader);
  EXPECT_FALSE((*reader)->metaValue("pipeline"));
  EXPECT_EQ(*(*reader)->metaValue("source"), "chrome");
  EXPECT_EQ(*(*reader)->metaValue("tool"), "tpscope import chrome");
}

}  // namespace
}  // namespace tpscope::formats
