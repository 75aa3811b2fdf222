// The plain values a PyTorch Flight Recorder dump holds, read from either form PyTorch writes: a pickle
// (FlightRecorder::dump → torch's pickler, protocol 2; the watchdog's nccl_trace_rank_<r> files) or JSON
// (dump_json). The pickle reader is small and strict: protocols 2-5, only the opcodes of dict, list, tuple, str,
// bytes, int, float, bool and None, the memo, marks and frames. Anything else (GLOBAL, REDUCE, BUILD, persistent
// ids: an object, not data) is refused with the opcode and its offset; so is input that ends early, nests deeper
// than kMaxDepth, or leaves more or less than one value when STOP comes. Python is never called.
//
// Values live in an arena (ValueTree::nodes) and refer to each other by index, so a memo reference (BINGET) is an
// index and a hostile pickle that puts a container inside itself makes a cycle of indices, not a leak; readers
// walk only the fixed paths of the dump format, never a whole tree recursively.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tpscope/tracedb/status.h"

namespace tpscope::formats::fr {

enum class ValueKind : uint8_t { None, Bool, Int, Float, String, Bytes, List, Tuple, Dict };

struct Value {
  ValueKind kind = ValueKind::None;
  int64_t i = 0;        // Int, Bool (0/1)
  double d = 0;         // Float
  std::string s;        // String (UTF-8), Bytes
  std::vector<uint32_t> items;  // List/Tuple: elements; Dict: key, value, key, value, ... (insertion order)
  bool intOverflow = false;     // an Int whose pickle LONG did not fit 64 bits (i is then 0)
};

constexpr int kMaxDepth = 64;

struct ValueTree {
  std::vector<Value> nodes;
  uint32_t root = 0;

  const Value& at(uint32_t id) const { return nodes[id]; }
  // The value of `key` in a Dict with string keys; nullptr when `dict` is not a Dict or has no such key.
  const Value* get(const Value& dict, std::string_view key) const;
  const Value& rootValue() const { return nodes[root]; }
};

// `what` names the input in errors ("rank_3.pkl: pickle: ...").
tracedb::Result<ValueTree> parsePickle(std::string_view bytes, const std::string& what);
tracedb::Result<ValueTree> parseJson(std::string_view text, const std::string& what);

// True when `bytes` starts like a pickle of protocol 2 or later (the PROTO opcode; parsePickle checks the version).
inline bool looksLikePickle(std::string_view bytes) {
  return !bytes.empty() && static_cast<unsigned char>(bytes[0]) == 0x80;
}

}  // namespace tpscope::formats::fr
