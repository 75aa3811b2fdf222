// Collectives of asynchronous backends (Gloo): the dispatcher's op on the calling thread enqueues a call, the
// backend's op on a worker thread executes it; the import must make one collective of the two. A hand-written
// trace covers the pairing rules; the shared Gloo CPU trace is counted independently here.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "test_support.h"
#include "tpscope/formats/kineto_import.h"
#include "tpscope/tracedb/reader.h"

namespace tpscope::formats {
namespace {

using namespace testing;
using nlohmann::json;

json op(const std::string& name, int tid, double ts, double dur, json args = json::object()) {
  return json{{"ph", "X"}, {"cat", name.rfind("gloo:", 0) == 0 ? "user_annotation" : "cpu_op"},
              {"name", name}, {"pid", 7}, {"tid", tid}, {"ts", ts}, {"dur", dur}, {"args", std::move(args)}};
}

// record_param_comms as PyTorch 2.x writes it inside c10d::<op>_ (µs; the caller is thread 100).
json paramComms(double ts, const std::string& collective, int64_t nelems, const std::string& pg, int64_t seq) {
  return op("record_param_comms", 100, ts, 5,
            json{{"Collective name", collective}, {"In msg nelems", nelems}, {"Out msg nelems", nelems},
                 {"dtype", "Float"}, {"Process Group Name", pg}, {"Process Group Ranks", "[0, 1]"},
                 {"Group size", 2}, {"Seq", seq}});
}

json gloo(const std::string& name, int tid, double ts, double dur, int64_t numel) {
  return op(name, tid, ts, dur, json{{"Input Dims", json::array({json::array({numel})})}, {"Input type", json::array({"float"})}});
}

// Process group "0" has worker threads 201 and 202, group "1" thread 301. Calls, in order of enqueueing:
//   t=100 all_reduce  1024 pg 0 seq 1  -> thread 201 [130, 630)
//   t=150 all_reduce  1024 pg 1 seq 1  -> thread 301 [900, 950)   (its worker starts late)
//   t=200 all_reduce  1024 pg 0 seq 2  -> thread 201 [640, 700)   (the earliest open all_reduce of 1024 is pg 1's:
//                                                                   thread 201 serves pg 0, so it is not that one)
//   t=300 all_reduce  4096 pg 0 seq 3  -> thread 202 [310, 600)   (runs beside the first: its own size)
//   t=400 broadcast     16 pg 0 seq 4  -> thread 201 [710, 720)
//   t=500 all_reduce  4096 pg 0 seq 5  -> never executed in the window (the trace ends first)
json gloojob() {
  json ev = json::array();
  ev.push_back(op("ProfilerStep#3", 100, 0, 1000));
  auto call = [&](double ts, const char* dispatcher, const char* collective, int64_t nelems, const char* pg,
                  int64_t seq) {
    ev.push_back(op(dispatcher, 100, ts, 20));
    ev.push_back(paramComms(ts + 1, collective, nelems, pg, seq));
  };
  call(100, "c10d::allreduce_", "allreduce", 1024, "0", 1);
  call(150, "c10d::allreduce_", "allreduce", 1024, "1", 1);
  call(200, "c10d::allreduce_", "allreduce", 1024, "0", 2);
  call(300, "c10d::allreduce_", "allreduce", 4096, "0", 3);
  call(400, "c10d::broadcast_", "broadcast", 16, "0", 4);
  call(500, "c10d::allreduce_", "allreduce", 4096, "0", 5);
  ev.push_back(gloo("gloo:all_reduce", 201, 130, 500, 1024));
  ev.push_back(gloo("gloo:all_reduce", 301, 900, 50, 1024));
  ev.push_back(gloo("gloo:all_reduce", 201, 640, 60, 1024));
  ev.push_back(gloo("gloo:all_reduce", 202, 310, 290, 4096));
  ev.push_back(gloo("gloo:broadcast", 201, 710, 10, 16));
  return json{{"traceEvents", ev}, {"distributedInfo", {{"rank", 0}, {"world_size", 2}, {"backend", "gloo"}}}};
}

TEST(KinetoAsyncCollectives, DispatcherAndBackendOpAreOneCollective) {
  ScratchDir dir;
  const json trace = gloojob();
  writeFile(dir / "gloo_rank0.json", trace.dump());
  int dispatcherOps = 0;  // independent count: one call per dispatcher op
  for (const auto& e : trace["traceEvents"]) dispatcherOps += e["name"].get<std::string>().rfind("c10d::", 0) == 0;
  const std::vector<fs::path> inputs{dir / "gloo_rank0.json"};
  auto stats = importKineto(inputs, dir / "run.db");
  ASSERT_TRUE(stats) << stats.error();
  EXPECT_EQ(stats->collectives, dispatcherOps);
  auto run = tracedb::Reader::open(dir / "run.db");
  ASSERT_TRUE(run) << run.error();
  auto cols = (*run)->collectives();
  ASSERT_TRUE(cols) << cols.error();
  ASSERT_EQ(cols->size(), 6u);
  struct Want {
    const char* group;
    int64_t seq;
    const char* op;
    int64_t numel, enqueueUs, startUs, endUs;
  };
  const Want want[] = {
      {"0", 1, "all_reduce", 1024, 100, 130, 630}, {"0", 2, "all_reduce", 1024, 200, 640, 700},
      {"0", 3, "all_reduce", 4096, 300, 310, 600}, {"0", 4, "broadcast", 16, 400, 710, 720},
      {"0", 5, "all_reduce", 4096, 500, 501, 506},  // no execution: the dispatcher's innermost op, as before
      {"1", 1, "all_reduce", 1024, 150, 900, 950},
  };
  std::set<std::pair<std::string, int64_t>> seen;
  for (const auto& c : *cols) {
    EXPECT_TRUE(seen.emplace(c.group, c.seq).second) << c.group << " seq " << c.seq << " twice";
    const Want* w = nullptr;
    for (const Want& x : want)
      if (c.group == x.group && c.seq == x.seq) w = &x;
    ASSERT_NE(w, nullptr) << c.group << " seq " << c.seq;
    SCOPED_TRACE(std::string(w->group) + " seq " + std::to_string(w->seq));
    EXPECT_EQ(c.op, w->op);
    EXPECT_EQ(c.numel, w->numel);
    EXPECT_EQ(c.bytes, w->numel * 4);
    // Times are relative to the earliest event (ProfilerStep#3 at 0 µs).
    EXPECT_EQ(c.enqueueNs, w->enqueueUs * 1000);
    EXPECT_EQ(c.startNs, w->startUs * 1000);
    EXPECT_EQ(c.endNs, w->endUs * 1000);
    EXPECT_EQ(c.thread, 0);  // the calling thread, as c10d's flight recorder keeps it
    EXPECT_EQ(c.callsite, w->op == std::string("broadcast") ? "c10d::broadcast_" : "c10d::allreduce_");
  }
}

// Without dispatcher ops (older PyTorch, or a trace whose calling thread was filtered out) each backend op is a
// collective of its own, numbered in order of begin — as the shared CPU trace shows.
TEST(KinetoAsyncCollectives, SharedGlooTraceCountsEachCallOnce) {
  const fs::path path = sharedKineto() / "cpu_only_rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz";
  if (!fs::exists(path)) GTEST_SKIP() << "shared Kineto trace not found: " << path;
  // Independent count: every call of this trace executed inside the profiler window, so each is exactly one
  // backend op (gloo:...); a dispatcher op (c10d::...) is the same call seen from its caller, never one more.
  int backendOps = 0, dispatcherOps = 0;
  for (const auto& e : loadEvents(path)) {
    if (!e.is_object() || e.value("ph", "") != "X") continue;
    const std::string name = e.value("name", "");
    backendOps += name.rfind("gloo:", 0) == 0;
    dispatcherOps += name.rfind("c10d::", 0) == 0;
  }
  const int expected = backendOps;
  EXPECT_EQ(expected, 10);
  EXPECT_LE(dispatcherOps, backendOps);
  ScratchDir dir;
  const std::vector<fs::path> inputs{path};
  auto stats = importKineto(inputs, dir / "run.db");
  ASSERT_TRUE(stats) << stats.error();
  EXPECT_EQ(stats->collectives, expected);
  auto run = tracedb::Reader::open(dir / "run.db");
  ASSERT_TRUE(run) << run.error();
  auto cols = (*run)->collectives();
  ASSERT_TRUE(cols);
  std::set<int64_t> seqs;
  for (const auto& c : *cols) seqs.insert(c.seq);
  EXPECT_EQ(seqs.size(), cols->size());
  EXPECT_EQ(*seqs.begin(), 1);
  EXPECT_EQ(*seqs.rbegin(), expected);
}

}  // namespace
}  // namespace tpscope::formats
