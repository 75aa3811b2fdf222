#include "flight_recorder_dump.h"

#include <algorithm>
#include <charconv>

namespace tpscope::formats::fr {

using tracedb::Result;
using tracedb::Status;

namespace {

std::string_view kindName(ValueKind k) {
  switch (k) {
    case ValueKind::None: return "None";
    case ValueKind::Bool: return "a bool";
    case ValueKind::Int: return "an int";
    case ValueKind::Float: return "a float";
    case ValueKind::String: return "a string";
    case ValueKind::Bytes: return "bytes";
    case ValueKind::List: return "a list";
    case ValueKind::Tuple: return "a tuple";
    case ValueKind::Dict: return "a dict";
  }
  return "?";
}

std::optional<int64_t> parseInt(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

// An integer written as an int, a bool, an integral float or a string of digits (the JSON's pg_status).
std::optional<int64_t> asInt(const Value* v) {
  if (!v) return std::nullopt;
  switch (v->kind) {
    case ValueKind::Int:
      if (v->intOverflow) return std::nullopt;
      return v->i;
    case ValueKind::Bool: return v->i;
    case ValueKind::Float:
      if (v->d == static_cast<double>(static_cast<int64_t>(v->d))) return static_cast<int64_t>(v->d);
      return std::nullopt;
    case ValueKind::String: return parseInt(v->s);
    default: return std::nullopt;
  }
}

bool isSequence(const Value* v) { return v && (v->kind == ValueKind::List || v->kind == ValueKind::Tuple); }

class EntryReader {
 public:
  EntryReader(const ValueTree& t, const std::string& what) : t_(t), what_(what) {}

  Status fail(int64_t index, std::string_view key, std::string_view why) const {
    return Status::error(what_ + ": entry " + std::to_string(index) + ": '" + std::string(key) + "' " +
                         std::string(why));
  }

  Result<int64_t> requiredInt(const Value& e, int64_t index, std::string_view key) const {
    const Value* v = t_.get(e, key);
    if (!v) return fail(index, key, "is missing");
    auto i = asInt(v);
    if (!i) return fail(index, key, "is " + std::string(kindName(v->kind)) + ", not an integer");
    return *i;
  }
  // A time that may be unset: None, 0 or absent.
  std::optional<int64_t> optionalTime(const Value& e, std::string_view key) const {
    auto i = asInt(t_.get(e, key));
    if (!i || *i == 0) return std::nullopt;
    return i;
  }
  std::string optionalString(const Value& e, std::string_view key) const {
    const Value* v = t_.get(e, key);
    if (v && v->kind == ValueKind::String) return v->s;
    if (auto i = asInt(v); i && v->kind == ValueKind::Int) return std::to_string(*i);
    return "";
  }
  Result<std::vector<std::vector<int64_t>>> sizes(const Value& e, int64_t index, std::string_view key) const {
    std::vector<std::vector<int64_t>> out;
    const Value* v = t_.get(e, key);
    if (!v || v->kind == ValueKind::None) return out;
    if (!isSequence(v)) return fail(index, key, "is " + std::string(kindName(v->kind)) + ", not a list of shapes");
    for (uint32_t id : v->items) {
      const Value& shape = t_.at(id);
      if (!isSequence(&shape)) return fail(index, key, "holds a shape that is not a list");
      std::vector<int64_t> dims;
      for (uint32_t d : shape.items) {
        auto i = asInt(&t_.at(d));
        if (!i) return fail(index, key, "holds a dimension that is not an integer");
        dims.push_back(*i);
      }
      out.push_back(std::move(dims));
    }
    return out;
  }
  std::vector<std::string> strings(const Value& e, std::string_view key) const {
    std::vector<std::string> out;
    const Value* v = t_.get(e, key);
    if (!isSequence(v)) return out;
    for (uint32_t id : v->items)
      if (t_.at(id).kind == ValueKind::String) out.push_back(t_.at(id).s);
    return out;
  }
  std::vector<Frame> frames(const Value& e) const {
    std::vector<Frame> out;
    const Value* v = t_.get(e, "frames");
    if (!isSequence(v)) return out;
    for (uint32_t id : v->items) {
      const Value& f = t_.at(id);
      Frame fr;
      if (const Value* n = t_.get(f, "name"); n && n->kind == ValueKind::String) fr.name = n->s;
      if (const Value* n = t_.get(f, "filename"); n && n->kind == ValueKind::String) fr.filename = n->s;
      fr.line = asInt(t_.get(f, "line")).value_or(0);
      out.push_back(std::move(fr));
    }
    return out;
  }

  // profiling_name "<backend>:<op>[ <peers>]": the backend is what precedes the last ':' (as the analyzer splits
  // it), the op the first word after it; P2P peers "s->d" (send) and "d<-s" (recv, "?" for any source).
  Status profilingName(Entry& out, int64_t index) const {
    const std::string& name = out.profilingName;
    const size_t colon = name.rfind(':');
    std::string_view rest = name;
    if (colon != std::string::npos) {
      out.backend = name.substr(0, colon);
      rest = std::string_view(name).substr(colon + 1);
    }
    const size_t space = rest.find(' ');
    out.type = std::string(rest.substr(0, space));
    if (out.type.empty()) return fail(index, "profiling_name", "names no op: '" + name + "'");
    const std::string_view peers = space == std::string::npos ? std::string_view() : rest.substr(space + 1);
    auto peer = [](std::string_view s) -> std::optional<int> {
      if (s == "?") return Entry::kAnyPeer;
      auto i = parseInt(s);
      if (!i || *i < 0 || *i > (1 << 24)) return std::nullopt;
      return static_cast<int>(*i);
    };
    if (out.type == "send" || out.type == "recv") {
      const bool send = out.type == "send";
      const size_t arrow = peers.find(send ? "->" : "<-");
      if (arrow == std::string_view::npos) return Status::ok();  // no peers named: read as its group's P2P op
      auto a = peer(peers.substr(0, arrow)), b = peer(peers.substr(arrow + 2));
      if (!a || !b || (send && (*a < 0 || *b < 0)) || (!send && *a < 0))
        return fail(index, "profiling_name", "has peers that are not ranks: '" + name + "'");
      out.src = send ? *a : *b;
      out.dst = send ? *b : *a;
    }
    return Status::ok();
  }

  Result<Entry> read(const Value& e, int64_t index) const {
    if (e.kind != ValueKind::Dict) return Status::error(what_ + ": entry " + std::to_string(index) + " is not a dict");
    Entry out;
    auto rid = requiredInt(e, index, "record_id");
    out.recordId = rid ? *rid : index;  // 2.3 dumps carry it; without one, the position in the dump
    const Value* pg = t_.get(e, "process_group");
    if (isSequence(pg) && !pg->items.empty() && t_.at(pg->items[0]).kind == ValueKind::String) {
      out.pgName = t_.at(pg->items[0]).s;
      if (pg->items.size() > 1 && t_.at(pg->items[1]).kind == ValueKind::String) out.pgDesc = t_.at(pg->items[1]).s;
    } else if (pg && pg->kind == ValueKind::String) {
      out.pgName = pg->s;
    } else {
      return fail(index, "process_group", pg ? "is not [name, desc]" : "is missing");
    }
    out.pgId = asInt(t_.get(e, "pg_id")).value_or(-1);
    const Value* name = t_.get(e, "profiling_name");
    if (!name || name->kind != ValueKind::String) return fail(index, "profiling_name", "is missing or not a string");
    out.profilingName = name->s;
    if (Status s = profilingName(out, index); !s) return s;
    if (t_.get(e, "collective_seq_id")) {
      auto seq = requiredInt(e, index, "collective_seq_id");
      if (!seq) return seq.status();
      out.collectiveSeq = *seq;
    } else if (t_.get(e, "seq_id")) {  // before 2.3
      auto seq = requiredInt(e, index, "seq_id");
      if (!seq) return seq.status();
      out.collectiveSeq = *seq;
    } else {
      return fail(index, "collective_seq_id", "is missing");
    }
    out.p2pSeq = asInt(t_.get(e, "p2p_seq_id")).value_or(0);
    out.opId = asInt(t_.get(e, "op_id")).value_or(0);
    const Value* p2p = t_.get(e, "is_p2p");
    out.isP2p = p2p && p2p->kind == ValueKind::Bool ? p2p->i != 0 : (out.type == "send" || out.type == "recv");
    auto created = requiredInt(e, index, "time_created_ns");
    if (!created) return created.status();
    out.timeCreatedNs = *created;
    out.startedNs = optionalTime(e, "time_discovered_started_ns");
    out.completedNs = optionalTime(e, "time_discovered_completed_ns");
    if (const Value* d = t_.get(e, "duration_ms"); d && (d->kind == ValueKind::Float || d->kind == ValueKind::Int))
      out.durationMs = d->kind == ValueKind::Float ? d->d : static_cast<double>(d->i);
    auto in = sizes(e, index, "input_sizes");
    if (!in) return in.status();
    out.inputSizes = std::move(*in);
    auto outSizes = sizes(e, index, "output_sizes");
    if (!outSizes) return outSizes.status();
    out.outputSizes = std::move(*outSizes);
    out.inputDtypes = strings(e, "input_dtypes");
    out.outputDtypes = strings(e, "output_dtypes");
    out.state = optionalString(e, "state");
    out.retired = asInt(t_.get(e, "retired")).value_or(0) != 0;
    out.timeoutMs = asInt(t_.get(e, "timeout_ms")).value_or(0);
    out.threadName = optionalString(e, "thread_name");
    out.threadId = optionalString(e, "thread_id");
    out.frames = frames(e);
    return out;
  }

 private:
  const ValueTree& t_;
  const std::string& what_;
};

}  // namespace

std::optional<std::vector<int>> parseRanksText(std::string_view text) {
  while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  if (text.size() < 2 || text.front() != '[' || text.back() != ']') return std::nullopt;
  text = text.substr(1, text.size() - 2);
  std::vector<int> out;
  while (!text.empty()) {
    const size_t comma = text.find(',');
    auto i = parseInt(text.substr(0, comma));
    if (!i || *i < 0 || *i > (1 << 24)) return std::nullopt;
    out.push_back(static_cast<int>(*i));
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return out;
}

Result<Dump> readDump(const ValueTree& tree, const std::string& what) {
  const Value& root = tree.rootValue();
  if (root.kind != ValueKind::Dict)
    return Status::error(what + ": not a Flight Recorder dump (its value is " + std::string(kindName(root.kind)) +
                         ", not a dict)");
  Dump dump;
  const Value* version = tree.get(root, "version");
  if (!version || version->kind != ValueKind::String)
    return Status::error(what + ": not a Flight Recorder dump (no 'version' string)");
  dump.version = version->s;
  const size_t dot = dump.version.find('.');
  auto major = parseInt(std::string_view(dump.version).substr(0, dot));
  auto minor = dot == std::string::npos ? std::nullopt : parseInt(std::string_view(dump.version).substr(dot + 1));
  if (!major || !minor)
    return Status::error(what + ": Flight Recorder version '" + dump.version + "' is not major.minor");
  dump.major = static_cast<int>(*major);
  dump.minor = static_cast<int>(*minor);
  if (const Value* lib = tree.get(root, "comm_lib_version"); lib && lib->kind == ValueKind::String)
    dump.commLibVersion = lib->s;

  if (const Value* cfg = tree.get(root, "pg_config"); cfg && cfg->kind == ValueKind::Dict)
    for (size_t k = 0; k + 1 < cfg->items.size(); k += 2) {
      const Value& key = tree.at(cfg->items[k]);
      const Value& info = tree.at(cfg->items[k + 1]);
      PgConfig pc;
      if (key.kind == ValueKind::String) pc.name = key.s;
      if (const Value* n = tree.get(info, "name"); n && n->kind == ValueKind::String && pc.name.empty()) pc.name = n->s;
      if (const Value* d = tree.get(info, "desc"); d && d->kind == ValueKind::String) pc.desc = d->s;
      const Value* ranks = tree.get(info, "ranks");
      std::optional<std::vector<int>> parsed;
      if (ranks && ranks->kind == ValueKind::String) {
        parsed = parseRanksText(ranks->s);
      } else if (isSequence(ranks)) {
        parsed.emplace();
        for (uint32_t id : ranks->items) {
          auto r = asInt(&tree.at(id));
          if (!r || *r < 0 || *r > (1 << 24)) {
            parsed.reset();
            break;
          }
          parsed->push_back(static_cast<int>(*r));
        }
      }
      if (!parsed) {
        ++dump.skipped["pg_config group without a readable 'ranks' (members taken from the entries)"];
        continue;
      }
      pc.ranks = std::move(*parsed);
      dump.pgConfig.push_back(std::move(pc));
    }

  if (const Value* st = tree.get(root, "pg_status"); st && st->kind == ValueKind::Dict)
    for (size_t k = 0; k + 1 < st->items.size(); k += 2) {
      const Value& key = tree.at(st->items[k]);
      const Value& s = tree.at(st->items[k + 1]);
      std::string id = key.kind == ValueKind::String ? key.s : std::to_string(asInt(&key).value_or(-1));
      PgStatus ps;
      ps.lastEnqueued = asInt(tree.get(s, "last_enqueued_collective")).value_or(-1);
      ps.lastStarted = asInt(tree.get(s, "last_started_collective")).value_or(-1);
      ps.lastCompleted = asInt(tree.get(s, "last_completed_collective")).value_or(-1);
      dump.pgStatus[id] = ps;
    }

  const Value* entries = tree.get(root, "entries");  // the JSON writer omits it when there are none
  if (entries && entries->kind != ValueKind::None) {
    if (!isSequence(entries))
      return Status::error(what + ": 'entries' is " + std::string(kindName(entries->kind)) + ", not a list");
    EntryReader reader(tree, what);
    for (size_t i = 0; i < entries->items.size(); ++i) {
      auto e = reader.read(tree.at(entries->items[i]), static_cast<int64_t>(i));
      if (!e) return e.status();
      dump.entries.push_back(std::move(*e));
    }
  }
  std::stable_sort(dump.entries.begin(), dump.entries.end(),
                   [](const Entry& a, const Entry& b) { return a.recordId < b.recordId; });
  return dump;
}

}  // namespace tpscope::formats::fr
