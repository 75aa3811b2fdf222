#include "flight_recorder_value.h"

#include <simdjson.h>

#include <bit>
#include <cstring>
#include <optional>
#include <unordered_map>

namespace tpscope::formats::fr {

using tracedb::Result;
using tracedb::Status;

const Value* ValueTree::get(const Value& dict, std::string_view key) const {
  if (dict.kind != ValueKind::Dict) return nullptr;
  for (size_t k = 0; k + 1 < dict.items.size(); k += 2) {
    const Value& kv = nodes[dict.items[k]];
    if (kv.kind == ValueKind::String && kv.s == key) return &nodes[dict.items[k + 1]];
  }
  return nullptr;
}

namespace {

// The pickle virtual machine, restricted to plain data. The stack holds node ids; a mark is kMark.
class PickleReader {
 public:
  PickleReader(std::string_view in, const std::string& what) : in_(in), what_(what) {}

  Result<ValueTree> run() {
    while (true) {
      if (pos_ >= in_.size()) return fail("the pickle ends before its STOP opcode (truncated file?)");
      const size_t at = pos_;
      const auto op = static_cast<unsigned char>(in_[pos_++]);
      if (op == '.') break;
      if (Status s = step(op, at); !s) return s;
    }
    if (!marks_.empty() || stack_.size() != 1) return fail("the pickle does not leave exactly one value at STOP");
    tree_.root = stack_.back();
    return std::move(tree_);
  }

 private:
  static constexpr uint32_t kNoValue = UINT32_MAX;

  Status fail(const std::string& why) const {
    return Status::error(what_ + ": pickle: " + why + " (offset " + std::to_string(pos_) + ")");
  }

  bool need(size_t n) const { return in_.size() - pos_ >= n; }
  uint64_t readLe(size_t n) {
    uint64_t v = 0;
    for (size_t k = 0; k < n; ++k) v |= uint64_t{static_cast<unsigned char>(in_[pos_ + k])} << (8 * k);
    pos_ += n;
    return v;
  }

  uint32_t add(Value v) {
    tree_.nodes.push_back(std::move(v));
    return static_cast<uint32_t>(tree_.nodes.size() - 1);
  }
  uint32_t addInt(int64_t i) {
    Value v;
    v.kind = ValueKind::Int;
    v.i = i;
    return add(std::move(v));
  }
  Status push(uint32_t id) {
    if (stack_.size() > (1u << 24)) return fail("more than 16 M values on the stack");
    stack_.push_back(id);
    return Status::ok();
  }
  Result<uint32_t> pop() {
    if (stack_.size() <= stackFloor()) return fail("an opcode needs a value and the stack is empty");
    const uint32_t v = stack_.back();
    stack_.pop_back();
    return v;
  }
  size_t stackFloor() const { return marks_.empty() ? 0 : marks_.back(); }
  // The values since the last MARK, which is removed.
  Result<std::vector<uint32_t>> popMark() {
    if (marks_.empty()) return fail("an opcode needs a MARK and there is none");
    const size_t from = marks_.back();
    marks_.pop_back();
    std::vector<uint32_t> items(stack_.begin() + static_cast<std::ptrdiff_t>(from), stack_.end());
    stack_.resize(from);
    return items;
  }
  Result<Value*> top(std::initializer_list<ValueKind> kinds, const char* opname) {
    if (stack_.size() <= stackFloor()) return fail(std::string(opname) + " with nothing to add to");
    Value& v = tree_.nodes[stack_.back()];
    for (ValueKind k : kinds)
      if (v.kind == k) return &v;
    return fail(std::string(opname) + " on a value that is not a container of that kind");
  }

  Status text(ValueKind kind, size_t lenBytes) {
    if (!need(lenBytes)) return fail("a string's length is cut off");
    const uint64_t n = readLe(lenBytes);
    if (!need(n)) return fail("a string of " + std::to_string(n) + " bytes runs past the end of the file");
    Value v;
    v.kind = kind;
    v.s.assign(in_.substr(pos_, n));
    pos_ += n;
    return push(add(std::move(v)));
  }

  Status longInt(size_t lenBytes) {
    if (!need(lenBytes)) return fail("a LONG's length is cut off");
    const uint64_t n = readLe(lenBytes);
    if (!need(n)) return fail("a LONG of " + std::to_string(n) + " bytes runs past the end of the file");
    Value v;
    v.kind = ValueKind::Int;
    if (n > 8) {
      v.intOverflow = true;
      pos_ += n;
    } else if (n > 0) {
      uint64_t u = readLe(n);
      if (n < 8 && (u >> (8 * n - 1)) & 1) u |= ~uint64_t{0} << (8 * n);  // sign-extend two's complement
      v.i = static_cast<int64_t>(u);
    }
    return push(add(std::move(v)));
  }

  Status memoPut(uint64_t key) {
    if (stack_.size() <= stackFloor()) return fail("memo PUT with an empty stack");
    memo_[key] = stack_.back();
    return Status::ok();
  }
  Status memoGet(uint64_t key) {
    auto it = memo_.find(key);
    if (it == memo_.end()) return fail("memo GET of key " + std::to_string(key) + ", never PUT");
    return push(it->second);
  }

  Status container(ValueKind kind, std::vector<uint32_t> items) {
    if (marks_.size() + 1 > kMaxDepth) return fail("values nest deeper than " + std::to_string(kMaxDepth));
    Value v;
    v.kind = kind;
    v.items = std::move(items);
    return push(add(std::move(v)));
  }

  // One opcode (STOP excepted), by family; `at` is its offset, for the error on an opcode outside plain data.
  Status step(unsigned char op, size_t at) {
    if (auto s = framing(op)) return *s;
    if (auto s = scalar(op)) return *s;
    if (auto s = memo(op)) return *s;
    if (auto s = stackOp(op)) return *s;
    if (auto s = build(op)) return *s;
    if (auto s = fill(op)) return *s;
    return notPlainData(op, at);
  }

  // PROTO, FRAME, MARK: the stream's framing. nullopt for any other opcode.
  std::optional<Status> framing(unsigned char op) {
    switch (op) {
      case 0x80:  // PROTO
        if (!need(1)) return fail("PROTO without its version");
        if (const auto p = static_cast<unsigned char>(in_[pos_++]); p < 2 || p > 5)
          return fail("pickle protocol " + std::to_string(p) + " (this reader reads protocols 2 to 5)");
        return Status::ok();
      case 0x95:  // FRAME: a length hint only
        if (!need(8)) return fail("FRAME without its length");
        pos_ += 8;
        return Status::ok();
      case '(':  // MARK
        if (marks_.size() >= kMaxDepth) return fail("values nest deeper than " + std::to_string(kMaxDepth));
        marks_.push_back(stack_.size());
        return Status::ok();
      default: return std::nullopt;
    }
  }

  // None, bools, ints, floats, strings and bytes: one scalar pushed. nullopt for any other opcode.
  std::optional<Status> scalar(unsigned char op) {
    switch (op) {
      case 'N': return push(add(Value{}));  // NONE
      case 0x88: case 0x89: {               // NEWTRUE, NEWFALSE
        Value v;
        v.kind = ValueKind::Bool;
        v.i = op == 0x88;
        return push(add(std::move(v)));
      }
      case 'K':  // BININT1
        if (!need(1)) return fail("BININT1 cut off");
        return push(addInt(static_cast<int64_t>(readLe(1))));
      case 'M':  // BININT2
        if (!need(2)) return fail("BININT2 cut off");
        return push(addInt(static_cast<int64_t>(readLe(2))));
      case 'J':  // BININT
        if (!need(4)) return fail("BININT cut off");
        return push(addInt(static_cast<int32_t>(static_cast<uint32_t>(readLe(4)))));
      case 0x8a: return longInt(1);  // LONG1
      case 0x8b: return longInt(4);  // LONG4
      case 'G': return binFloat();   // BINFLOAT
      case 0x8c: return text(ValueKind::String, 1);  // SHORT_BINUNICODE
      case 'X': return text(ValueKind::String, 4);   // BINUNICODE
      case 0x8d: return text(ValueKind::String, 8);  // BINUNICODE8
      case 'U': return text(ValueKind::String, 1);   // SHORT_BINSTRING (protocol-1 str)
      case 'T': return text(ValueKind::String, 4);   // BINSTRING
      case 'C': return text(ValueKind::Bytes, 1);    // SHORT_BINBYTES
      case 'B': return text(ValueKind::Bytes, 4);    // BINBYTES
      case 0x8e: return text(ValueKind::Bytes, 8);   // BINBYTES8
      default: return std::nullopt;
    }
  }

  // BINFLOAT: a big-endian IEEE double.
  Status binFloat() {
    if (!need(8)) return fail("BINFLOAT cut off");
    uint64_t u = 0;
    for (int k = 0; k < 8; ++k) u = (u << 8) | static_cast<unsigned char>(in_[pos_ + k]);
    pos_ += 8;
    Value v;
    v.kind = ValueKind::Float;
    v.d = std::bit_cast<double>(u);
    return push(add(std::move(v)));
  }

  // BINPUT, LONG_BINPUT, MEMOIZE, BINGET, LONG_BINGET. nullopt for any other opcode.
  std::optional<Status> memo(unsigned char op) {
    switch (op) {
      case 'q':  // BINPUT
        if (!need(1)) return fail("BINPUT cut off");
        return memoPut(readLe(1));
      case 'r':  // LONG_BINPUT
        if (!need(4)) return fail("LONG_BINPUT cut off");
        return memoPut(readLe(4));
      case 0x94: return memoPut(memo_.size());  // MEMOIZE
      case 'h':                                 // BINGET
        if (!need(1)) return fail("BINGET cut off");
        return memoGet(readLe(1));
      case 'j':  // LONG_BINGET
        if (!need(4)) return fail("LONG_BINGET cut off");
        return memoGet(readLe(4));
      default: return std::nullopt;
    }
  }

  // POP, POP_MARK, DUP. nullopt for any other opcode.
  std::optional<Status> stackOp(unsigned char op) {
    switch (op) {
      case '0': return pop().status();      // POP
      case '1': return popMark().status();  // POP_MARK
      case '2':                             // DUP
        if (stack_.size() <= stackFloor()) return fail("DUP with an empty stack");
        return push(stack_.back());
      default: return std::nullopt;
    }
  }

  // The containers: empty ones, or built from the values since the MARK (TUPLE, LIST, DICT) or the last 1 to 3
  // (TUPLE1 to TUPLE3). nullopt for any other opcode.
  std::optional<Status> build(unsigned char op) {
    switch (op) {
      case '}': return container(ValueKind::Dict, {});   // EMPTY_DICT
      case ']': return container(ValueKind::List, {});   // EMPTY_LIST
      case ')': return container(ValueKind::Tuple, {});  // EMPTY_TUPLE
      case 't': return fromMark(ValueKind::Tuple);       // TUPLE
      case 'l': return fromMark(ValueKind::List);        // LIST
      case 'd': return fromMark(ValueKind::Dict);        // DICT
      case 0x85: case 0x86: case 0x87: {                 // TUPLE1, TUPLE2, TUPLE3
        const size_t n = op - 0x84u;
        if (stack_.size() < stackFloor() + n) return fail("TUPLE" + std::to_string(n) + " with too few values");
        std::vector<uint32_t> items(stack_.end() - static_cast<std::ptrdiff_t>(n), stack_.end());
        stack_.resize(stack_.size() - n);
        return container(ValueKind::Tuple, std::move(items));
      }
      default: return std::nullopt;
    }
  }

  // TUPLE, LIST, DICT: a container of the values since the last MARK.
  Status fromMark(ValueKind kind) {
    auto items = popMark();
    if (!items) return items.status();
    if (kind == ValueKind::Dict && items->size() % 2) return fail("DICT with a key and no value");
    return container(kind, std::move(*items));
  }

  // APPEND, APPENDS, SETITEM, SETITEMS: values added to the list or dict under them. nullopt for any other opcode.
  std::optional<Status> fill(unsigned char op) {
    switch (op) {
      case 'a': {  // APPEND
        auto v = pop();
        if (!v) return v.status();
        auto list = top({ValueKind::List}, "APPEND");
        if (!list) return list.status();
        (*list)->items.push_back(*v);
        return Status::ok();
      }
      case 'e': {  // APPENDS
        auto items = popMark();
        if (!items) return items.status();
        auto list = top({ValueKind::List}, "APPENDS");
        if (!list) return list.status();
        (*list)->items.insert((*list)->items.end(), items->begin(), items->end());
        return Status::ok();
      }
      case 's': return setItem();  // SETITEM
      case 'u': {                  // SETITEMS
        auto items = popMark();
        if (!items) return items.status();
        if (items->size() % 2) return fail("SETITEMS with a key and no value");
        auto dict = top({ValueKind::Dict}, "SETITEMS");
        if (!dict) return dict.status();
        (*dict)->items.insert((*dict)->items.end(), items->begin(), items->end());
        return Status::ok();
      }
      default: return std::nullopt;
    }
  }

  // SETITEM: the key and value on top added to the dict under them.
  Status setItem() {
    auto v = pop();
    if (!v) return v.status();
    auto k = pop();
    if (!k) return k.status();
    auto dict = top({ValueKind::Dict}, "SETITEM");
    if (!dict) return dict.status();
    (*dict)->items.push_back(*k);
    (*dict)->items.push_back(*v);
    return Status::ok();
  }

  // The error for an opcode outside plain data (classes, reduce, persistent ids, ...), at its offset `at`.
  Status notPlainData(unsigned char op, size_t at) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", op);
    pos_ = at;
    return fail(std::string("opcode ") + hex +
                " is not one of plain data (dict, list, tuple, str, bytes, int, float, bool, None); a Flight "
                "Recorder dump holds nothing else");
  }

  std::string_view in_;
  const std::string& what_;
  size_t pos_ = 0;
  ValueTree tree_;
  std::vector<uint32_t> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, uint32_t> memo_;
};

Result<uint32_t> fromJson(simdjson::dom::element e, ValueTree& tree, int depth, const std::string& what) {
  if (depth > kMaxDepth) return Status::error(what + ": JSON nests deeper than " + std::to_string(kMaxDepth));
  Value v;
  switch (e.type()) {
    case simdjson::dom::element_type::NULL_VALUE: break;
    case simdjson::dom::element_type::BOOL:
      v.kind = ValueKind::Bool;
      v.i = e.get_bool().value_unsafe() ? 1 : 0;
      break;
    case simdjson::dom::element_type::INT64:
      v.kind = ValueKind::Int;
      v.i = e.get_int64().value_unsafe();
      break;
    case simdjson::dom::element_type::UINT64:
      v.kind = ValueKind::Int;
      v.intOverflow = true;
      break;
    case simdjson::dom::element_type::DOUBLE:
      v.kind = ValueKind::Float;
      v.d = e.get_double().value_unsafe();
      break;
    case simdjson::dom::element_type::STRING:
      v.kind = ValueKind::String;
      v.s = std::string(e.get_string().value_unsafe());
      break;
    case simdjson::dom::element_type::ARRAY: {
      v.kind = ValueKind::List;
      simdjson::dom::array array;
      if (e.get_array().get(array)) break;
      for (simdjson::dom::element item : array) {
        auto id = fromJson(item, tree, depth + 1, what);
        if (!id) return id.status();
        v.items.push_back(*id);
      }
      break;
    }
    case simdjson::dom::element_type::OBJECT: {
      v.kind = ValueKind::Dict;
      simdjson::dom::object object;
      if (e.get_object().get(object)) break;
      for (auto field : object) {
        Value key;
        key.kind = ValueKind::String;
        key.s = std::string(field.key);
        tree.nodes.push_back(std::move(key));
        v.items.push_back(static_cast<uint32_t>(tree.nodes.size() - 1));
        auto id = fromJson(field.value, tree, depth + 1, what);
        if (!id) return id.status();
        v.items.push_back(*id);
      }
      break;
    }
  }
  tree.nodes.push_back(std::move(v));
  return static_cast<uint32_t>(tree.nodes.size() - 1);
}

}  // namespace

Result<ValueTree> parsePickle(std::string_view bytes, const std::string& what) {
  return PickleReader(bytes, what).run();
}

Result<ValueTree> parseJson(std::string_view text, const std::string& what) {
  simdjson::dom::parser parser;
  simdjson::padded_string padded(text);
  simdjson::dom::element doc;
  if (auto err = parser.parse(padded).get(doc))
    return Status::error(what + ": not JSON: " + simdjson::error_message(err));
  ValueTree tree;
  auto root = fromJson(doc, tree, 0, what);
  if (!root) return root.status();
  tree.root = *root;
  return tree;
}

}  // namespace tpscope::formats::fr
