#include "kineto_parse.h"

#include <simdjson.h>

#include <cmath>
#include <string>

#include "json_text.h"

namespace tpscope::formats::kineto {

using namespace simdjson;
using tracedb::Result;
using tracedb::Status;

Cat categoryOf(std::string_view cat) {
  switch (cat.empty() ? '\0' : cat[0]) {
    case 'c':
      if (cat == "cpu_op") return Cat::CpuOp;
      if (cat == "cuda_runtime") return Cat::CudaRuntime;
      if (cat == "cuda_driver") return Cat::CudaDriver;
      break;
    case 'k':
      if (cat == "kernel" || cat == "Kernel") return Cat::Kernel;
      break;
    case 'g':
      if (cat == "gpu_memcpy") return Cat::GpuMemcpy;
      if (cat == "gpu_memset") return Cat::GpuMemset;
      if (cat == "gpu_user_annotation") return Cat::GpuUserAnnotation;
      break;
    case 'u':
      if (cat == "user_annotation") return Cat::UserAnnotation;
      break;
    case 'p':
      if (cat == "python_function") return Cat::PythonFunction;
      break;
    case 'M':
      if (cat == "Memcpy") return Cat::GpuMemcpy;
      if (cat == "Memset") return Cat::GpuMemset;
      break;
    case 'O':
      if (cat == "Operator") return Cat::CpuOp;
      break;
    case 'R':
      if (cat == "Runtime") return Cat::CudaRuntime;
      break;
    case 'T':
      if (cat == "Trace") return Cat::Trace;
      break;
    default:
      break;
  }
  return Cat::Other;
}

namespace {

// A field's key as written, without copying it into the parser's string buffer (Kineto's keys hold no escapes);
// unescaped only when it contains a backslash.
error_code keyOf(ondemand::field& field, std::string_view& out) {
  const char* begin = field.key().raw();
  const char* end = begin;
  while (*end != '"' && *end != '\\') ++end;  // stage 1 has checked that the string is terminated
  if (*end == '"') {
    out = std::string_view(begin, static_cast<size_t>(end - begin));
    return SUCCESS;
  }
  return field.unescaped_key().get(out);
}

// Everything one event can carry that the importer uses. Reused across events (no allocation per event).
struct EventFields {
  char ph = 0;
  std::string_view cat, name, bp;
  bool hasPid = false, hasTid = false, hasTs = false, hasDur = false, hasId = false;
  LaneKey lane;
  int64_t tsNs = 0, durNs = 0, id = 0;
  int64_t externalId = -1, correlation = -1, device = -1, stream = -1;
  bool hasMeta = false;
  CollectiveMeta meta;
  std::string_view inputDims, inputTypes;
  std::string_view argName, argLabels;  // "M" events
  bool hasArgs = false;
  SpanArgs args;
  std::vector<std::pair<std::string_view, double>> numbers;  // "C" events
  const char* malformed = nullptr;

  void reset() {
    ph = 0;
    cat = name = bp = {};
    hasPid = hasTid = hasTs = hasDur = hasId = false;
    lane = {};
    tsNs = durNs = id = 0;
    externalId = correlation = device = stream = -1;
    hasMeta = false;
    meta = {};
    inputDims = inputTypes = argName = argLabels = {};
    hasArgs = false;
    args = {};
    numbers.clear();
    malformed = nullptr;
  }
};

class FileParser {
 public:
  FileParser(KinetoFile& file, ondemand::parser& parser) : file_(file), parser_(parser) {}

  Status parse() {
    const std::string& path = file_.path.string();
    padded_string_view text(file_.buffer.text(), file_.buffer.size, file_.buffer.capacity);
    // A parser kept for the next file grows with headroom: the ranks' files of a run differ by a few bytes, and
    // iterate() alone would allocate anew for every file larger than the last.
    if (parser_.capacity() < text.length()) {
      const size_t headroom = std::min(parser_.max_capacity(), text.length() + text.length() / 8);
      if (auto error = parser_.allocate(headroom, parser_.max_depth())) return notJson(error);
    }
    ondemand::document doc;
    if (auto error = parser_.iterate(text).get(doc)) return notJson(error);
    ondemand::json_type type;
    if (auto error = doc.type().get(type)) return notJson(error);
    bool sawEvents = false;
    if (type == ondemand::json_type::array) {
      ondemand::array events;
      if (auto error = doc.get_array().get(events)) return notJson(error);
      if (Status s = parseEvents(events); !s) return s;
      sawEvents = true;
    } else if (type == ondemand::json_type::object) {
      file_.objectForm = true;
      ondemand::object root;
      if (auto error = doc.get_object().get(root)) return notJson(error);
      for (auto field : root) {
        std::string_view key;
        if (auto error = field.unescaped_key().get(key)) return notJson(error);
        ondemand::value value;
        if (auto error = field.value().get(value)) return notJson(error);
        if (key == "traceEvents") {
          ondemand::array events;
          if (auto error = value.get_array().get(events)) {
            if (error == INCORRECT_TYPE) return Status::error(path + ": \"traceEvents\" is not an array");
            return notJson(error);
          }
          if (Status s = parseEvents(events); !s) return s;
          sawEvents = true;
        } else if (key == "distributedInfo") {
          if (Status s = parseDistributedInfo(value); !s) return s;
        } else if (key == "baseTimeNanoseconds") {
          int64_t base = 0;
          if (!value.get_int64().get(base)) file_.baseTimeNs = base;
          else {
            uint64_t ubase = 0;
            if (!value.get_uint64().get(ubase)) file_.baseTimeNs = static_cast<int64_t>(ubase);
            else file_.skipped["malformed baseTimeNanoseconds (ignored)"]++;
          }
        } else if (key == "deviceProperties") {
          ondemand::array props;
          std::string_view raw;
          if (!value.get_array().get(props) && !props.raw_json().get(raw)) file_.deviceProperties = std::string(raw);
        }
      }
    } else {
      // A scalar root: tell text that is not JSON at all from a JSON value that is not a trace (a full parse of
      // the scalar document is cheap).
      dom::parser validator;
      dom::element element;
      if (auto error = validator.parse(file_.buffer.text(), file_.buffer.size, false).get(element))
        return notJson(error);
      return Status::error(path + ": not a Kineto trace (the JSON is neither an object with \"traceEvents\" nor "
                                  "an array of events)");
    }
    if (!sawEvents) return Status::error(path + ": not a Kineto trace (no \"traceEvents\")");
    if (file_.events == 0) return Status::error(path + ": no trace events");
    return Status::ok();
  }

 private:
  Status notJson(error_code error) const {
    std::string what = error_message(error);
    if (error == TAPE_ERROR || error == INCOMPLETE_ARRAY_OR_OBJECT || error == UNCLOSED_STRING ||
        error == EMPTY)
      what = "truncated or malformed JSON (" + what + ")";
    return Status::error(file_.path.string() + ": not valid JSON: " + what);
  }

  int64_t laneStringId(std::string_view s) {
    auto it = laneIds_.find(std::string(s));
    if (it != laneIds_.end()) return it->second;
    file_.laneStrings.emplace_back(s);
    const int64_t id = -static_cast<int64_t>(file_.laneStrings.size());
    laneIds_.emplace(std::string(s), id);
    return id;
  }

  // pid or tid: an integer, or a string (mapped to a negative id). False if neither.
  bool laneValue(ondemand::value& v, int64_t& out) {
    ondemand::json_type t;
    if (v.type().get(t)) return false;
    if (t == ondemand::json_type::number) {
      if (!v.get_int64().get(out)) return true;
      double d = 0;
      if (!v.get_double().get(d) && std::isfinite(d)) {
        out = static_cast<int64_t>(d);
        return true;
      }
      return false;
    }
    if (t == ondemand::json_type::string) {
      std::string_view s;
      if (v.get_string().get(s)) return false;
      out = laneStringId(s);
      return true;
    }
    return false;
  }

  static bool timeValue(ondemand::value& v, int64_t& out) {
    ondemand::json_type t;
    if (v.type().get(t) || t != ondemand::json_type::number) return false;
    std::string_view token = v.raw_json_token();
    auto ns = microsTokenToNs(token);
    if (!ns) return false;
    out = *ns;
    return true;
  }

  static bool intValue(ondemand::value& v, int64_t& out) {
    if (!v.get_int64().get(out)) return true;
    double d = 0;
    if (!v.get_double().get(d) && std::isfinite(d) && std::fabs(d) < 9e18) {
      out = static_cast<int64_t>(d);
      return true;
    }
    std::string_view s;  // some exporters quote ids
    if (!v.get_string().get(s) && !s.empty()) {
      int base = 10;
      if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        s.remove_prefix(2);
        base = 16;
      }
      try {
        size_t used = 0;
        out = static_cast<int64_t>(std::stoull(std::string(s), &used, base));
        return used == s.size();
      } catch (...) {
        return false;
      }
    }
    return false;
  }

  static std::string_view stringOrRaw(ondemand::value& v) {
    std::string_view s;
    if (!v.get_string().get(s)) return s;
    ondemand::array a;
    if (!v.get_array().get(a) && !a.raw_json().get(s)) return s;
    return {};
  }

  // The args the importer reads. Collective metadata keys mark the event as carrying metadata.
  struct IntArg {
    std::string_view key;
    int64_t EventFields::*field;
  };
  struct MetaIntArg {
    std::string_view key;
    int64_t CollectiveMeta::*field;
  };
  struct MetaStringArg {
    std::string_view key;
    std::string_view CollectiveMeta::*field;
    bool marksMeta;
  };
  static constexpr IntArg kIntArgs[] = {{"External id", &EventFields::externalId},
                                        {"correlation", &EventFields::correlation},
                                        {"device", &EventFields::device},
                                        {"stream", &EventFields::stream}};
  static constexpr MetaIntArg kMetaIntArgs[] = {{"In msg nelems", &CollectiveMeta::inNelems},
                                                {"Out msg nelems", &CollectiveMeta::outNelems},
                                                {"Group size", &CollectiveMeta::groupSize},
                                                {"Seq", &CollectiveMeta::seq},
                                                {"seq", &CollectiveMeta::seq}};
  static constexpr MetaStringArg kMetaStringArgs[] = {{"Collective name", &CollectiveMeta::name, true},
                                                      {"dtype", &CollectiveMeta::dtype, true},
                                                      {"Process Group Name", &CollectiveMeta::pgName, true},
                                                      {"Process Group Ranks", &CollectiveMeta::pgRanks, true},
                                                      {"Process Group Description", &CollectiveMeta::pgDesc, false}};

  // Reads `key` into `f` if it is an arg the importer uses; false for any other arg.
  bool parseKnownArg(std::string_view key, ondemand::value& v, EventFields& f) {
    for (const IntArg& a : kIntArgs)
      if (key == a.key) {
        intValue(v, f.*a.field);
        return true;
      }
    for (const MetaIntArg& a : kMetaIntArgs)
      if (key == a.key) {
        f.hasMeta = true;
        intValue(v, f.meta.*a.field);
        return true;
      }
    for (const MetaStringArg& a : kMetaStringArgs)
      if (key == a.key) {
        f.hasMeta = f.hasMeta || a.marksMeta;
        f.meta.*a.field = stringOrRaw(v);
        return true;
      }
    std::string_view* raw = key == "Input Dims" ? &f.inputDims : key == "Input type" ? &f.inputTypes : nullptr;
    if (raw) {
      ondemand::array a;
      if (!v.get_array().get(a) && a.raw_json().get(*raw)) *raw = {};
      return true;
    }
    std::string_view* text = key == "name" ? &f.argName : key == "labels" ? &f.argLabels : nullptr;
    if (text) {
      if (v.get_string().get(*text)) *text = {};
      return true;
    }
    parsePlaceArg(key, v, f);  // read, and still offered to a counter event as a number
    return false;
  }

  // Reads the args of SpanArgs (pipeline and tpscope-export traces); false for any other arg. Kineto's own args
  // ("External id", "Record function id", "Sequence number", ...) start with a capital and are passed over first.
  static bool parsePlaceArg(std::string_view key, ondemand::value& v, EventFields& f) {
    if (key.empty() || key[0] < 'a' || key[0] > 'z') return false;
    int64_t SpanArgs::*number = nullptr;
    if (key == "step" || key == "iteration") number = &SpanArgs::step;
    else if (key == "mb_id" || key == "microbatch" || key == "micro_batch" || key == "microbatch_id")
      number = &SpanArgs::microbatch;
    else if (key == "model_chunk" || key == "chunk_id" || key == "virtual_pp_rank") number = &SpanArgs::chunk;
    else if (key == "layer") number = &SpanArgs::layer;
    else if (key == "bytes") number = &SpanArgs::bytes;
    if (number) {
      f.hasArgs = intValue(v, f.args.*number) || f.hasArgs;
      return true;
    }
    std::string_view SpanArgs::*text = key == "phase"      ? &SpanArgs::phase
                                       : key == "group"    ? &SpanArgs::group
                                       : key == "op"       ? &SpanArgs::op
                                       : key == "callsite" ? &SpanArgs::callsite
                                       : key == "state"    ? &SpanArgs::state
                                                           : nullptr;
    if (text) {
      f.hasArgs = !v.get_string().get(f.args.*text) || f.hasArgs;
      return true;
    }
    if (key == "enqueue_ns") {
      int64_t ns = 0;
      if (intValue(v, ns)) {
        f.args.enqueueNs = ns;
        f.hasArgs = true;
      }
      return true;
    }
    if (key == "shape") {
      ondemand::array a;
      if (!v.get_array().get(a) && !a.raw_json().get(f.args.shape)) f.hasArgs = true;
      return true;
    }
    return false;
  }

  // The known args, and for counter events (or while the phase is not known yet) every numeric arg.
  void parseArgs(ondemand::object& args, EventFields& f) {
    const bool wantNumbers = f.ph == 'C' || f.ph == 0;
    for (auto result : args) {
      ondemand::field field;
      std::string_view key;
      if (std::move(result).get(field) || keyOf(field, key)) {
        f.malformed = "malformed args";
        return;
      }
      ondemand::value& v = field.value();
      if (!parseKnownArg(key, v, f) && wantNumbers) {
        double d = 0;
        if (!v.get_double().get(d)) f.numbers.emplace_back(key, d);
      }
    }
  }

  Status parseEvents(ondemand::array& events) {
    EventFields f;
    for (auto element : events) {
      ondemand::object obj;
      auto error = element.get_object().get(obj);
      if (error == INCORRECT_TYPE) {
        ++file_.events;
        file_.skipped["malformed event (not an object)"]++;
        continue;
      }
      if (error) return notJson(error);
      ++file_.events;
      f.reset();
      for (auto result : obj) {
        ondemand::field field;
        std::string_view key;
        if (auto e = std::move(result).get(field)) return notJson(e);
        if (auto e = keyOf(field, key)) return notJson(e);
        ondemand::value& v = field.value();
        if (key.size() == 2) {
          if (key == "ph") {
            std::string_view ph;
            if (!v.get_string().get(ph) && ph.size() == 1) f.ph = ph[0];
            else f.malformed = "malformed event (bad \"ph\")";
          } else if (key == "ts") {
            if (!timeValue(v, f.tsNs)) f.malformed = "malformed event (bad \"ts\")";
            else f.hasTs = true;
          } else if (key == "id") {
            f.hasId = intValue(v, f.id);
          } else if (key == "bp") {
            if (v.get_string().get(f.bp)) f.bp = {};
          }
        } else if (key == "name") {
          if (v.get_string().get(f.name)) f.malformed = "malformed event (bad \"name\")";
        } else if (key == "cat") {
          if (v.get_string().get(f.cat)) f.cat = {};
        } else if (key == "pid") {
          f.hasPid = laneValue(v, f.lane.pid);
        } else if (key == "tid") {
          f.hasTid = laneValue(v, f.lane.tid);
        } else if (key == "dur") {
          if (!timeValue(v, f.durNs) || f.durNs < 0) f.malformed = "malformed event (bad \"dur\")";
          else f.hasDur = true;
        } else if (key == "args") {
          ondemand::object args;
          if (!v.get_object().get(args)) parseArgs(args, f);
        }
        if (f.malformed) break;
      }
      if (f.malformed) {
        file_.skipped[f.malformed]++;
        continue;
      }
      finishEvent(f);
    }
    return Status::ok();
  }

  void finishEvent(EventFields& f) {
    switch (f.ph) {
      case 'X': {
        if (!f.hasTs || !f.hasDur) {
          file_.skipped["malformed complete event (no ts or dur)"]++;
          return;
        }
        if (!f.hasPid || !f.hasTid) {
          file_.skipped["malformed complete event (no pid or tid)"]++;
          return;
        }
        RawSpan s;
        s.name = f.name;
        s.cat = categoryOf(f.cat);
        s.lane = f.lane;
        s.tsNs = f.tsNs;
        s.durNs = f.durNs;
        s.externalId = f.externalId;
        s.correlation = f.correlation;
        s.device = f.device;
        s.stream = f.stream;
        s.inputDims = f.inputDims;
        s.inputTypes = f.inputTypes;
        if (f.hasMeta) {
          s.meta = static_cast<int32_t>(file_.metas.size());
          file_.metas.push_back(f.meta);
        }
        if (f.hasArgs) {
          s.args = static_cast<int32_t>(file_.spanArgs.size());
          f.args.cat = f.cat;
          file_.spanArgs.push_back(f.args);
        }
        file_.spans.push_back(s);
        return;
      }
      case 'C': {
        if (!f.hasTs) {
          file_.skipped["malformed counter event (no ts)"]++;
          return;
        }
        if (f.numbers.empty()) {
          file_.skipped["counter event without numeric args"]++;
          return;
        }
        for (const auto& [key, value] : f.numbers) {
          RawCounter c;
          c.name = f.numbers.size() == 1 && (key == f.name || key == "value") ? std::string(f.name)
                   : f.name.empty() ? std::string(key)
                                    : std::string(f.name) + "/" + std::string(key);
          c.lane = f.lane;
          c.tsNs = f.tsNs;
          c.value = value;
          file_.counters.push_back(std::move(c));
        }
        return;
      }
      case 'M':
        if (f.name == "thread_name" && !f.argName.empty() && f.hasPid && f.hasTid)
          file_.threadNames[f.lane] = std::string(f.argName);
        else if (f.name == "process_labels" && f.hasPid)
          file_.processLabels[f.lane.pid] = std::string(f.argLabels);
        else if (f.name == "process_name" && f.hasPid && !f.argName.empty())
          file_.processNames[f.lane.pid] = std::string(f.argName);  // may carry the rank (pipeline_ranks.h)
        return;  // sort indexes, ...: layout hints with no tpscope equivalent
      case 's':
      case 'f':
      case 't':
        if (f.cat == "ac2g" && f.hasId && f.hasTs && f.hasPid && f.hasTid) {
          file_.flows.push_back(RawFlow{f.ph, f.id, f.lane, f.tsNs});
        } else if (f.cat == "ac2g") {
          file_.skipped["malformed flow event"]++;
        } else {
          file_.skipped["flow '" + std::string(f.cat) + "' (not imported)"]++;
        }
        return;
      case 'i':
      case 'I':
        file_.skipped["instant event (not imported)"]++;
        return;
      case 0:
        file_.skipped["malformed event (no \"ph\")"]++;
        return;
      default:
        file_.skipped[std::string("phase '") + f.ph + "' (not imported)"]++;
        return;
    }
  }

  // distributedInfo keys of the parallel layout (Megatron's names for them), or nullptr.
  static std::optional<int> RankCoords::*coordKey(std::string_view key) {
    if (key == "pp_rank" || key == "pipeline_model_parallel_rank") return &RankCoords::pp;
    if (key == "tp_rank" || key == "tensor_model_parallel_rank") return &RankCoords::tp;
    if (key == "dp_rank" || key == "data_parallel_rank") return &RankCoords::dp;
    if (key == "pp_size" || key == "pipeline_model_parallel_size") return &RankCoords::ppSize;
    if (key == "tp_size" || key == "tensor_model_parallel_size") return &RankCoords::tpSize;
    if (key == "dp_size" || key == "data_parallel_size") return &RankCoords::dpSize;
    return nullptr;
  }

  Status parseDistributedInfo(ondemand::value& value) {
    ondemand::object info;
    if (value.get_object().get(info)) {
      file_.skipped["malformed distributedInfo (ignored)"]++;
      return Status::ok();
    }
    for (auto field : info) {
      std::string_view key;
      if (auto e = field.unescaped_key().get(key)) return notJson(e);
      ondemand::value v;
      if (auto e = field.value().get(v)) return notJson(e);
      int64_t n = 0;
      if (key == "rank") {
        if (intValue(v, n)) file_.rank = static_cast<int>(n);
      } else if (std::optional<int> RankCoords::*coord = coordKey(key)) {
        if (intValue(v, n)) file_.coords.*coord = static_cast<int>(n);
      } else if (key == "world_size") {
        if (intValue(v, n)) file_.worldSize = static_cast<int>(n);
      } else if (key == "backend") {
        std::string_view s;
        if (!v.get_string().get(s)) file_.backend = std::string(s);
      } else if (key == "pg_config") {
        ondemand::array pgs;
        if (v.get_array().get(pgs)) continue;
        for (auto pgValue : pgs) {
          ondemand::object pg;
          if (pgValue.get_object().get(pg)) continue;
          PgConfig cfg;
          for (auto pf : pg) {
            std::string_view k;
            if (pf.unescaped_key().get(k)) break;
            ondemand::value pv;
            if (pf.value().get(pv)) break;
            std::string_view s;
            if (k == "pg_name" && !pv.get_string().get(s)) cfg.name = std::string(s);
            else if (k == "pg_desc" && !pv.get_string().get(s)) cfg.desc = std::string(s);
            else if (k == "backend_config" && !pv.get_string().get(s)) cfg.backend = std::string(s);
            else if (k == "ranks") {
              ondemand::array ranks;
              if (pv.get_array().get(ranks)) continue;
              for (auto r : ranks) {
                int64_t rank = 0;
                if (!r.get_int64().get(rank)) cfg.ranks.push_back(static_cast<int>(rank));
              }
            }
          }
          if (!cfg.name.empty()) file_.pgConfig.push_back(std::move(cfg));
        }
      }
    }
    return Status::ok();
  }

  KinetoFile& file_;
  ondemand::parser& parser_;
  std::unordered_map<std::string, int64_t> laneIds_;
};

}  // namespace

Result<KinetoFile> parseKinetoFile(const std::filesystem::path& path, std::shared_ptr<void>* reuse) {
  auto buffer = readJsonFile(path);
  if (!buffer) return buffer.status();
  KinetoFile file;
  file.path = path;
  file.buffer = std::move(*buffer);
  // Unescaped strings live in the parser's buffer: the parser stays alive as long as the file's views.
  std::shared_ptr<ondemand::parser> jsonParser;
  if (reuse != nullptr && *reuse != nullptr && reuse->use_count() == 1)  // no file of it is alive
    jsonParser = std::static_pointer_cast<ondemand::parser>(*reuse);
  else
    jsonParser = std::make_shared<ondemand::parser>();
  if (reuse != nullptr) *reuse = jsonParser;
  file.stringStorage = jsonParser;
  file.spans.reserve(file.buffer.size / 320);  // Kineto's complete events are ~250-400 bytes of JSON each
  FileParser parser(file, *jsonParser);
  if (Status s = parser.parse(); !s) return s;
  return file;
}

}  // namespace tpscope::formats::kineto
