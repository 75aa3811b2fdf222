// The copy of a merge's inputs (merge.h, merge_internal.h): worker threads read the inputs, the calling thread writes.
//
// Each worker opens its inputs with their own Reader, reads every row into memory (times moved to the run's base,
// string ids turned into indexes of the input's own strings), and hands the input's records to the writer, which
// inserts them in input order through statements prepared once (one connection cannot be shared by threads, and an
// ATTACH per input with its copy statements parsed again costs a third of the merge at thousands of rank files).
// The output's spans are in (rank, thread, begin, input id) order and renumbered in it; the other tables keep the
// input order (tests/tracedb/merge_test.cpp compares merges on different numbers of readers table by table).
#include <sqlite3.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <limits>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "merge_internal.h"
#include "sqlite_util.h"
#include "tpscope/tracedb/merge.h"
#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/run_files.h"
#include "tpscope/tracedb/writer.h"

namespace tpscope::tracedb {

namespace {

using detail::Stmt;

// One table copied row by row: the columns read from the input and the statement that writes them, the column that
// holds the rank (its clock shift applies), the columns that hold times and those that hold string ids. The column
// lists are the schema's (schema.sql).
struct TableCopy {
  const char* select;
  const char* insert;
  int rankColumn;
  std::vector<int> times;
  std::vector<int> strings;
};

enum Table : size_t { kRanks, kThreads, kGroups, kCollectives, kGradStats, kStepStats, kAlerts, kCounters,
                      kRecorderStats, kMeta, kTables };

const std::array<TableCopy, kTables>& tableCopies() {
  static const std::array<TableCopy, kTables> copies{{
      {"SELECT rank, host, pid, world_size, local_rank, tp_rank, tp_size, dp_rank, dp_size, device, clock_offset_ns, "
       "clock_uncertainty_ns, start_ns, end_ns, exit_reason FROM ranks",
       "INSERT OR REPLACE INTO ranks VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", 0, {12, 13}, {}},
      {"SELECT rank, thread, kind, name FROM threads", "INSERT OR IGNORE INTO threads VALUES (?, ?, ?, ?)", -1, {}, {}},
      {"SELECT name, ranks, size, backend FROM process_groups",
       "INSERT OR IGNORE INTO process_groups VALUES (?, ?, ?, ?)", -1, {}, {}},
      {"SELECT rank, group_name, seq, op, dtype, shape, numel, bytes, callsite, step, layer, phase, thread, enqueue_ns, "
       "start_ns, end_ns, state FROM collectives",
       "INSERT OR REPLACE INTO collectives(rank, group_name, seq, op, dtype, shape, numel, bytes, callsite, step, "
       "layer, phase, thread, enqueue_ns, start_ns, end_ns, state) "
       "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
       0, {13, 14, 15}, {}},
      {"SELECT rank, step, param, layer, l2_norm, max_abs, nan_count, inf_count, numel FROM grad_stats",
       "INSERT INTO grad_stats VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", 0, {}, {2}},
      {"SELECT rank, step, loss, lr, grad_norm, loss_scale, tokens, begin_ns, end_ns, skipped FROM step_stats",
       "INSERT OR REPLACE INTO step_stats VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", 0, {7, 8}, {}},
      {"SELECT rank, step, ts_ns, severity, kind, layer, param, message, evidence FROM alerts ORDER BY ts_ns, id",
       "INSERT INTO alerts(rank, step, ts_ns, severity, kind, layer, param, message, evidence) "
       "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
       0, {2}, {}},
      {"SELECT rank, name, ts_ns, value FROM counters", "INSERT INTO counters VALUES (?, ?, ?, ?)", 0, {2}, {1}},
      {"SELECT rank, ts_ns, spans_written, spans_dropped, records_written, records_dropped, flushes, flush_ns_max, "
       "flush_ns_total, probe_overhead_ns FROM recorder_stats",
       "INSERT INTO recorder_stats VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", 0, {1}, {}},
      {"SELECT key, value FROM meta "
       "WHERE key NOT IN ('format', 'run_id', 'epoch_unix_ns', 'source', 'tool', 'clock_aligned')",
       "INSERT OR IGNORE INTO meta VALUES (?, ?)", -1, {}, {}},
  }};
  return copies;
}

// The rows of one table of one input, column values as SQLite gave them (NULL stays NULL: a NaN norm, a collective
// that never started). Text lives in one buffer per table.
struct Cell {
  int type = SQLITE_NULL;
  uint32_t size = 0;  // SQLITE_TEXT: its length in Rows::text
  int64_t i = 0;      // SQLITE_INTEGER; SQLITE_TEXT: its offset in Rows::text
  double f = 0;       // SQLITE_FLOAT
};

struct Rows {
  int columns = 0;
  std::vector<Cell> cells;
  std::string text;
};

struct Span {
  int64_t id;  // the input's
  int rank, thread, kind;
  uint32_t name;  // index into InputRecords::strings
  int64_t begin, dur;
  int step, layer, phase;
  int64_t correlation;  // the input's span id, or -1; after selection: the index of that span here, or -1
};

// One input, read: what the writer inserts.
struct InputRecords {
  std::vector<std::string> strings;  // the input's strings, in id order
  std::vector<Span> spans;           // those copied, in output order
  std::array<Rows, kTables> tables;
};

Status readError(sqlite3* db, const std::filesystem::path& path, const std::filesystem::path& output) {
  return detail::sqliteError(db, path, "cannot merge it into " + output.string());
}

// MergeSpans::Ends: each rank's newest kEndSpans spans and its first, by (begin, thread, id), so that a query for a
// rank's first or newest spans through the spans_rank_begin index finds the same spans as in the run file.
void keepEnds(std::vector<Span>& spans) {
  auto byTime = [](const Span& a, const Span& b) {
    return std::tie(a.begin, a.thread, a.id) < std::tie(b.begin, b.thread, b.id);
  };
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.rank < b.rank; });
  std::vector<Span> kept;
  for (auto from = spans.begin(); from != spans.end();) {
    auto to = std::find_if(from, spans.end(), [&](const Span& s) { return s.rank != from->rank; });
    const auto newest = to - from > kEndSpans ? to - kEndSpans : from;
    std::nth_element(from, newest, to, byTime);
    kept.insert(kept.end(), newest, to);
    if (newest != from) kept.push_back(*std::min_element(from, newest, byTime));
    from = to;
  }
  spans = std::move(kept);
}

// The spans in output order (rank, thread, begin, id), correlations turned into indexes of that order.
void orderSpans(std::vector<Span>& spans) {
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return std::tie(a.rank, a.thread, a.begin, a.id) < std::tie(b.rank, b.thread, b.begin, b.id);
  });
  std::unordered_map<int64_t, int64_t> index;
  index.reserve(spans.size());
  for (size_t i = 0; i < spans.size(); ++i) index.emplace(spans[i].id, static_cast<int64_t>(i));
  for (Span& s : spans) {
    if (s.correlation < 0) continue;
    const auto it = index.find(s.correlation);
    s.correlation = it == index.end() ? -1 : it->second;
  }
}

// An input being read: its connection, its strings by id and the shift of its ranks' times.
struct InputReading {
  InputReading(Reader& r, const FileClock& c, const std::filesystem::path& o)
      : reader(r), db(detail::Access::db(r)), clock(c), output(o), cachedShift(c.shiftNs(0)) {}

  Reader& reader;
  sqlite3* db;
  const FileClock& clock;
  const std::filesystem::path& output;
  std::unordered_map<int64_t, uint32_t> stringIndex;  // the input's string id -> index into InputRecords::strings
  int cachedRank = 0;
  int64_t cachedShift;

  int64_t shiftOf(int rank) {
    if (rank != cachedRank) {
      cachedRank = rank;
      cachedShift = clock.shiftNs(rank);
    }
    return cachedShift;
  }
  Status error() const { return readError(db, reader.path(), output); }
};

Status readStrings(InputReading& in, InputRecords& out) {
  Stmt st(in.db, "SELECT id, value FROM strings ORDER BY id");
  if (!st.valid()) return in.error();
  int rc;
  while ((rc = st.step()) == SQLITE_ROW) {
    in.stringIndex.emplace(st.i64(0), static_cast<uint32_t>(out.strings.size()));
    out.strings.push_back(st.text(1));
  }
  return rc == SQLITE_DONE ? Status::ok() : in.error();
}

// The spans a merge copies of the input, in output order. MergeSpans::Ends reads the four columns the choice needs of
// every span, then the chosen rows; an input with a pipeline layout gives every span.
Status readSpans(InputReading& in, MergeSpans which, InputRecords& out) {
  {
    Stmt pipeline(in.db, "SELECT 1 FROM meta WHERE key = ?");
    if (!pipeline.valid()) return in.error();
    pipeline.bind(1, meta_keys::kPipeline);
    if (pipeline.step() == SQLITE_ROW) which = MergeSpans::All;
  }
  constexpr const char* kColumns =
      "SELECT id, rank, thread, kind, name, begin_ns, dur_ns, step, layer, phase, correlation FROM spans";
  // A span whose name is not among the strings is left out (after the choice of the end spans).
  auto add = [&](Stmt& st) {
    const auto name = in.stringIndex.find(st.i64(4));
    if (name == in.stringIndex.end()) return;
    const int rank = st.i32(1);
    out.spans.push_back({st.i64(0), rank, st.i32(2), st.i32(3), name->second, st.i64(5) + in.shiftOf(rank),
                         st.i64(6), st.i32(7), st.i32(8), st.i32(9), st.isNull(10) ? -1 : st.i64(10)});
  };
  int rc;
  std::vector<int64_t> ids;  // MergeSpans::Ends: the ids chosen, ascending
  size_t below = 0;          // ...of which the first `below` are read one by one, the rest by one scan
  if (which == MergeSpans::Ends) {
    std::vector<Span> keys;
    Stmt st(in.db, "SELECT id, rank, thread, begin_ns FROM spans");
    if (!st.valid()) return in.error();
    while ((rc = st.step()) == SQLITE_ROW)
      keys.push_back({st.i64(0), st.i32(1), st.i32(2), 0, 0, st.i64(3), 0, 0, 0, 0, -1});
    if (rc != SQLITE_DONE) return in.error();
    keepEnds(keys);
    std::set<int> ranks;
    for (const Span& k : keys) {
      ids.push_back(k.id);
      ranks.insert(k.rank);
    }
    std::sort(ids.begin(), ids.end());
    // The chosen ids are mostly the newest (a span is written when it ends), the ranks' first spans aside: those
    // below the lowest of the rest are read one by one.
    below = ids.size() > ranks.size() ? ranks.size() : 0;
    Stmt one(in.db, (std::string(kColumns) + " WHERE id = ?").c_str());
    if (!one.valid()) return in.error();
    for (size_t i = 0; i < below; ++i) {
      one.bind(1, ids[i]);
      if ((rc = one.step()) == SQLITE_ROW) add(one);
      else if (rc != SQLITE_DONE) return in.error();
      sqlite3_reset(one.get());
    }
  }
  Stmt scan(in.db, (std::string(kColumns) + " WHERE id >= ?").c_str());
  if (!scan.valid()) return in.error();
  const bool all = which == MergeSpans::All;
  scan.bind(1, all ? std::numeric_limits<int64_t>::min()
                   : (ids.empty() ? std::numeric_limits<int64_t>::max() : ids[below]));
  auto next = ids.begin() + static_cast<std::ptrdiff_t>(below);
  while ((rc = scan.step()) == SQLITE_ROW) {
    if (!all) {
      const int64_t id = scan.i64(0);
      while (next != ids.end() && *next < id) ++next;
      if (next == ids.end() || *next != id) continue;
    }
    add(scan);
  }
  if (rc != SQLITE_DONE) return in.error();
  orderSpans(out.spans);
  return Status::ok();
}

// One table's rows (TableCopy), times shifted and string ids turned into indexes of the input's strings.
Status readTable(InputReading& in, const TableCopy& copy, Rows& rows) {
  Stmt st(in.db, copy.select);
  if (!st.valid()) return in.error();
  rows.columns = sqlite3_column_count(st.get());
  int rc;
  while ((rc = st.step()) == SQLITE_ROW) {
    const size_t first = rows.cells.size();
    for (int c = 0; c < rows.columns; ++c) {
      sqlite3_value* v = sqlite3_column_value(st.get(), c);  // one call per column, then the value's own
      Cell cell;
      cell.type = sqlite3_value_type(v);
      if (cell.type == SQLITE_INTEGER) {
        cell.i = sqlite3_value_int64(v);
      } else if (cell.type == SQLITE_FLOAT) {
        cell.f = sqlite3_value_double(v);
      } else if (cell.type == SQLITE_TEXT || cell.type == SQLITE_BLOB) {
        const auto* text = reinterpret_cast<const char*>(sqlite3_value_text(v));
        const size_t size = static_cast<size_t>(sqlite3_value_bytes(v));
        cell.type = SQLITE_TEXT;
        cell.i = static_cast<int64_t>(rows.text.size());
        cell.size = static_cast<uint32_t>(size);
        rows.text.append(text != nullptr ? text : "", text != nullptr ? size : 0);
      }
      rows.cells.push_back(cell);
    }
    Cell* row = rows.cells.data() + first;
    const int64_t shift = copy.rankColumn < 0 ? 0 : in.shiftOf(static_cast<int>(row[copy.rankColumn].i));
    for (int c : copy.times)
      if (row[c].type == SQLITE_INTEGER) row[c].i += shift;
    bool named = true;
    for (int c : copy.strings) {
      const auto it = in.stringIndex.find(row[c].i);
      if (it == in.stringIndex.end()) named = false;  // a row naming no string is left out
      else row[c].i = it->second;
    }
    if (!named) rows.cells.resize(first);
  }
  return rc == SQLITE_DONE ? Status::ok() : in.error();
}

Result<InputRecords> readInput(Reader& reader, const FileClock& clock, MergeSpans which,
                               const std::filesystem::path& output) {
  InputReading in(reader, clock, output);
  InputRecords out;
  if (Status s = readStrings(in, out); !s) return s;
  if (Status s = readSpans(in, which, out); !s) return s;
  for (size_t t = 0; t < kTables; ++t)
    if (Status s = readTable(in, tableCopies()[t], out.tables[t]); !s) return s;
  return out;
}

// "INSERT ... VALUES (?, ...)" with its row of parameters repeated `rows` times.
std::string batched(const char* insert, int rows) {
  const std::string sql = insert;
  const size_t values = sql.rfind("VALUES ") + 7;
  std::string out = sql.substr(0, values);
  for (int r = 0; r < rows; ++r) out += (r ? ", " : "") + sql.substr(values);
  return out;
}

// The output side: every statement prepared once, for one row and for kBatch rows. A statement's execution opens
// its table and index cursors: one execution per kBatch rows rather than per row halves the writer's time.
class OutputInserts {
 public:
  static constexpr int kBatch = 32;

  OutputInserts(Writer& writer, const std::filesystem::path& output)
      : writer_(writer), db_(detail::Access::db(writer)), output_(output) {
    constexpr const char* kSpan =
        "INSERT INTO spans(id, rank, thread, kind, name, begin_ns, dur_ns, step, layer, phase, correlation) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
    spans_ = {Stmt(db_, kSpan), Stmt(db_, batched(kSpan, kBatch).c_str())};
    for (size_t t = 0; t < kTables; ++t) {
      const char* insert = tableCopies()[t].insert;
      tables_[t] = {Stmt(db_, insert), Stmt(db_, batched(insert, kBatch).c_str())};
    }
  }

  bool valid() {
    auto ok = [](Statements& s) { return s.one.valid() && s.batch.valid(); };
    return ok(spans_) && std::all_of(tables_.begin(), tables_.end(), ok);
  }

  Status write(const InputRecords& in, const std::filesystem::path& input) {
    what_ = "cannot merge it into " + output_.string();
    input_ = &input;
    std::vector<int64_t> ids(in.strings.size());
    for (size_t i = 0; i < in.strings.size(); ++i) {
      auto id = writer_.intern(in.strings[i]);
      if (!id) return id.status();
      ids[i] = *id;
    }
    const int64_t base = spanId_;
    auto bindSpan = [&](Stmt& st, int p, const Span& s) {
      st.bind(p + 1, base + 1 + (&s - in.spans.data()));
      st.bind(p + 2, s.rank);
      st.bind(p + 3, s.thread);
      st.bind(p + 4, s.kind);
      st.bind(p + 5, ids[s.name]);
      st.bind(p + 6, s.begin);
      st.bind(p + 7, s.dur);
      st.bind(p + 8, s.step);
      st.bind(p + 9, s.layer);
      st.bind(p + 10, s.phase);
      if (s.correlation >= 0) st.bind(p + 11, base + s.correlation + 1);
      else st.bindNull(p + 11);
    };
    if (Status s = insertRows(spans_, in.spans.size(), 11, [&](Stmt& st, int p, size_t r) { bindSpan(st, p, in.spans[r]); });
        !s)
      return s;
    spanId_ += static_cast<int64_t>(in.spans.size());
    for (size_t t = 0; t < kTables; ++t) {
      const TableCopy& copy = tableCopies()[t];
      const Rows& rows = in.tables[t];
      if (rows.columns == 0) continue;
      auto bindRow = [&](Stmt& st, int p, size_t r) {
        const Cell* row = rows.cells.data() + r * rows.columns;
        for (int c = 0; c < rows.columns; ++c) {
          const Cell& cell = row[c];
          if (cell.type == SQLITE_INTEGER) st.bind(p + c + 1, cell.i);
          else if (cell.type == SQLITE_FLOAT) st.bind(p + c + 1, cell.f);
          else if (cell.type == SQLITE_TEXT)  // static: rows.text outlives the execution, and every parameter is
            sqlite3_bind_text(st.get(), p + c + 1, rows.text.data() + cell.i, static_cast<int>(cell.size),
                              SQLITE_STATIC);  // bound again before the next one
          else st.bindNull(p + c + 1);
        }
        for (int c : copy.strings) st.bind(p + c + 1, ids[row[c].i]);
      };
      if (Status s = insertRows(tables_[t], rows.cells.size() / rows.columns, rows.columns, bindRow); !s) return s;
    }
    return Status::ok();
  }

 private:
  struct Statements {
    Stmt one, batch;
  };

  // Rows [0, n) through `s`: kBatch at a time, the rest one by one; bind(stmt, first parameter - 1, row).
  template <class Bind>
  Status insertRows(Statements& s, size_t n, int columns, const Bind& bind) {
    size_t r = 0;
    for (; r + kBatch <= n; r += kBatch) {
      for (int k = 0; k < kBatch; ++k) bind(s.batch, k * columns, r + k);
      if (Status e = run(s.batch); !e) return e;
    }
    for (; r < n; ++r) {
      bind(s.one, 0, r);
      if (Status e = run(s.one); !e) return e;
    }
    return Status::ok();
  }

  // Every parameter is bound again before the next execution: a reset without clearing the bindings.
  Status run(Stmt& st) {
    const int rc = st.step();
    sqlite3_reset(st.get());
    if (rc != SQLITE_DONE) return detail::sqliteError(db_, *input_, what_);
    return Status::ok();
  }

  Writer& writer_;
  sqlite3* db_;
  std::filesystem::path output_;
  Statements spans_;
  std::array<Statements, kTables> tables_;
  int64_t spanId_ = 0;  // the output's newest span id
  std::string what_;
  const std::filesystem::path* input_ = nullptr;
};

}  // namespace

Result<RunFiles> detail::openInputs(std::span<const std::filesystem::path> inputs, size_t threads) {
  threads = std::clamp<size_t>(threads, 1, inputs.size());
  std::vector<std::optional<Result<RunFiles>>> parts(threads);
  std::vector<std::thread> workers;
  for (size_t p = 0; p < threads; ++p)
    workers.emplace_back([&, p]() {
      const size_t from = inputs.size() * p / threads, to = inputs.size() * (p + 1) / threads;
      parts[p].emplace(openRunFiles(inputs.subspan(from, to - from), /*keepReaders=*/false));
    });
  for (auto& w : workers) w.join();
  RunFiles run;
  for (auto& part : parts) {
    if (!*part) return part->status();
    for (RunFile& f : (*part)->files) run.files.push_back(std::move(f));
  }
  run.epochUnixNs = run.files.front().clock.epochUnixNs;
  for (const RunFile& f : run.files) run.epochUnixNs = std::min(run.epochUnixNs, f.clock.epochUnixNs);
  for (RunFile& f : run.files) f.clock.epochShiftNs = f.clock.epochUnixNs - run.epochUnixNs;
  return run;
}

namespace {

Result<InputRecords> readFile(size_t index, const RunFile& file, MergeSpans which, const EachInput& each,
                              const std::filesystem::path& output) {
  auto reader = Reader::open(file.path);
  if (!reader) return reader.status();
  (*reader)->preferMemoryMap();
  if (each)
    if (Status s = each(index, **reader, file.clock); !s) return s;
  return readInput(**reader, file.clock, which, output);
}

// The inputs read on worker threads, at most kReadAheadPerThread per thread ahead of the writer, and taken by the
// writer in input order. The inputs read ahead hold at most kReadAheadBytes of file between them (a rank file's
// records take about its size in memory), unless one alone is more: the input the writer takes next is always read.
// Destroying it stops and joins the workers.
class ReadAhead {
 public:
  static constexpr size_t kReadAheadPerThread = 4;
  static constexpr uintmax_t kReadAheadBytes = uintmax_t{1} << 30;

  ReadAhead(const RunFiles& run, size_t threads, MergeSpans which, const EachInput& each,
            const std::filesystem::path& output)
      : slots_(run.files.size()), bytes_(run.files.size(), 0), window_(kReadAheadPerThread * threads) {
    for (size_t t = 0; t < threads; ++t)
      workers_.emplace_back([this, &run, which, &each, &output]() {
        for (size_t i; (i = next_.fetch_add(1)) < slots_.size();) {
          std::error_code ec;
          const uintmax_t size = std::filesystem::file_size(run.files[i].path, ec);
          {
            std::unique_lock lock(mutex_);
            changed_.wait(lock, [&] {
              return stop_ || (i < taken_ + window_ && (i == taken_ || heldBytes_ + size <= kReadAheadBytes));
            });
            if (stop_) return;
            bytes_[i] = ec ? 0 : size;
            heldBytes_ += bytes_[i];
          }
          Result<InputRecords> records = readFile(i, run.files[i], which, each, output);
          std::lock_guard lock(mutex_);
          slots_[i].emplace(std::move(records));
          changed_.notify_all();
        }
      });
  }
  ~ReadAhead() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
      changed_.notify_all();
    }
    for (auto& w : workers_) w.join();
  }
  ReadAhead(const ReadAhead&) = delete;
  ReadAhead& operator=(const ReadAhead&) = delete;

  // Input i's records, once read; inputs are taken in order, each once.
  Result<InputRecords> take(size_t i) {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return slots_[i].has_value(); });
    Result<InputRecords> records = std::move(*slots_[i]);
    slots_[i].reset();
    heldBytes_ -= bytes_[i];
    taken_ = i + 1;
    changed_.notify_all();
    return records;
  }

 private:
  std::vector<std::optional<Result<InputRecords>>> slots_;
  std::vector<uintmax_t> bytes_;  // each input's file size, counted from its reading until the writer takes it
  uintmax_t heldBytes_ = 0;
  const size_t window_;
  std::mutex mutex_;
  std::condition_variable changed_;
  size_t taken_ = 0;
  bool stop_ = false;
  std::atomic<size_t> next_{0};
  std::vector<std::thread> workers_;
};

}  // namespace

Status detail::copyInputs(Writer& writer, const RunFiles& run, size_t threads, MergeSpans which,
                          const EachInput& each, const std::filesystem::path& output) {
  OutputInserts inserts(writer, output);  // its statements are finalised on return, before the writer closes
  if (!inserts.valid()) return detail::sqliteError(detail::Access::db(writer), writer.path(), "cannot prepare the merge");
  if (Status s = writer.begin(); !s) return s;
  ReadAhead read(run, threads, which, each, output);  // stops and joins its workers on every return
  for (size_t i = 0; i < run.files.size(); ++i) {
    Result<InputRecords> records = read.take(i);
    if (!records) return records.status();
    if (Status s = inserts.write(*records, run.files[i].path); !s) return s;
  }
  return Status::ok();
}

}  // namespace tpscope::tracedb
