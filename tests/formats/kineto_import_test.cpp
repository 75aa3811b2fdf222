// Kineto import on the small fixtures (excerpts of the HTA traces, see fixtures/make_fixtures.py): object and array
// form, plain and gzip, several ranks, bad input.
#include "tpscope/formats/kineto_import.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "test_support.h"
#include "tpscope/tracedb/reader.h"

namespace tpscope::formats {
namespace {

using namespace testing;
using nlohmann::json;

std::unique_ptr<tracedb::Reader> openRun(const fs::path& path) {
  auto r = tracedb::Reader::open(path);
  EXPECT_TRUE(r) << r.error();
  return r ? std::move(*r) : nullptr;
}

tracedb::Result<KinetoImportStats> import(std::vector<fs::path> inputs, const fs::path& output) {
  return importKineto(inputs, output);
}

// Complete events the importer must keep: objects with ph "X", ts, dur, pid and tid.
int64_t completeEvents(const json& events) {
  int64_t n = 0;
  for (const auto& e : events)
    if (e.is_object() && e.value("ph", "") == "X" && e.contains("ts") && e.contains("dur") && e.contains("pid") &&
        e.contains("tid"))
      ++n;
  return n;
}

TEST(KinetoImport, ObjectFormWithMetadata) {
  ScratchDir dir;
  const fs::path input = fixture("nccl_meta_rank-0.json");
  auto stats = import({input}, dir / "run.db");
  ASSERT_TRUE(stats) << stats.error();
  EXPECT_EQ(stats->files, 1);
  EXPECT_EQ(stats->ranks, 1);
  EXPECT_EQ(stats->collectives, 2);
  EXPECT_EQ(stats->counters, 2);
  const json events = loadEvents(input);
  EXPECT_EQ(stats->spans, completeEvents(events));
  // Not fatal, counted per kind: the hand-made malformed and unsupported events.
  EXPECT_EQ(stats->skipped["instant event (not imported)"], 1);
  EXPECT_EQ(stats->skipped["malformed complete event (no ts or dur)"], 1);
  EXPECT_EQ(stats->skipped["malformed event (not an object)"], 1);
  EXPECT_EQ(stats->skipped["phase 'q' (not imported)"], 1);
  EXPECT_NE(stats->summary().find("2 collectives"), std::string::npos) << stats->summary();

  auto run = openRun(dir / "run.db");
  ASSERT_TRUE(run);
  EXPECT_EQ(run->metaValue("source"), "kineto");
  EXPECT_NE(run->metaValue("kineto_import_skipped").value_or("").find("\"phase 'q' (not imported)\":1"),
            std::string::npos);
  auto cols = run->collectives();
  ASSERT_TRUE(cols) << cols.error();
  ASSERT_EQ(cols->size(), 2u);
  // Sorted by (group, seq): the broadcast (Seq 11), then the all-reduce (Seq 12), both from the metadata.
  const auto& bc = (*cols)[0];
  const auto& ar = (*cols)[1];
  EXPECT_EQ(bc.group, "0");
  EXPECT_EQ(bc.seq, 11);
  EXPECT_EQ(bc.op, "broadcast");
  EXPECT_EQ(bc.dtype, "float32");
  EXPECT_EQ(bc.numel, 53120);
  EXPECT_EQ(bc.bytes, 53120 * 4);
  EXPECT_EQ(ar.seq, 12);
  EXPECT_EQ(ar.op, "all_reduce");
  EXPECT_EQ(ar.numel, 2049000);
  EXPECT_EQ(ar.bytes, 2049000LL * 4);
  EXPECT_EQ(ar.phase, tracedb::Phase::Backward);  // inside autograd::engine::evaluate_function
  EXPECT_EQ(ar.step, 4);                          // inside ProfilerStep#4
  EXPECT_EQ(ar.state, tracedb::CollectiveState::Completed);
  EXPECT_EQ(ar.callsite, "c10d::allreduce_");

  // Durations are the NCCL kernels' (linked through the launch's correlation id), enqueue is the host op's.
  std::map<std::string, int64_t> kernelNs, hostBeginUs;
  for (const auto& e : events) {
    if (!e.is_object() || e.value("ph", "") != "X") continue;
    const json args = e.value("args", json::object());
    if (e.value("cat", "") == "kernel" && args.contains("Collective name"))
      kernelNs[args["Collective name"].get<std::string>()] += usToNs(e["dur"]);
  }
  EXPECT_EQ(*bc.endNs - *bc.startNs, kernelNs["broadcast"]);
  EXPECT_EQ(*ar.endNs - *ar.startNs, kernelNs["allreduce"]);
  EXPECT_EQ(*ar.endNs - *ar.startNs, 3306963);  // pinned: 3306.963 µs in the file
  EXPECT_LT(ar.enqueueNs, *ar.startNs);

  auto groups = run->groups();
  ASSERT_TRUE(groups);
  ASSERT_EQ(groups->size(), 1u);
  EXPECT_EQ((*groups)[0].name, "0");
  EXPECT_EQ((*groups)[0].ranks, (std::vector<int>{0, 1}));
  EXPECT_EQ((*groups)[0].backend, "nccl");

  auto threads = run->threads();
  ASSERT_TRUE(threads);
  std::set<std::string> streams;
  for (const auto& t : *threads)
    if (t.kind == "cuda-stream") streams.insert(t.name);
  EXPECT_EQ(streams, (std::set<std::string>{"stream 7", "stream 40"}));

  std::map<tracedb::SpanKind, int> kinds;
  auto spans = run->spans();
  ASSERT_TRUE(spans);
  for (const auto& s : *spans) kinds[s.kind]++;
  EXPECT_EQ(kinds[tracedb::SpanKind::NcclKernel], 2);
  EXPECT_EQ(kinds[tracedb::SpanKind::Memcpy], 1);
  EXPECT_EQ(kinds[tracedb::SpanKind::Wait], 1);  // record_param_comms "wait": not a collective
  EXPECT_EQ(kinds[tracedb::SpanKind::Step], 1);
  EXPECT_EQ(kinds[tracedb::SpanKind::Comm], 6);  // c10d op, record_param_comms, nccl: annotation, twice

  auto counters = run->counters();
  ASSERT_TRUE(counters);
  ASSERT_EQ(counters->size(), 2u);
  EXPECT_EQ((*counters)[0].name, "Memory/Total Allocated");
  EXPECT_DOUBLE_EQ((*counters)[0].value, 123456789.0);
  EXPECT_DOUBLE_EQ((*counters)[1].value, 2000000000.5);

  // Times: ns since the earliest event; the epoch is baseTimeNanoseconds + that event's ts.
  auto range = run->timeRange();
  ASSERT_TRUE(range);
  EXPECT_GE(range->beginNs, 0);
  auto ranks = run->ranks();
  ASSERT_TRUE(ranks);
  ASSERT_EQ(ranks->size(), 1u);
  EXPECT_EQ((*ranks)[0].startNs, 0);
  EXPECT_EQ((*ranks)[0].worldSize, 2);
  EXPECT_EQ((*ranks)[0].device, "cuda:0");
  EXPECT_EQ(run->metaValue("epoch_unix_ns"), "1716423322416788066");  // base + ProfilerStep#4 ts
}

TEST(KinetoImport, GzipAndPlainGiveTheSameRun) {
  ScratchDir dir;
  auto plain = import({fixture("nccl_meta_rank-0.json")}, dir / "plain.db");
  auto gz = import({fixture("nccl_meta_rank-0.json.gz")}, dir / "gz.db");
  ASSERT_TRUE(plain) << plain.error();
  ASSERT_TRUE(gz) << gz.error();
  EXPECT_EQ(plain->inputBytes, gz->inputBytes);
  EXPECT_EQ(plain->spans, gz->spans);
  auto a = openRun(dir / "plain.db");
  auto b = openRun(dir / "gz.db");
  auto ca = a->collectives();
  auto cb = b->collectives();
  ASSERT_TRUE(ca && cb);
  ASSERT_EQ(ca->size(), cb->size());
  for (size_t i = 0; i < ca->size(); ++i) {
    EXPECT_EQ((*ca)[i].seq, (*cb)[i].seq);
    EXPECT_EQ((*ca)[i].startNs, (*cb)[i].startNs);
    EXPECT_EQ((*ca)[i].endNs, (*cb)[i].endNs);
  }
  auto sa = a->spans();
  auto sb = b->spans();
  ASSERT_TRUE(sa && sb);
  ASSERT_EQ(sa->size(), sb->size());
  for (size_t i = 0; i < sa->size(); ++i) {
    EXPECT_EQ((*sa)[i].beginNs, (*sb)[i].beginNs);
    EXPECT_EQ((*sa)[i].durNs, (*sb)[i].durNs);
    EXPECT_EQ(a->string((*sa)[i].name), b->string((*sb)[i].name));
  }
}

TEST(KinetoImport, ArrayFormTakesTheRankFromTheFileName) {
  ScratchDir dir;
  const fs::path input = fixture("gloo_array_rank3.json");
  auto stats = import({input}, dir / "run.db");
  ASSERT_TRUE(stats) << stats.error();
  auto run = openRun(dir / "run.db");
  auto ranks = run->ranks();
  ASSERT_TRUE(ranks);
  ASSERT_EQ(ranks->size(), 1u);
  EXPECT_EQ((*ranks)[0].rank, 3);

  // No metadata: every gloo:all_reduce is one collective of the default group, numbered in order of enqueueing,
  // sized from its "Input Dims"; without GPU kernels the duration is the host op's.
  std::vector<int64_t> durations;
  for (const auto& e : loadEvents(input))
    if (e.value("name", "") == "gloo:all_reduce") durations.push_back(usToNs(e["dur"]));
  ASSERT_EQ(durations.size(), 3u);
  auto cols = run->collectives();
  ASSERT_TRUE(cols);
  ASSERT_EQ(cols->size(), 3u);
  int64_t prevEnqueue = -1;
  std::multiset<int64_t> got(durations.begin(), durations.end()), imported;
  for (size_t i = 0; i < cols->size(); ++i) {
    const auto& c = (*cols)[i];
    EXPECT_EQ(c.rank, 3);
    EXPECT_EQ(c.group, "default_pg");
    EXPECT_EQ(c.seq, static_cast<int64_t>(i) + 1);  // 1-based, like c10d's
    EXPECT_EQ(c.op, "all_reduce");
    EXPECT_EQ(c.dtype, "float32");
    EXPECT_EQ(c.shape, (std::vector<int64_t>{321271}));
    EXPECT_EQ(c.bytes, 321271 * 4);
    EXPECT_GT(c.enqueueNs, prevEnqueue);
    prevEnqueue = c.enqueueNs;
    imported.insert(*c.endNs - *c.startNs);
  }
  EXPECT_EQ(imported, got);
}

TEST(KinetoImport, SeveralRanksAreAlignedAndJoinedBySequence) {
  ScratchDir dir;
  auto stats = import({fixture("nccl_meta_rank-0.json"), fixture("nccl_meta_rank-1.json")}, dir / "run.db");
  ASSERT_TRUE(stats) << stats.error();
  EXPECT_EQ(stats->ranks, 2);
  auto run = openRun(dir / "run.db");
  auto cols = run->collectives();
  ASSERT_TRUE(cols);
  ASSERT_EQ(cols->size(), 4u);
  // (group, seq) joins the ranks; rank 1's trace has a base 1 ms later and ts 750 µs earlier: 250 µs after rank 0.
  for (size_t i = 0; i < cols->size(); i += 2) {
    const auto& r0 = (*cols)[i];
    const auto& r1 = (*cols)[i + 1];
    EXPECT_EQ(r0.rank, 0);
    EXPECT_EQ(r1.rank, 1);
    EXPECT_EQ(r0.group, r1.group);
    EXPECT_EQ(r0.seq, r1.seq);
    EXPECT_EQ(r1.enqueueNs - r0.enqueueNs, 250000);
    EXPECT_EQ(*r1.startNs - *r0.startNs, 250000);
  }
  auto ranks = run->ranks();
  ASSERT_TRUE(ranks);
  ASSERT_EQ(ranks->size(), 2u);
  EXPECT_EQ((*ranks)[0].startNs, 0);
  EXPECT_EQ((*ranks)[1].startNs, 250000);
}

// The import writes each file's spans as soon as it is read, against the first file's earliest event, and shifts
// them once the run's earliest is known: the run is the same whichever file holds the earliest event.
TEST(KinetoImport, TheRunIsTheSameWhicheverFileHoldsTheEarliestEvent) {
  ScratchDir dir;
  using Span = std::tuple<int, int, int64_t, int64_t, std::string>;  // rank, thread, begin, dur, name
  auto spansOf = [&](std::vector<fs::path> inputs, const char* name) {
    auto stats = import(inputs, dir / name);
    EXPECT_TRUE(stats) << stats.error();
    auto run = openRun(dir / name);
    std::map<uint32_t, std::string> names;
    EXPECT_TRUE(run->forEachString([&](uint32_t id, std::string_view v) { names[id] = std::string(v); }));
    std::vector<Span> spans;
    auto ids = run->spanIdRange();
    EXPECT_TRUE(ids);
    EXPECT_TRUE(run->forEachSpanInIdRange(ids->first, ids->last + 1, [&](const tracedb::SpanRow& r) {
      spans.emplace_back(r.rank, r.thread, r.beginNs, r.durNs, names[r.name]);
      return true;
    }));
    std::sort(spans.begin(), spans.end());
    return spans;
  };
  // Rank 1's events begin 250 µs after rank 0's: read first, it sets the provisional epoch.
  const auto forward = spansOf({fixture("nccl_meta_rank-0.json"), fixture("nccl_meta_rank-1.json")}, "forward.db");
  const auto backward = spansOf({fixture("nccl_meta_rank-1.json"), fixture("nccl_meta_rank-0.json")}, "backward.db");
  ASSERT_FALSE(forward.empty());
  EXPECT_EQ(forward, backward);
  int64_t first = INT64_MAX;
  for (const Span& s : backward) first = std::min(first, std::get<2>(s));
  EXPECT_EQ(first, 0);
}

TEST(KinetoImport, KernelNamesAloneNeverMakeACollective) {
  // Hand-made: an NCCL kernel with collective metadata and no host side (one all-gather, renamed kernel and all),
  // an NCCL kernel without metadata or a launching collective op (a span, not a collective), and two host ops that
  // claim the same Seq (numbered by order instead, and counted).
  ScratchDir dir;
  writeFile(dir / "trace_rank2.json", R"json([
    {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
     "pid": 0, "tid": 7, "ts": 100.5, "dur": 20.25,
     "args": {"device": 0, "stream": 7, "correlation": 9, "Collective name": "_allgather_base", "dtype": "BFloat16",
              "In msg nelems": 1024, "Out msg nelems": 4096, "Group size": 4, "Process Group Name": "tp",
              "Process Group Ranks": "[0, 1, 2, 3]"}},
    {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
     "pid": 0, "tid": 7, "ts": 200, "dur": 10, "args": {"device": 0, "stream": 7, "correlation": 10}},
    {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 5, "tid": 5, "ts": 300, "dur": 5,
     "args": {"Collective name": "allreduce", "dtype": "Float", "In msg nelems": 8, "Out msg nelems": 8,
              "Process Group Name": "dp", "Seq": 3}},
    {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 5, "tid": 5, "ts": 310, "dur": 5,
     "args": {"Collective name": "allreduce", "dtype": "Float", "In msg nelems": 8, "Out msg nelems": 8,
              "Process Group Name": "dp", "Seq": 3}},
    {"ph": "C", "name": "loss", "pid": 5, "tid": 5, "ts": 320, "args": {"loss": 2.75}}
  ])json");
  auto stats = import({dir / "trace_rank2.json"}, dir / "run.db");
  ASSERT_TRUE(stats) << stats.error();
  EXPECT_EQ(stats->skipped["collective Seq missing or repeated in its group (numbered by order instead)"], 2);
  auto run = openRun(dir / "run.db");
  auto cols = run->collectives();
  ASSERT_TRUE(cols);
  ASSERT_EQ(cols->size(), 3u);
  const auto& dp0 = (*cols)[0];
  const auto& dp1 = (*cols)[1];
  const auto& ag = (*cols)[2];
  EXPECT_EQ(dp0.group, "dp");
  EXPECT_EQ(dp0.seq, 1);
  EXPECT_EQ(dp1.seq, 2);
  EXPECT_EQ(ag.rank, 2);
  EXPECT_EQ(ag.group, "tp");
  EXPECT_EQ(ag.op, "all_gather");
  EXPECT_EQ(ag.dtype, "bfloat16");
  EXPECT_EQ(ag.numel, 1024);  // the input: one rank's shard ("In msg nelems")
  EXPECT_EQ(ag.bytes, 2048);
  EXPECT_EQ(ag.enqueueNs, 0);  // the earliest event is time 0
  EXPECT_EQ(*ag.endNs - *ag.startNs, 20250);
  auto groups = run->groups();
  ASSERT_TRUE(groups);
  std::map<std::string, std::vector<int>> ranksOf;
  for (const auto& g : *groups) ranksOf[g.name] = g.ranks;
  EXPECT_EQ(ranksOf["tp"], (std::vector<int>{0, 1, 2, 3}));
  auto spans = run->spans();
  ASSERT_TRUE(spans);
  int nccl = 0;
  for (const auto& s : *spans) nccl += s.kind == tracedb::SpanKind::NcclKernel;
  EXPECT_EQ(nccl, 2);  // both kernels are NCCL kernels as spans; only the one with metadata is a collective
  auto counters = run->counters();
  ASSERT_TRUE(counters);
  ASSERT_EQ(counters->size(), 1u);
  EXPECT_EQ((*counters)[0].name, "loss");
  EXPECT_EQ((*counters)[0].tsNs, 219500);
}

TEST(KinetoImport, RefusesToOverwriteAnInput) {
  ScratchDir dir;
  fs::copy_file(fixture("gloo_array_rank3.json"), dir / "gloo_array_rank3.json");
  auto stats = import({dir / "gloo_array_rank3.json"}, dir / "gloo_array_rank3.json");
  ASSERT_FALSE(stats);
  EXPECT_NE(stats.error().find("is also an input"), std::string::npos) << stats.error();
  EXPECT_EQ(readFile(dir / "gloo_array_rank3.json"), readFile(fixture("gloo_array_rank3.json")));
}

void expectRefused(const std::vector<fs::path>& inputs, const std::string& fragment, const std::string& names) {
  ScratchDir dir;
  writeFile(dir / "run.db", "previous content");  // an existing output survives a failed import untouched
  auto stats = importKineto(inputs, dir / "run.db");
  ASSERT_FALSE(stats) << "imported " << inputs.front();
  EXPECT_NE(stats.error().find(fragment), std::string::npos) << stats.error();
  EXPECT_NE(stats.error().find(names), std::string::npos) << stats.error();
  EXPECT_EQ(readFile(dir / "run.db"), "previous content");
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"run.db"});  // no temporary file left behind
}

TEST(KinetoImport, RefusesTwoFilesOfOneRank) {
  expectRefused({fixture("nccl_meta_rank-0.json"), fixture("nccl_meta_rank-0.json.gz")}, "rank 0",
                "nccl_meta_rank-0.json.gz");
}

TEST(KinetoImport, RefusesBadFiles) {
  ScratchDir inputs("inputs");
  const std::string gz = readFile(fixture("nccl_meta_rank-0.json.gz"));
  const std::string plain = readFile(fixture("nccl_meta_rank-0.json"));
  writeFile(inputs / "not_json.json", "this is not JSON, it is a sentence.\n");
  writeFile(inputs / "truncated.json.gz", gz.substr(0, gz.size() / 2));
  writeFile(inputs / "truncated.json", plain.substr(0, plain.size() / 2));
  writeFile(inputs / "empty.json", "");
  writeFile(inputs / "no_events.json", R"({"schemaVersion": 1, "traceEvents": []})");
  writeFile(inputs / "no_trace_events.json", R"({"schemaVersion": 1})");
  writeFile(inputs / "number.json", "42");
  std::string corrupt = gz;
  for (size_t i = 20; i < 60 && i < corrupt.size(); ++i) corrupt[i] = static_cast<char>(corrupt[i] ^ 0x5a);
  writeFile(inputs / "corrupt.json.gz", corrupt);

  expectRefused({inputs / "not_json.json"}, "not valid JSON", "not_json.json");
  expectRefused({inputs / "truncated.json.gz"}, "truncated gzip", "truncated.json.gz");
  expectRefused({inputs / "truncated.json"}, "not valid JSON", "truncated.json");
  expectRefused({inputs / "empty.json"}, "empty file", "empty.json");
  expectRefused({inputs / "no_events.json"}, "no trace events", "no_events.json");
  expectRefused({inputs / "no_trace_events.json"}, "no \"traceEvents\"", "no_trace_events.json");
  expectRefused({inputs / "number.json"}, "not a Kineto trace", "number.json");
  expectRefused({inputs / "corrupt.json.gz"}, "gzip", "corrupt.json.gz");
  expectRefused({inputs / "missing.json"}, "cannot open", "missing.json");
  // A bad second file fails the whole import: no output with only some ranks.
  expectRefused({fixture("nccl_meta_rank-0.json"), inputs / "truncated.json.gz"}, "truncated gzip",
                "truncated.json.gz");
}

TEST(KinetoImport, EveryTruncationIsRefusedWithoutACrash) {
  ScratchDir dir;
  const std::string text = readFile(fixture("nccl_meta_rank-0.json"));
  for (size_t cut = 1; cut + 2 < text.size(); cut += 61) {
    writeFile(dir / "cut.json", text.substr(0, cut));
    auto stats = import({dir / "cut.json"}, dir / "run.db");
    ASSERT_FALSE(stats) << "a " << cut << "-byte prefix was imported";
    EXPECT_NE(stats.error().find("cut.json"), std::string::npos) << stats.error();
    ASSERT_FALSE(fs::exists(dir / "run.db"));
  }
  const std::string gz = readFile(fixture("nccl_meta_rank-0.json.gz"));
  for (size_t cut = 1; cut < gz.size(); cut += 37) {
    writeFile(dir / "cut.json.gz", gz.substr(0, cut));
    auto stats = import({dir / "cut.json.gz"}, dir / "run.db");
    ASSERT_FALSE(stats) << "a " << cut << "-byte prefix of the gzip file was imported";
    EXPECT_NE(stats.error().find("cut.json.gz"), std::string::npos) << stats.error();
    ASSERT_FALSE(fs::exists(dir / "run.db"));
  }
}

TEST(KinetoImport, FilesEndingNearAPageBoundary) {
  // Plain files are memory-mapped when their last page has room for the parser's padding, else read: both paths,
  // at and around 4 KiB pages.
  ScratchDir dir;
  const std::string text = readFile(fixture("gloo_array_rank3.json"));
  for (size_t size : {4096 - 65, 4096 - 64, 4096 - 63, 4096 - 1, 4096, 4097, 8192}) {
    ASSERT_LT(text.size(), size);
    writeFile(dir / "padded_rank3.json", text + std::string(size - text.size(), ' '));
    auto stats = import({dir / "padded_rank3.json"}, dir / "run.db");
    ASSERT_TRUE(stats) << size << ": " << stats.error();
    EXPECT_EQ(stats->collectives, 3) << size;
    EXPECT_EQ(stats->inputBytes, static_cast<int64_t>(size));
  }
}

TEST(KinetoImport, CorruptedBytesNeverCrash) {
  // Flipped bytes anywhere in the file: the import either succeeds (the damage hit a value it does not read, or made
  // one event malformed) or fails with a message naming the file — it never crashes or leaves a partial output.
  ScratchDir dir;
  const std::string text = readFile(fixture("nccl_meta_rank-0.json"));
  uint64_t seed = 12345;
  auto next = [&seed] {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<size_t>(seed >> 33);
  };
  int ok = 0, refused = 0;
  for (int round = 0; round < 60; ++round) {
    std::string damaged = text;
    for (int k = 0; k < 3; ++k) damaged[next() % damaged.size()] = static_cast<char>(next() % 256);
    writeFile(dir / "damaged.json", damaged);
    fs::remove(dir / "run.db");
    auto stats = import({dir / "damaged.json"}, dir / "run.db");
    if (stats) {
      ++ok;
      EXPECT_TRUE(fs::exists(dir / "run.db"));
    } else {
      ++refused;
      EXPECT_NE(stats.error().find("damaged.json"), std::string::npos) << stats.error();
      EXPECT_FALSE(fs::exists(dir / "run.db"));
    }
  }
  EXPECT_EQ(ok + refused, 60);
}

TEST(KinetoImport, RefusesMissingOutputFolder) {
  ScratchDir dir;
  auto stats = import({fixture("nccl_meta_rank-0.json")}, dir / "no" / "such" / "run.db");
  ASSERT_FALSE(stats);
  EXPECT_NE(stats.error().find("does not exist"), std::string::npos) << stats.error();
}

TEST(KinetoImport, ReplacesAnExistingOutputOnSuccess) {
  ScratchDir dir;
  writeFile(dir / "run.db", "stale");
  auto stats = import({fixture("gloo_array_rank3.json")}, dir / "run.db");
  ASSERT_TRUE(stats) << stats.error();
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"run.db"});
  EXPECT_TRUE(openRun(dir / "run.db"));
}

}  // namespace
}  // namespace tpscope::formats
