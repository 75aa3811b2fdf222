#include "nsys_read.h"

#include <algorithm>
#include <functional>
#include <set>
#include <unordered_map>

#include "nsys_names.h"
#include "tpscope/tracedb/foreign_sqlite.h"

namespace tpscope::formats::nsys {

using tracedb::ForeignDb;
using tracedb::ForeignRow;
using tracedb::Result;
using tracedb::Status;

namespace {

constexpr const char* kKernel = "CUPTI_ACTIVITY_KIND_KERNEL";
constexpr const char* kMemcpy = "CUPTI_ACTIVITY_KIND_MEMCPY";
constexpr const char* kMemset = "CUPTI_ACTIVITY_KIND_MEMSET";
constexpr const char* kRuntime = "CUPTI_ACTIVITY_KIND_RUNTIME";
constexpr const char* kNvtx = "NVTX_EVENTS";

// NVTX_EVENTS.eventType values (ENUM_NSYS_EVENT_TYPE): ranges, marks, domain creation.
constexpr int64_t kNvtxMark = 34, kNvtxPushPop = 59, kNvtxStartEnd = 60, kNvtxtPushPop = 70, kNvtxtStartEnd = 71,
                  kNvtxDomainCreate = 75;

// The strings of one file: StringIds resolved once, every name interned once, sanitised.
class Names {
 public:
  explicit Names(std::vector<std::string>& out) : out_(out) {
    out_.clear();
    out_.emplace_back();
    ids_.emplace(std::string(), 0);
  }
  uint32_t intern(std::string_view raw) {
    std::string clean = sanitizeUtf8(raw);
    auto [it, inserted] = ids_.emplace(std::move(clean), static_cast<uint32_t>(out_.size()));
    if (inserted) out_.push_back(it->first);
    return it->second;
  }
  void addStringId(int64_t id, std::string_view raw) { byStringId_[id] = intern(raw); }
  bool haveStringIds() const { return !byStringId_.empty(); }
  // A string column's value: an integer is a StringIds id, text is the string itself; 0 ("") for NULL/unknown ids.
  uint32_t value(const ForeignRow& r, int c) {
    if (r.isNull(c)) return 0;
    if (r.isInteger(c)) {
      auto it = byStringId_.find(r.i64(c));
      if (it == byStringId_.end()) {
        ++unknownIds;
        return 0;
      }
      return it->second;
    }
    return intern(r.view(c));
  }
  const std::string& text(uint32_t id) const { return out_[id]; }
  int64_t unknownIds = 0;

 private:
  std::vector<std::string>& out_;
  std::unordered_map<std::string, uint32_t> ids_;
  std::unordered_map<int64_t, uint32_t> byStringId_;
};

// SELECT of `wanted` columns from `table`, a column the table lacks read as NULL. `required` columns must exist.
struct Select {
  std::string sql;
  std::vector<bool> present;
};

Result<Select> selectColumns(ForeignDb& db, const std::string& table, const std::vector<std::string>& wanted,
                             const std::vector<std::string>& required, const std::string& where = "") {
  auto cols = db.columns(table);
  if (!cols) return cols.status();
  const std::set<std::string> have(cols->begin(), cols->end());
  for (const std::string& r : required)
    if (!have.count(r))
      return Status::error(db.path().string() + ": table " + table + " has no column '" + r +
                           "' (not an Nsight Systems export this importer knows)");
  Select s;
  s.sql = "SELECT ";
  for (size_t i = 0; i < wanted.size(); ++i) {
    const bool ok = have.count(wanted[i]) > 0;
    s.present.push_back(ok);
    s.sql += (i ? ", " : "") + (ok ? "\"" + wanted[i] + "\"" : std::string("NULL"));
  }
  s.sql += " FROM \"" + table + "\"" + where;
  return s;
}

Status readStrings(ForeignDb& db, const std::set<std::string>& tables, Names& names) {
  if (!tables.count("StringIds")) return Status::ok();
  auto sel = selectColumns(db, "StringIds", {"id", "value"}, {"id", "value"});
  if (!sel) return sel.status();
  return db.select(sel->sql, "table StringIds", [&](const ForeignRow& r) {
    names.addStringId(r.i64(0), r.view(1));
    return true;
  });
}

std::string memcpyName(std::optional<int64_t> copyKind) {
  // CUpti_ActivityMemcpyKind
  static constexpr const char* kKinds[] = {"", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA", "AtoD", "DtoA", "DtoD", "HtoH",
                                           "PtoP"};
  if (copyKind && *copyKind > 0 && *copyKind <= 10) return std::string("CUDA memcpy ") + kKinds[*copyKind];
  return "CUDA memcpy";
}

Status readGpu(ForeignDb& db, const std::set<std::string>& tables, Names& names, NsysFile& f) {
  for (const char* table : {kKernel, kMemcpy, kMemset}) {
    if (!tables.count(table)) continue;
    const GpuKind kind = table == kKernel ? GpuKind::Kernel : table == kMemcpy ? GpuKind::Memcpy : GpuKind::Memset;
    auto sel = selectColumns(db, table,
                             {"start", "end", "deviceId", "streamId", "correlationId", "globalPid", "demangledName",
                              "shortName", "mangledName", "copyKind"},
                             {"start", "end"});
    if (!sel) return sel.status();
    const bool havePid = sel->present[5];
    Status s = db.select(sel->sql, std::string("table ") + table, [&](const ForeignRow& r) {
      if (r.isNull(0) || r.isNull(1) || r.i64(1) < r.i64(0)) {
        f.skipped[std::string(table) + " row without a valid start/end"]++;
        return true;
      }
      GpuRow g;
      g.kind = kind;
      g.start = r.i64(0);
      g.end = r.i64(1);
      g.device = r.optI64(2).value_or(0);
      g.stream = r.optI64(3).value_or(0);
      g.correlation = r.optI64(4).value_or(-1);
      if (havePid && !r.isNull(5)) g.process = processKey(r.i64(5));
      if (kind == GpuKind::Kernel) {
        const uint32_t demangled = names.value(r, 6), shortName = names.value(r, 7), mangled = names.value(r, 8);
        g.name = demangled ? demangled : shortName ? shortName : mangled;
        g.shortName = shortName ? shortName : g.name;
        if (g.name == 0) g.name = g.shortName = names.intern("(unnamed kernel)");
      } else if (kind == GpuKind::Memcpy) {
        g.name = g.shortName = names.intern(memcpyName(r.optI64(9)));
      } else {
        g.name = g.shortName = names.intern("CUDA memset");
      }
      f.gpu.push_back(g);
      return true;
    });
    if (!s) return s;
  }
  return Status::ok();
}

Status readRuntime(ForeignDb& db, const std::set<std::string>& tables, Names& names, NsysFile& f) {
  if (!tables.count(kRuntime)) return Status::ok();
  auto sel = selectColumns(db, kRuntime, {"start", "end", "globalTid", "correlationId", "nameId", "name"},
                           {"start", "end"});
  if (!sel) return sel.status();
  return db.select(sel->sql, std::string("table ") + kRuntime, [&](const ForeignRow& r) {
    if (r.isNull(0) || r.isNull(1) || r.i64(1) < r.i64(0)) {
      f.skipped[std::string(kRuntime) + " row without a valid start/end"]++;
      return true;
    }
    RuntimeRow row;
    row.start = r.i64(0);
    row.end = r.i64(1);
    row.globalTid = r.optI64(2).value_or(0);
    row.correlation = r.optI64(3).value_or(-1);
    row.name = names.value(r, 4);
    if (row.name == 0) row.name = names.value(r, 5);
    if (row.name == 0) row.name = names.intern("(CUDA runtime call)");
    f.runtime.push_back(row);
    return true;
  });
}

Status readNvtx(ForeignDb& db, const std::set<std::string>& tables, Names& names, NsysFile& f) {
  if (!tables.count(kNvtx)) return Status::ok();
  auto sel = selectColumns(db, kNvtx, {"start", "end", "eventType", "globalTid", "text", "textId", "domainId"},
                           {"start", "eventType"});
  if (!sel) return sel.status();
  std::map<std::pair<int64_t, int64_t>, uint32_t> domains;  // (processKey, domainId) -> name
  std::vector<std::pair<NvtxRow, int64_t>> rows;            // with their domain id
  Status s = db.select(sel->sql, std::string("table ") + kNvtx, [&](const ForeignRow& r) {
    const int64_t type = r.optI64(2).value_or(-1);
    const int64_t tid = r.optI64(3).value_or(0);
    uint32_t text = names.value(r, 4);
    if (text == 0) text = names.value(r, 5);
    const int64_t domain = r.optI64(6).value_or(0);
    if (type == kNvtxDomainCreate) {
      domains[{processKey(tid), domain}] = text;
      return true;
    }
    const bool range = type == kNvtxPushPop || type == kNvtxStartEnd || type == kNvtxtPushPop || type == kNvtxtStartEnd;
    if (!range && type != kNvtxMark) {
      f.skipped["NVTX_EVENTS eventType " + std::to_string(type) + " (not imported)"]++;
      return true;
    }
    if (r.isNull(0) || (range && (r.isNull(1) || r.i64(1) < r.i64(0)))) {
      f.skipped["NVTX range without an end (not imported)"]++;
      return true;
    }
    NvtxRow row;
    row.start = r.i64(0);
    row.end = range ? r.i64(1) : row.start;
    row.globalTid = tid;
    row.text = row.bareText = text;
    row.mark = !range;
    rows.emplace_back(row, domain);
    return true;
  });
  if (!s) return s;
  f.nvtx.reserve(rows.size());
  for (auto& [row, domain] : rows) {
    auto d = domain != 0 ? domains.find({processKey(row.globalTid), domain}) : domains.end();
    if (d != domains.end() && d->second != 0) row.text = names.intern(names.text(d->second) + ":" + names.text(row.bareText));
    f.nvtx.push_back(row);
  }
  return Status::ok();
}

// Optional tables: threads, processes, GPUs, the session's start, the schema version. Missing ones are fine.
Status readContext(ForeignDb& db, const std::set<std::string>& tables, Names& names, NsysFile& f) {
  auto optional = [&](const char* table, const std::vector<std::string>& cols,
                      const std::function<void(const ForeignRow&, const std::vector<bool>&)>& fn) -> Status {
    if (!tables.count(table)) return Status::ok();
    auto sel = selectColumns(db, table, cols, {});
    if (!sel) return sel.status();
    const std::vector<bool> present = sel->present;
    return db.select(sel->sql, std::string("table ") + table, [&](const ForeignRow& r) {
      fn(r, present);
      return true;
    });
  };
  if (Status s = optional("ThreadNames", {"globalTid", "nameId", "name"},
                          [&](const ForeignRow& r, const std::vector<bool>&) {
                            uint32_t n = names.value(r, 1);
                            if (n == 0) n = names.value(r, 2);
                            if (!r.isNull(0) && n != 0) f.threadNames[r.i64(0)] = names.text(n);
                          });
      !s)
    return s;
  if (Status s = optional("PROCESSES", {"globalPid", "pid", "name"},
                          [&](const ForeignRow& r, const std::vector<bool>&) {
                            if (r.isNull(0)) return;
                            const int64_t key = processKey(r.i64(0));
                            if (const uint32_t n = names.value(r, 2)) f.processNames[key] = names.text(n);
                            if (!r.isNull(1)) f.processPids[key] = r.i64(1);
                          });
      !s)
    return s;
  if (Status s = optional("TARGET_INFO_GPU", {"id", "name"},
                          [&](const ForeignRow& r, const std::vector<bool>&) {
                            if (!r.isNull(0)) f.gpuNames[r.i64(0)] = names.text(names.value(r, 1));
                          });
      !s)
    return s;
  if (Status s = optional("TARGET_INFO_CUDA_DEVICE", {"gpuId", "cudaId", "pid"},
                          [&](const ForeignRow& r, const std::vector<bool>&) {
                            if (!r.isNull(0) && !r.isNull(1) && !r.isNull(2)) f.cudaIds[{r.i64(2), r.i64(0)}] = r.i64(1);
                          });
      !s)
    return s;
  if (Status s = optional("TARGET_INFO_SESSION_START_TIME", {"utcEpochNs"},
                          [&](const ForeignRow& r, const std::vector<bool>&) {
                            if (!r.isNull(0) && r.isInteger(0)) f.sessionUtcNs = r.i64(0);
                          });
      !s)
    return s;
  return optional("META_DATA_EXPORT", {"name", "value"}, [&](const ForeignRow& r, const std::vector<bool>&) {
    if (r.view(0) == "EXPORT_SCHEMA_VERSION") f.schemaVersion = sanitizeUtf8(r.view(1));
  });
}

}  // namespace

Result<NsysFile> readNsysFile(const std::filesystem::path& path) {
  auto db = ForeignDb::open(path);
  if (!db) return db.status();
  NsysFile f;
  f.path = path;
  std::error_code ec;
  f.bytes = static_cast<int64_t>(std::filesystem::file_size(path, ec));
  auto list = (*db)->tables();
  if (!list) return Status::error(list.status().message() + " (not an Nsight Systems SQLite export)");
  const std::set<std::string> tables(list->begin(), list->end());
  bool any = false;
  for (const char* t : {kKernel, kMemcpy, kMemset, kRuntime, kNvtx}) any = any || tables.count(t);
  if (!any)
    return Status::error(path.string() +
                         ": not an Nsight Systems export: it has none of the tables CUPTI_ACTIVITY_KIND_KERNEL, "
                         "CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_RUNTIME, "
                         "NVTX_EVENTS (write it with 'nsys export --type sqlite')");
  Names names(f.names);
  if (Status s = readStrings(**db, tables, names); !s) return s;
  if (Status s = readGpu(**db, tables, names, f); !s) return s;
  if (Status s = readRuntime(**db, tables, names, f); !s) return s;
  if (Status s = readNvtx(**db, tables, names, f); !s) return s;
  if (Status s = readContext(**db, tables, names, f); !s) return s;
  if (names.unknownIds > 0) {
    if (!tables.count("StringIds"))
      return Status::error(path.string() + ": names refer to table StringIds, which the file does not have");
    f.skipped["string id not in StringIds (name left empty)"] += names.unknownIds;
  }
  return f;
}

}  // namespace tpscope::formats::nsys
