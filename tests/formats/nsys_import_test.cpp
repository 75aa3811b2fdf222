// The Nsight Systems import (formats/nsys_import.h) on SQLite files built here with the sqlite3 C API, following
// the documented export schema: a 3.x-like layout (textId strings, session start, schema version, mangled names)
// and a 2.x-like one (NVTX text column, columns in another order, no session start). No real export was available
// (no nsys on the build machine), so each file's rows are written from one list of events that the test also uses
// to compute the expected answers itself: spans, lanes, collectives, and the device-lane breakdown of every step by
// interval unions. Also: several processes in one file, rank hints, invalid UTF-8, damaged inputs, and report
// --json's "kernels" object on these and on a shared Kineto trace.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <algorithm>
#include <map>
#include <set>
#include <variant>

#include "test_support.h"
#include "tpscope/analysis/breakdown.h"
#include "tpscope/report/json_output.h"
#include "tpscope/analysis/report.h"
#include "tpscope/formats/kineto_import.h"
#include "tpscope/formats/nsys_import.h"
#include "tpscope/tracedb/reader.h"

namespace tpscope::formats {
namespace {

using namespace testing;
using Value = std::variant<std::monostate, int64_t, std::string>;
using Row = std::vector<std::pair<std::string, Value>>;

// A small SQLite writer for the test's exports: tables from DDL, rows by column name.
class Db {
 public:
  explicit Db(const fs::path& path) {
    fs::remove(path);
    EXPECT_EQ(sqlite3_open(path.c_str(), &db_), SQLITE_OK);
    exec("BEGIN");
  }
  ~Db() {
    exec("COMMIT");
    sqlite3_close(db_);
  }
  void exec(const std::string& sql) {
    char* err = nullptr;
    EXPECT_EQ(sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err), SQLITE_OK) << sql << ": " << (err ? err : "");
    sqlite3_free(err);
  }
  void insert(const std::string& table, const Row& row) {
    std::string sql = "INSERT INTO " + table + "(", values;
    for (size_t i = 0; i < row.size(); ++i) {
      sql += (i ? ", \"" : "\"") + row[i].first + "\"";
      values += i ? ", ?" : "?";
    }
    sql += ") VALUES (" + values + ")";
    sqlite3_stmt* st = nullptr;
    ASSERT_EQ(sqlite3_prepare_v2(db_, sql.c_str(), -1, &st, nullptr), SQLITE_OK) << sql << ": " << sqlite3_errmsg(db_);
    for (size_t i = 0; i < row.size(); ++i) {
      const int c = static_cast<int>(i) + 1;
      if (const auto* v = std::get_if<int64_t>(&row[i].second)) sqlite3_bind_int64(st, c, *v);
      else if (const auto* s = std::get_if<std::string>(&row[i].second))
        sqlite3_bind_text(st, c, s->data(), static_cast<int>(s->size()), SQLITE_TRANSIENT);
      else sqlite3_bind_null(st, c);
    }
    EXPECT_EQ(sqlite3_step(st), SQLITE_DONE) << sqlite3_errmsg(db_);
    sqlite3_finalize(st);
  }

 private:
  sqlite3* db_ = nullptr;
};

enum class Layout { V3, V2 };

// Table layouts: 3.x as `nsys export` 2023-2025 writes them (a subset of the columns), 2.x with text NVTX, columns
// in another order, no mangledName, no session start, no schema version table.
void createTables(Db& db, Layout layout) {
  db.exec("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL)");
  db.exec("CREATE TABLE ThreadNames (nameId INTEGER NOT NULL, priority INTEGER, globalTid INTEGER)");
  db.exec("CREATE TABLE PROCESSES (globalPid INTEGER, pid INTEGER, name TEXT)");
  if (layout == Layout::V3) {
    db.exec("CREATE TABLE META_DATA_EXPORT (name TEXT, value TEXT)");
    db.exec("INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_SCHEMA_VERSION', '3.11.1')");
    db.exec("CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INTEGER, utcTime TEXT, localTime TEXT)");
    db.exec("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (1733300000000000000, '', '')");
    db.exec("CREATE TABLE TARGET_INFO_GPU (id INTEGER NOT NULL, name TEXT, busLocation TEXT, totalMemory INTEGER)");
    db.exec("CREATE TABLE TARGET_INFO_CUDA_DEVICE (gpuId INTEGER, cudaId INTEGER, pid INTEGER, uuid TEXT, "
            "numMultiprocessors INTEGER)");
    db.exec("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER "
            "NOT NULL, contextId INTEGER NOT NULL DEFAULT 1, greenContextId INTEGER, streamId INTEGER NOT NULL, correlationId "
            "INTEGER, globalPid INTEGER, demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL, mangledName "
            "INTEGER, launchType INTEGER, gridX INTEGER NOT NULL DEFAULT 1)");
    db.exec("CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass "
            "INTEGER NOT NULL DEFAULT 0, globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL, "
            "returnValue INTEGER NOT NULL DEFAULT 0, callchainId INTEGER)");
    db.exec("CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER "
            "NOT NULL, contextId INTEGER NOT NULL DEFAULT 1, streamId INTEGER NOT NULL, correlationId INTEGER, "
            "globalPid INTEGER, bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL, srcKind INTEGER, dstKind INTEGER)");
    db.exec("CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER "
            "NOT NULL, contextId INTEGER NOT NULL DEFAULT 1, streamId INTEGER NOT NULL, correlationId INTEGER, "
            "globalPid INTEGER, value INTEGER NOT NULL DEFAULT 0, bytes INTEGER NOT NULL DEFAULT 0)");
    db.exec("CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId "
            "INTEGER, category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, textId "
            "INTEGER, domainId INTEGER, uint64Value INTEGER, jsonTextId INTEGER)");
  } else {
    db.exec("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (correlationId INTEGER, streamId INTEGER NOT NULL, deviceId "
            "INTEGER NOT NULL, globalPid INTEGER, shortName INTEGER NOT NULL, demangledName INTEGER NOT NULL, "
            "end INTEGER NOT NULL, start INTEGER NOT NULL, contextId INTEGER NOT NULL DEFAULT 1)");
    db.exec("CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (correlationId INTEGER, globalTid INTEGER, nameId INTEGER NOT "
            "NULL, end INTEGER NOT NULL, start INTEGER NOT NULL, eventClass INTEGER NOT NULL DEFAULT 0)");
    db.exec("CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (copyKind INTEGER NOT NULL, bytes INTEGER NOT NULL, start INTEGER "
            "NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId "
            "INTEGER, globalPid INTEGER)");
    db.exec("CREATE TABLE NVTX_EVENTS (eventType INTEGER NOT NULL, text TEXT, start INTEGER NOT NULL, end INTEGER, "
            "globalTid INTEGER, domainId INTEGER, rangeId INTEGER)");
  }
}

// The events of one process, from which both the export and the expected answers are made.
enum class Ev { Kernel, Nccl, Memcpy, Memset, Runtime, Range, Mark };
struct Event {
  Ev kind;
  int64_t start, end;
  std::string name;
  int64_t stream = 0;       // GPU events
  int64_t corr = -1;        // GPU events and runtime calls
  int64_t tid = 0;          // host events: the thread (0 = the main thread)
  int64_t domain = 0;       // ranges
};

struct Process {
  int64_t pid = 0;
  int64_t device = 0;
  std::vector<Event> events;
};

int64_t globalPid(int64_t pid) { return (int64_t{1} << 48) | (pid << 24); }
int64_t globalTid(int64_t pid, int64_t tid) { return globalPid(pid) | tid; }

// Strings, interned in StringIds in order of first use.
class Strings {
 public:
  int64_t id(const std::string& s) {
    auto [it, inserted] = ids_.emplace(s, static_cast<int64_t>(ids_.size()) + 1);
    return it->second;
  }
  void write(Db& db) const {
    for (const auto& [s, id] : ids_) db.insert("StringIds", {{"id", id}, {"value", s}});
  }

 private:
  std::map<std::string, int64_t> ids_;
};

// One step's worth of a rank's work, `base` its start: a GEMM, an all-reduce launched inside PyTorch's
// nccl:all_reduce range (when `ranges`), a copy, a late kernel, a synchronisation. Window: [base, base + 100 us).
void addStep(Process& p, int step, int64_t base, int64_t corr, bool ranges) {
  auto& e = p.events;
  e.push_back({Ev::Range, base, base + 100'000, "ProfilerStep#" + std::to_string(step)});
  e.push_back({Ev::Runtime, base + 1'000, base + 3'000, "cudaLaunchKernel_v7000", 0, corr});
  e.push_back({Ev::Kernel, base + 5'000, base + 35'000, "void gemm_kernel<float, 128>(float const*, float*)", 7, corr});
  if (ranges) e.push_back({Ev::Range, base + 4'000, base + 9'000, "nccl:all_reduce"});
  e.push_back({Ev::Runtime, base + 5'000, base + 6'000, "cudaLaunchKernel_v7000", 0, corr + 1});
  e.push_back({Ev::Nccl, base + 30'000, base + 60'000, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 13, corr + 1});
  e.push_back({Ev::Runtime, base + 7'000, base + 8'000, "cudaMemcpyAsync_v3020", 0, corr + 2});
  e.push_back({Ev::Memcpy, base + 60'000, base + 70'000, "", 7, corr + 2});
  e.push_back({Ev::Runtime, base + 65'000, base + 66'000, "cudaLaunchKernel_v7000", 0, corr + 3});
  e.push_back({Ev::Kernel, base + 70'000, base + 80'000, "relu_kernel", 7, corr + 3});
  e.push_back({Ev::Runtime, base + 66'000, base + 90'000, "cudaStreamSynchronize_v3020", 0, -1});
}

void writeProcess(Db& db, Strings& s, Layout layout, const Process& p) {
  const int64_t gpid = globalPid(p.pid);
  db.insert("PROCESSES", {{"globalPid", gpid}, {"pid", p.pid}, {"name", std::string("python3")}});
  db.insert("ThreadNames", {{"nameId", s.id("pt_main_thread")}, {"priority", int64_t{0}},
                            {"globalTid", globalTid(p.pid, p.pid)}});
  for (const Event& ev : p.events) {
    const int64_t tid = globalTid(p.pid, ev.tid ? ev.tid : p.pid);
    Row gpu{{"start", ev.start}, {"end", ev.end}, {"deviceId", p.device}, {"streamId", ev.stream},
            {"correlationId", ev.corr}, {"globalPid", gpid}};
    switch (ev.kind) {
      case Ev::Kernel:
      case Ev::Nccl: {
        // shortName: the name without "void ", template arguments and parameters, as nsys stores it.
        std::string shortName = ev.name.rfind("void ", 0) == 0 ? ev.name.substr(5) : ev.name;
        shortName = shortName.substr(0, shortName.find_first_of("<("));
        gpu.push_back({"demangledName", s.id(ev.name)});
        gpu.push_back({"shortName", s.id(shortName)});
        if (layout == Layout::V3) gpu.push_back({"mangledName", s.id("_Z" + shortName)});
        db.insert("CUPTI_ACTIVITY_KIND_KERNEL", gpu);
        break;
      }
      case Ev::Memcpy:
        gpu.push_back({"bytes", int64_t{4096}});
        gpu.push_back({"copyKind", int64_t{1}});
        db.insert("CUPTI_ACTIVITY_KIND_MEMCPY", gpu);
        break;
      case Ev::Memset: db.insert("CUPTI_ACTIVITY_KIND_MEMSET", gpu); break;
      case Ev::Runtime:
        db.insert("CUPTI_ACTIVITY_KIND_RUNTIME", {{"start", ev.start}, {"end", ev.end}, {"globalTid", tid},
                                                  {"correlationId", ev.corr}, {"nameId", s.id(ev.name)}});
        break;
      case Ev::Range:
      case Ev::Mark: {
        Row r{{"start", ev.start}, {"eventType", int64_t{ev.kind == Ev::Mark ? 34 : 59}}, {"globalTid", tid},
              {"domainId", ev.domain}};
        if (ev.kind == Ev::Range) r.push_back({"end", ev.end});
        if (layout == Layout::V3) r.push_back({"textId", s.id(ev.name)});
        else r.push_back({"text", ev.name});
        db.insert("NVTX_EVENTS", r);
        break;
      }
    }
  }
}

void writeExport(const fs::path& path, Layout layout, const std::vector<Process>& procs) {
  Db db(path);
  createTables(db, layout);
  Strings s;
  for (const Process& p : procs) {
    writeProcess(db, s, layout, p);
    if (layout == Layout::V3) {
      db.insert("TARGET_INFO_GPU", {{"id", p.device}, {"name", std::string("NVIDIA H100 80GB HBM3")}});
      db.insert("TARGET_INFO_CUDA_DEVICE", {{"gpuId", p.device}, {"cudaId", int64_t{0}}, {"pid", p.pid}});
    }
  }
  s.write(db);
}

// --- expected answers, computed from the events ---
using Iv = std::pair<int64_t, int64_t>;
std::vector<Iv> unite(std::vector<Iv> v) {
  std::sort(v.begin(), v.end());
  std::vector<Iv> out;
  for (const Iv& i : v) {
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
std::vector<Iv> minus(const std::vector<Iv>& a, const std::vector<Iv>& b) {  // a \ b, both united
  std::vector<Iv> out;
  for (Iv i : a) {
    int64_t at = i.first;
    for (const Iv& j : b) {
      if (j.second <= at || j.first >= i.second) continue;
      if (j.first > at) out.emplace_back(at, j.first);
      at = std::max(at, j.second);
    }
    if (at < i.second) out.emplace_back(at, i.second);
  }
  return out;
}

struct Expected {
  int64_t step = 0, compute = 0, comm = 0, exposed = 0, other = 0, idle = 0, memcpy = 0;
};

// Per ProfilerStep window, in time order: the device-lane definitions of analysis/breakdown.h.
std::vector<Expected> expectedSteps(const Process& p) {
  std::vector<Iv> c, m, y, windows;
  for (const Event& e : p.events) {
    if (e.kind == Ev::Kernel) c.emplace_back(e.start, e.end);
    if (e.kind == Ev::Nccl) m.emplace_back(e.start, e.end);
    if (e.kind == Ev::Memcpy || e.kind == Ev::Memset) y.emplace_back(e.start, e.end);
    if (e.kind == Ev::Range && e.name.rfind("ProfilerStep#", 0) == 0) windows.emplace_back(e.start, e.end);
  }
  c = unite(c), m = unite(m), y = unite(y);
  std::vector<Iv> all = c;
  all.insert(all.end(), m.begin(), m.end());
  all.insert(all.end(), y.begin(), y.end());
  const std::vector<Iv> busy = unite(all), cm = unite([&] { auto v = c; v.insert(v.end(), m.begin(), m.end()); return v; }());
  std::sort(windows.begin(), windows.end());
  std::vector<Expected> out;
  for (const Iv& w : windows) {
    Expected x;
    x.step = w.second - w.first;
    x.compute = measure(c, w.first, w.second);
    x.comm = measure(m, w.first, w.second);
    x.exposed = measure(minus(m, c), w.first, w.second);
    x.other = measure(minus(busy, cm), w.first, w.second);
    x.idle = x.step - measure(busy, w.first, w.second);
    x.memcpy = measure(y, w.first, w.second);
    out.push_back(x);
  }
  return out;
}

Process oneRank(bool ranges, int64_t pid = 100, int64_t device = 0, int64_t at = 1'000'000) {
  Process p{pid, device, {}};
  for (int s = 0; s < 3; ++s) addStep(p, s + 1, at + 100'000 * s, 10 * (s + 1), ranges);
  return p;
}

std::unique_ptr<tracedb::Reader> openRun(const fs::path& path) {
  auto r = tracedb::Reader::open(path);
  EXPECT_TRUE(r) << r.error();
  return r ? std::move(*r) : nullptr;
}

int64_t count(const Process& p, Ev kind) {
  return std::count_if(p.events.begin(), p.events.end(), [&](const Event& e) { return e.kind == kind; });
}

void expectBreakdown(tracedb::Reader& reader, int rank, const Process& p) {
  auto b = analysis::computeBreakdownFromRecords(reader);
  ASSERT_TRUE(b) << b.error();
  const std::vector<Expected> want = expectedSteps(p);
  std::vector<analysis::StepBreakdown> got;
  for (const auto& s : b->steps)
    if (s.rank == rank) got.push_back(s);
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < want.size(); ++k) {
    SCOPED_TRACE("step " + std::to_string(k));
    EXPECT_EQ(got[k].step, static_cast<int>(k) + 1);
    EXPECT_EQ(got[k].time.stepNs, want[k].step);
    EXPECT_EQ(got[k].time.computeNs, want[k].compute);
    EXPECT_EQ(got[k].time.commNs, want[k].comm);
    EXPECT_EQ(got[k].time.exposedCommNs, want[k].exposed);
    EXPECT_EQ(got[k].time.otherNs, want[k].other);
    EXPECT_EQ(got[k].time.idleNs, want[k].idle);
    EXPECT_EQ(got[k].time.memcpyNs, want[k].memcpy);
    EXPECT_EQ(got[k].time.idleHostWaitNs + got[k].time.idleKernelWaitNs + got[k].time.idleOtherNs, want[k].idle);
  }
  for (const auto& rb : b->ranks)
    if (rb.rank == rank) {
      EXPECT_EQ(rb.lanes, analysis::Lanes::Device);
    }
}

TEST(NsysImport, Schema3LayoutKernelsRuntimeNvtxAndBreakdown) {
  ScratchDir dir;
  const Process p = oneRank(true);
  writeExport(dir / "rank-0.sqlite", Layout::V3, {p});
  const std::vector<fs::path> in{dir / "rank-0.sqlite"};
  auto stats = importNsys(in, dir / "run.db");
  ASSERT_TRUE(stats) << stats.error();
  EXPECT_EQ(stats->ranks, 1);
  EXPECT_EQ(stats->kernels, count(p, Ev::Kernel) + count(p, Ev::Nccl));
  EXPECT_EQ(stats->ncclKernels, 3);
  EXPECT_EQ(stats->pairedByRange, 3);
  auto reader = openRun(dir / "run.db");
  ASSERT_TRUE(reader);

  auto meta = reader->meta();
  ASSERT_TRUE(meta);
  EXPECT_EQ((*meta)["source"], "nsys");
  EXPECT_EQ((*meta)["tool"], "tpscope import nsys");
  // Time 0 = the earliest record: the session start plus the first step's begin.
  EXPECT_EQ((*meta)["epoch_unix_ns"], std::to_string(1733300000000000000 + 1'000'000));
  EXPECT_NE((*meta)["nsys_inputs"].find("\"schema_version\":\"3.11.1\""), std::string::npos);

  auto ranks = reader->ranks();
  ASSERT_TRUE(ranks);
  ASSERT_EQ(ranks->size(), 1u);
  EXPECT_EQ((*ranks)[0].pid, 100);
  EXPECT_EQ((*ranks)[0].device, "cuda:0");

  auto threads = reader->threads();
  ASSERT_TRUE(threads);
  std::map<int, tracedb::ThreadInfo> lanes;
  for (const auto& t : *threads) lanes[t.thread] = t;
  ASSERT_EQ(lanes.size(), 3u);  // the main thread, streams 7 and 13 of device 0
  EXPECT_EQ(lanes[0].kind, "cpu");
  EXPECT_EQ(lanes[0].name, "pt_main_thread");
  EXPECT_EQ(lanes[10007].kind, "cuda-stream");
  EXPECT_EQ(lanes[10007].name, "stream 7");
  EXPECT_EQ(lanes[10013].kind, "cuda-stream");

  auto spans = reader->spans();
  ASSERT_TRUE(spans);
  ASSERT_EQ(static_cast<int64_t>(spans->size()), static_cast<int64_t>(p.events.size()));
  std::map<tracedb::SpanKind, int64_t> kinds;
  std::map<std::string, int64_t> names;
  for (const auto& s : *spans) {
    kinds[s.kind]++;
    names[reader->string(s.name)]++;
    if (s.kind == tracedb::SpanKind::Kernel || s.kind == tracedb::SpanKind::NcclKernel) {
      EXPECT_TRUE(s.correlation.has_value());
      EXPECT_GE(s.step, 1);
    }
  }
  EXPECT_EQ(kinds[tracedb::SpanKind::Kernel], count(p, Ev::Kernel));
  EXPECT_EQ(kinds[tracedb::SpanKind::NcclKernel], 3);
  EXPECT_EQ(kinds[tracedb::SpanKind::Memcpy], 3);
  EXPECT_EQ(kinds[tracedb::SpanKind::Step], 3);
  EXPECT_EQ(kinds[tracedb::SpanKind::Comm], 3);   // the nccl:all_reduce ranges
  EXPECT_EQ(kinds[tracedb::SpanKind::Wait], 3);   // cudaStreamSynchronize
  EXPECT_EQ(kinds[tracedb::SpanKind::Other], 12);  // 3 launches and 1 copy call per step
  EXPECT_EQ(names["void gemm_kernel<float, 128>(float const*, float*)"], 3);  // the demangled name
  EXPECT_EQ(names["CUDA memcpy HtoD"], 3);

  auto colls = reader->collectives();
  ASSERT_TRUE(colls);
  ASSERT_EQ(colls->size(), 3u);
  const int64_t epoch = 1'000'000;
  for (size_t k = 0; k < 3; ++k) {
    const auto& c = (*colls)[k];
    const int64_t base = 1'000'000 + 100'000 * static_cast<int64_t>(k) - epoch;
    EXPECT_EQ(c.group, "default_pg");
    EXPECT_EQ(c.seq, static_cast<int64_t>(k) + 1);
    EXPECT_EQ(c.op, "all_reduce");
    EXPECT_EQ(c.dtype, "float32");
    EXPECT_EQ(c.callsite, "nccl:all_reduce");
    EXPECT_EQ(c.enqueueNs, base + 4'000);
    EXPECT_EQ(c.startNs, base + 30'000);
    EXPECT_EQ(c.endNs, base + 60'000);
    EXPECT_EQ(c.step, static_cast<int>(k) + 1);
    EXPECT_EQ(c.state, tracedb::CollectiveState::Completed);
  }
  expectBreakdown(*reader, 0, p);
}

TEST(NsysImport, ReportJsonCarriesTheKernels) {
  ScratchDir dir;
  const Process p = oneRank(true);
  writeExport(dir / "a.sqlite", Layout::V3, {p});
  const std::vector<fs::path> in{dir / "a.sqlite"};
  ASSERT_TRUE(importNsys(in, dir / "run.db"));
  auto reader = openRun(dir / "run.db");
  ASSERT_TRUE(reader);
  auto report = analysis::buildReport(*reader);
  ASSERT_TRUE(report) << report.error();
  const auto j = nlohmann::json::parse(report::reportToJson(*report, "run.db"));
  ASSERT_TRUE(j.contains("kernels"));
  // 3 steps × (gemm 30 us + relu 10 us + NCCL 30 us).
  EXPECT_EQ(j["kernels"]["count"], 9);
  EXPECT_DOUBLE_EQ(j["kernels"]["total_ms"].get<double>(), 0.21);
  const auto& top = j["kernels"]["top"];
  ASSERT_EQ(top.size(), 3u);
  // gemm and NCCL tie at 0.09 ms: by name.
  EXPECT_EQ(top[0]["name"], "ncclDevKernel_AllReduce_Sum_f32_RING_LL");
  EXPECT_EQ(top[1]["name"], "void gemm_kernel<float, 128>(float const*, float*)");
  EXPECT_EQ(top[2]["name"], "relu_kernel");
  EXPECT_EQ(top[2]["count"], 3);
  EXPECT_DOUBLE_EQ(top[2]["total_ms"].get<double>(), 0.03);
}

// Schema 2.x: NVTX text, another column order, no session start; two processes in one file, no c10d ranges (the
// NCCL kernels are paired by order on their stream), a named NVTX domain, invalid UTF-8 in a name.
TEST(NsysImport, Schema2LayoutSeveralProcessesPairedByStream) {
  ScratchDir dir;
  Process a = oneRank(false, 300, 1, 1'000'000), b = oneRank(false, 200, 0, 1'002'000);
  b.events.push_back({Ev::Range, 1'002'100, 1'002'200, "forward", 0, -1, 0, 1});
  b.events.push_back({Ev::Kernel, 1'300'000, 1'301'000, "bad\xff" "name", 7, 99});
  b.events.push_back({Ev::Runtime, 1'290'000, 1'291'000, "cudaLaunchKernel_v7000", 0, 99});
  writeExport(dir / "job.sqlite", Layout::V2, {a, b});
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open((dir / "job.sqlite").c_str(), &db), SQLITE_OK);
    const std::string sql = "INSERT INTO NVTX_EVENTS(eventType, text, start, globalTid, domainId) VALUES (75, "
                            "'myapp', 0, " + std::to_string(globalTid(200, 200)) + ", 1)";
    ASSERT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(db);
  }
  const std::vector<fs::path> in{dir / "job.sqlite"};
  auto stats = importNsys(in, dir / "run.db");
  ASSERT_TRUE(stats) << stats.error();
  EXPECT_EQ(stats->ranks, 2);
  EXPECT_EQ(stats->pairedByRange, 0);
  auto reader = openRun(dir / "run.db");
  ASSERT_TRUE(reader);
  auto ranks = reader->ranks();
  ASSERT_TRUE(ranks);
  ASSERT_EQ(ranks->size(), 2u);
  EXPECT_EQ((*ranks)[0].pid, 200);  // ordered by pid
  EXPECT_EQ((*ranks)[0].device, "cuda:0");
  EXPECT_EQ((*ranks)[1].pid, 300);
  EXPECT_EQ((*ranks)[1].device, "cuda:1");  // no TARGET_INFO_CUDA_DEVICE in this layout: nsys's device id
  EXPECT_EQ((*ranks)[0].worldSize, 2);

  auto colls = reader->collectives();
  ASSERT_TRUE(colls);
  ASSERT_EQ(colls->size(), 6u);
  std::map<int64_t, std::vector<tracedb::CollectiveRow>> bySeq;
  for (const auto& c : *colls) {
    EXPECT_EQ(c.group, "nccl-stream-0");
    EXPECT_EQ(c.op, "all_reduce");
    bySeq[c.seq].push_back(c);
  }
  ASSERT_EQ(bySeq.size(), 3u);
  for (auto& [seq, members] : bySeq) {
    ASSERT_EQ(members.size(), 2u);
    EXPECT_NE(members[0].rank, members[1].rank);
  }
  // Every collective is an NCCL kernel: the arrivals are on the device (meta collective_arrival, collectives.h).
  EXPECT_EQ(reader->metaValue("collective_arrival").value_or(""), "device");
  auto groups = reader->groups();
  ASSERT_TRUE(groups);
  ASSERT_EQ(groups->size(), 1u);
  EXPECT_EQ((*groups)[0].ranks, (std::vector<int>{0, 1}));

  auto spans = reader->spans();
  ASSERT_TRUE(spans);
  std::set<std::string> names;
  for (const auto& s : *spans) names.insert(reader->string(s.name));
  EXPECT_TRUE(names.count("myapp:forward"));
  EXPECT_TRUE(names.count("bad\xEF\xBF\xBDname"));
  // The run's time 0 is rank 1's (pid 300) first record; without a session start both share the file's clock.
  expectBreakdown(*reader, 1, a);
}

TEST(NsysImport, RankHintsAndOneFilePerRank) {
  ScratchDir dir;
  Process a = oneRank(true, 300), b = oneRank(true, 200);
  a.events.push_back({Ev::Mark, 1'000'000, 1'000'000, "rank 0"});
  b.events.push_back({Ev::Mark, 1'000'000, 1'000'000, "rank=1"});
  writeExport(dir / "x.sqlite", Layout::V3, {a});
  writeExport(dir / "y.sqlite", Layout::V3, {b});
  const std::vector<fs::path> in{dir / "y.sqlite", dir / "x.sqlite"};
  auto stats = importNsys(in, dir / "run.db");
  ASSERT_TRUE(stats) << stats.error();
  auto reader = openRun(dir / "run.db");
  ASSERT_TRUE(reader);
  auto ranks = reader->ranks();
  ASSERT_TRUE(ranks);
  ASSERT_EQ(ranks->size(), 2u);
  EXPECT_EQ((*ranks)[0].pid, 300);
  EXPECT_EQ((*ranks)[1].pid, 200);
  auto meta = reader->meta();
  EXPECT_NE((*meta)["nsys_inputs"].find("NVTX 'rank 1'"), std::string::npos);
  auto colls = reader->collectives();
  ASSERT_TRUE(colls);
  EXPECT_EQ(colls->size(), 6u);

  // The same rank twice is refused, naming both files.
  writeExport(dir / "z.sqlite", Layout::V3, {a});
  const std::vector<fs::path> twice{dir / "x.sqlite", dir / "z.sqlite"};
  auto dup = importNsys(twice, dir / "dup.db");
  ASSERT_FALSE(dup);
  EXPECT_NE(dup.error().find("x.sqlite"), std::string::npos) << dup.error();
  EXPECT_NE(dup.error().find("z.sqlite"), std::string::npos) << dup.error();
  EXPECT_FALSE(fs::exists(dir / "dup.db"));
}

// Bad input: an error naming the file, no output written, an existing output left as it was.
TEST(NsysImport, BadInputsFailCleanly) {
  ScratchDir dir;
  writeFile(dir / "run.db", "previous");
  writeFile(dir / "text.sqlite", "this is not an SQLite database, just some text that is long enough\n");
  {
    Db db(dir / "other.sqlite");
    db.exec("CREATE TABLE foo (a INTEGER)");
  }
  writeExport(dir / "good.sqlite", Layout::V3, {oneRank(true)});
  const std::string good = readFile(dir / "good.sqlite");
  writeFile(dir / "truncated.sqlite", good.substr(0, good.size() / 2));
  writeFile(dir / "empty.sqlite", "");
  writeFile(dir / "header.sqlite", good.substr(0, 100));
  for (const char* name : {"text.sqlite", "other.sqlite", "truncated.sqlite", "empty.sqlite", "header.sqlite"}) {
    SCOPED_TRACE(name);
    const std::vector<fs::path> in{dir / name};
    auto r = importNsys(in, dir / "run.db");
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().find(name), std::string::npos) << r.error();
    EXPECT_EQ(readFile(dir / "run.db"), "previous");
  }
  const std::vector<fs::path> other{dir / "other.sqlite"};
  EXPECT_NE(importNsys(other, dir / "run.db").error().find("not an Nsight Systems export"), std::string::npos);
  std::vector<std::string> left = dir.entries();
  EXPECT_EQ(std::count_if(left.begin(), left.end(), [](const std::string& n) { return n.find(".tmp-") != std::string::npos; }), 0);
}

TEST(NsysNames, NcclKernelNames) {
  // Test through the public result: an import whose kernels carry these names.
  ScratchDir dir;
  Process p{100, 0, {}};
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"ncclDevKernel_AllGather_RING_LL", "all_gather"},
      {"ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "reduce_scatter"},
      {"ncclKernel_AllReduce_RING_LL_Sum_float", "all_reduce"},
      {"ncclKernel_Broadcast_RING_LL_Sum_int8_t", "broadcast"},
      {"ncclDevKernel_SendRecv", "send_recv"},
      {"ncclDevKernel_Generic_4", "unknown"},
  };
  int64_t t = 1000;
  for (size_t k = 0; k < cases.size(); ++k, t += 10'000)
    p.events.push_back({Ev::Nccl, t, t + 5'000, cases[k].first, static_cast<int64_t>(20 + k), static_cast<int64_t>(k)});
  writeExport(dir / "n.sqlite", Layout::V3, {p});
  const std::vector<fs::path> in{dir / "n.sqlite"};
  ASSERT_TRUE(importNsys(in, dir / "run.db"));
  auto reader = openRun(dir / "run.db");
  auto colls = reader->collectives();
  ASSERT_TRUE(colls);
  ASSERT_EQ(colls->size(), cases.size());
  std::map<std::string, std::pair<std::string, std::string>> got;  // callsite -> op, dtype
  for (const auto& c : *colls) got[c.callsite] = {c.op, c.dtype};
  for (const auto& [name, op] : cases) EXPECT_EQ(got[name].first, op) << name;
  EXPECT_EQ(got["ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL"].second, "bfloat16");
  EXPECT_EQ(got["ncclKernel_AllReduce_RING_LL_Sum_float"].second, "float32");
  EXPECT_EQ(got["ncclKernel_Broadcast_RING_LL_Sum_int8_t"].second, "int8");
}

// report --json "kernels" on a real PyTorch profiler trace (Kineto import), against the trace's own kernel events.
TEST(ReportKernels, SharedKinetoTrace) {
  const fs::path trace = sharedKineto() / "nccl_parser_config_nccl_data.json.gz";
  if (!fs::exists(trace)) GTEST_SKIP() << "shared Kineto traces not found at " << sharedKineto();
  ScratchDir dir;
  const std::vector<fs::path> in{trace};
  ASSERT_TRUE(importKineto(in, dir / "run.db"));
  auto reader = openRun(dir / "run.db");
  ASSERT_TRUE(reader);
  auto report = analysis::buildReport(*reader);
  ASSERT_TRUE(report) << report.error();
  const auto j = nlohmann::json::parse(report::reportToJson(*report, "run.db"));
  ASSERT_TRUE(j.contains("kernels"));

  std::map<std::string, std::pair<int64_t, long double>> byName;  // name -> count, µs
  int64_t n = 0;
  long double totalUs = 0;
  for (const auto& e : loadEvents(trace)) {
    if (!e.is_object() || e.value("ph", "") != "X" || e.value("cat", "") != "kernel") continue;
    const long double dur = e["dur"].get<double>();
    auto& [c, us] = byName[e.value("name", "")];
    ++c;
    us += dur;
    ++n;
    totalUs += dur;
  }
  ASSERT_GT(n, 0);
  EXPECT_EQ(j["kernels"]["count"], n);
  EXPECT_NEAR(j["kernels"]["total_ms"].get<double>(), static_cast<double>(totalUs / 1000), 1e-5 * static_cast<double>(totalUs / 1000));
  std::vector<std::pair<long double, std::string>> ranked;
  for (const auto& [name, v] : byName) ranked.emplace_back(v.second, name);
  std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
  const auto& top = j["kernels"]["top"];
  ASSERT_EQ(top.size(), std::min<size_t>(10, ranked.size()));
  EXPECT_EQ(top[0]["name"], ranked[0].second);
  EXPECT_EQ(top[0]["count"], byName[ranked[0].second].first);
  EXPECT_NEAR(top[0]["total_ms"].get<double>(), static_cast<double>(ranked[0].first / 1000), 1e-5 * static_cast<double>(ranked[0].first / 1000));
  double sumTop = 0;
  for (const auto& k : top) sumTop += k["total_ms"].get<double>();
  EXPECT_LE(sumTop, j["kernels"]["total_ms"].get<double>() * (1 + 1e-5));
}

}  // namespace
}  // namespace tpscope::formats
