#include "nsys_names.h"

#include <cctype>
#include <charconv>

#include "kineto_names.h"
#include "tpscope/vocabulary/collective_ops.h"

namespace tpscope::formats::nsys {
namespace {

bool startsWith(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// NCCL's dtype tokens in kernel names (both generations) -> tpscope's dtype names.
std::string ncclDtype(std::string_view token) {
  static constexpr std::pair<std::string_view, std::string_view> kTypes[] = {
      {"f32", "float32"},   {"float", "float32"},   {"f16", "float16"},     {"half", "float16"},
      {"bf16", "bfloat16"}, {"bfloat16", "bfloat16"}, {"f64", "float64"},   {"double", "float64"},
      {"i8", "int8"},       {"int8_t", "int8"},     {"u8", "uint8"},        {"uint8_t", "uint8"},
      {"i32", "int32"},     {"int32_t", "int32"},   {"u32", "uint32"},      {"uint32_t", "uint32"},
      {"i64", "int64"},     {"int64_t", "int64"},   {"u64", "uint64"},      {"uint64_t", "uint64"},
      {"f8e4m3", "float8_e4m3fn"}, {"f8e5m2", "float8_e5m2"},
  };
  for (const auto& [from, to] : kTypes)
    if (token == from) return std::string(to);
  return {};
}

}  // namespace

std::optional<NcclKernelName> parseNcclKernel(std::string_view name) {
  if (startsWith(name, "void ")) name.remove_prefix(5);
  std::string_view rest;
  if (startsWith(name, "ncclDevKernel_")) rest = name.substr(14);
  else if (startsWith(name, "ncclKernel_")) rest = name.substr(11);
  else return std::nullopt;
  if (auto paren = rest.find_first_of("(<"); paren != std::string_view::npos) rest = rest.substr(0, paren);
  NcclKernelName out;
  // Tokens separated by '_': the first is the op (AllReduce, AllGather, ReduceScatter, Broadcast, Reduce,
  // SendRecv, Generic); a dtype token may follow anywhere (f32 / float / int8_t, whose own '_t' is rejoined).
  size_t pos = 0;
  bool first = true;
  while (pos <= rest.size()) {
    size_t end = rest.find('_', pos);
    if (end == std::string_view::npos) end = rest.size();
    std::string_view token = rest.substr(pos, end - pos);
    if (end + 2 <= rest.size() && rest.substr(end, 2) == "_t" && (end + 2 == rest.size() || rest[end + 2] == '_')) {
      token = rest.substr(pos, end + 2 - pos);
      end += 2;
    }
    if (first) {
      out.op = std::string(vocabulary::opName(vocabulary::canonicalOp(name)));  // "" for ncclDevKernel_Generic
      first = false;
    } else if (out.dtype.empty()) {
      out.dtype = ncclDtype(token);
    }
    pos = end + 1;
  }
  return out;
}

std::string collectiveOfRange(std::string_view text) {
  if (auto comma = text.find(", "); comma != std::string_view::npos) text = text.substr(0, comma);
  if (text == "record_param_comms") return "unknown";
  if (kineto::isCollectiveOpName(text)) return kineto::normalizeCollectiveOp(text);
  if (startsWith(text, "nccl") && text.size() > 4 && std::isupper(static_cast<unsigned char>(text[4])))
    return std::string(vocabulary::opName(vocabulary::canonicalOp(text)));  // NCCL's own ranges: ncclAllReduce
  return {};
}

std::optional<int> rankHint(std::string_view text) {
  std::string t = lower(text);
  std::string_view s = t;
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  for (std::string_view prefix : {"global_rank", "global rank", "rank"}) {
    if (!startsWith(s, prefix)) continue;
    std::string_view rest = s.substr(prefix.size());
    while (!rest.empty() && (rest.front() == ' ' || rest.front() == '=' || rest.front() == ':' || rest.front() == '_'))
      rest.remove_prefix(1);
    int rank = -1;
    auto [p, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), rank);
    if (ec == std::errc() && p == rest.data() + rest.size() && rank >= 0 && rest.size() <= 9) return rank;
    return std::nullopt;
  }
  return std::nullopt;
}

std::string sanitizeUtf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = s[i];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = len > 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) ok = (s[i + k] & 0xC0) == 0x80;
    if (ok && len == 2) ok = c >= 0xC2;                                       // overlong
    if (ok && len == 3) ok = !(c == 0xE0 && s[i + 1] < 0xA0) && !(c == 0xED && s[i + 1] >= 0xA0);  // overlong, surrogates
    if (ok && len == 4) ok = !(c == 0xF0 && s[i + 1] < 0x90) && !(c == 0xF4 && s[i + 1] >= 0x90) && c <= 0xF4;
    if (ok && c == 0) ok = false;                                             // NUL: not text
    if (ok) {
      out.append(text.substr(i, len));
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

}  // namespace tpscope::formats::nsys
