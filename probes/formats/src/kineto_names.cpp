#include "kineto_names.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <utility>

#include "tpscope/vocabulary/collective_ops.h"

namespace tpscope::formats::kineto {
namespace {

using vocabulary::CollectiveOp;

bool startsWith(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

constexpr std::array<std::string_view, 5> kBackendPrefixes{"nccl:", "gloo:", "ucc:", "mpi:", "xccl:"};

bool isBackendOpName(std::string_view name) {
  for (std::string_view prefix : kBackendPrefixes)
    if (startsWith(name, prefix)) return vocabulary::canonicalOp(name.substr(prefix.size())) != CollectiveOp::Unknown;
  return false;
}

bool isCollectiveOpName(std::string_view name) {
  if (name == "record_param_comms") return true;
  constexpr std::string_view kDispatcher = "c10d::";
  if (startsWith(name, kDispatcher))
    return vocabulary::canonicalOp(name.substr(kDispatcher.size())) != CollectiveOp::Unknown;
  return isBackendOpName(name);
}

std::string normalizeCollectiveOp(std::string_view name) {
  const vocabulary::OpSpelling s = vocabulary::parseOp(name);
  std::string op(vocabulary::opName(s.op));
  // The coalesced entry points of the three reductions keep their own name in the trace; broadcast's does not.
  if (s.coalesced && (s.op == CollectiveOp::AllReduce || s.op == CollectiveOp::AllGather ||
                      s.op == CollectiveOp::ReduceScatter))
    op += "_coalesced";
  return op;
}

bool isNonCollectiveCommName(std::string_view collectiveName) {
  const std::string n = lower(collectiveName);
  return n == "wait" || n == "wait_tensor" || n == "waitall" || n == "startcoalescing" || n == "endcoalescing" ||
         n == "init";
}

std::string normalizeDtype(std::string_view dtype) {
  static constexpr std::array<std::pair<std::string_view, std::string_view>, 34> kTypes{{
      {"float", "float32"},        {"float32", "float32"},      {"c10::float", "float32"},
      {"double", "float64"},       {"float64", "float64"},      {"half", "float16"},
      {"c10::half", "float16"},    {"float16", "float16"},      {"bfloat16", "bfloat16"},
      {"c10::bfloat16", "bfloat16"}, {"long", "int64"},         {"long int", "int64"},
      {"int64", "int64"},          {"int64_t", "int64"},        {"int", "int32"},
      {"int32", "int32"},          {"short", "int16"},          {"short int", "int16"},
      {"int16", "int16"},          {"char", "int8"},            {"signed char", "int8"},
      {"int8", "int8"},            {"byte", "uint8"},           {"unsigned char", "uint8"},
      {"uint8", "uint8"},          {"bool", "bool"},            {"float8_e4m3fn", "float8_e4m3fn"},
      {"c10::float8_e4m3fn", "float8_e4m3fn"}, {"float8_e5m2", "float8_e5m2"},
      {"c10::float8_e5m2", "float8_e5m2"}, {"complexfloat", "complex64"}, {"c10::complex<float>", "complex64"},
      {"complexdouble", "complex128"}, {"c10::complex<double>", "complex128"},
  }};
  const std::string key = lower(dtype);
  for (const auto& [from, to] : kTypes)
    if (from == key) return std::string(to);
  return {};
}

int dtypeSize(std::string_view t) {
  if (t == "float64" || t == "int64" || t == "complex64") return 8;
  if (t == "complex128") return 16;
  if (t == "float32" || t == "int32") return 4;
  if (t == "float16" || t == "bfloat16" || t == "int16") return 2;
  if (t == "int8" || t == "uint8" || t == "bool" || t == "float8_e4m3fn" || t == "float8_e5m2") return 1;
  return 0;
}

std::optional<int> profilerStep(std::string_view name) {
  constexpr std::string_view kPrefix = "ProfilerStep#";
  if (!name.starts_with(kPrefix)) return std::nullopt;
  int step = 0;
  auto [p, ec] = std::from_chars(name.data() + kPrefix.size(), name.data() + name.size(), step);
  if (ec != std::errc() || p != name.data() + name.size()) return std::nullopt;
  return step;
}

std::optional<int> rankFromFileName(std::string_view fileName) {
  const std::string name = lower(fileName);
  std::optional<int> found;
  for (size_t pos = name.find("rank"); pos != std::string::npos; pos = name.find("rank", pos + 1)) {
    size_t i = pos + 4;
    if (i < name.size() && (name[i] == '-' || name[i] == '_')) ++i;
    size_t digits = i;
    while (digits < name.size() && std::isdigit(static_cast<unsigned char>(name[digits]))) ++digits;
    if (digits == i || digits - i > 9) continue;
    found = std::stoi(name.substr(i, digits - i));
  }
  return found;
}

std::string backendFromConfig(std::string_view config) {
  // "cuda:nccl" -> nccl; "cpu:gloo,cuda:gloo" -> gloo; "cpu:gloo,cuda:nccl" -> nccl (the device backend wins).
  std::string best;
  while (!config.empty()) {
    const size_t comma = config.find(',');
    std::string_view part = config.substr(0, comma);
    config = comma == std::string_view::npos ? std::string_view() : config.substr(comma + 1);
    const size_t colon = part.find(':');
    std::string_view device = colon == std::string_view::npos ? std::string_view() : part.substr(0, colon);
    std::string_view backend = colon == std::string_view::npos ? part : part.substr(colon + 1);
    if (backend.empty()) continue;
    if (best.empty() || device == "cuda") best = lower(backend);
  }
  return best;
}

}  // namespace tpscope::formats::kineto
