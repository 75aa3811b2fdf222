#include "pipeline_names.h"

#include <cctype>
#include <charconv>
#include <regex>

namespace tpscope::formats::kineto {

namespace {

std::string normalized(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = c == '_' ? '-' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::optional<int> number(const std::ssub_match& m) {
  if (!m.matched) return std::nullopt;
  int v = 0;
  const std::string s = m.str();
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

// A non-negative decimal number that is all of `s`.
std::optional<int> wholeNumber(std::string_view s) {
  int v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || s[0] == '-' || ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

// "forward mb 3" / "backward mb 3 chunk 1" exactly.
std::optional<PipeName> nativePassName(std::string_view name) {
  PipeName out;
  out.role = PipeName::Role::Pass;
  for (std::string_view prefix : {"forward mb ", "backward mb "}) {
    if (name.substr(0, prefix.size()) != prefix) continue;
    out.forward = prefix[0] == 'f';
    std::string_view rest = name.substr(prefix.size());
    constexpr std::string_view kChunk = " chunk ";
    if (const size_t at = rest.find(kChunk); at != std::string_view::npos) {
      const std::optional<int> chunk = wholeNumber(rest.substr(at + kChunk.size()));
      if (!chunk) return std::nullopt;
      out.chunk = *chunk;
      rest = rest.substr(0, at);
    }
    const std::optional<int> mb = wholeNumber(rest);
    if (!mb) return std::nullopt;
    out.microbatch = *mb;
    return out;
  }
  return std::nullopt;
}

}  // namespace

RankCoords coordsFromName(std::string_view name) {
  RankCoords c;
  if (name.find_first_of("0123456789") == std::string_view::npos) return c;
  std::string text;  // lower case, '_' as '-', text in parentheses (tpscope's export puts the host there) left out
  int depth = 0;
  for (char ch : normalized(name)) {
    depth += ch == '(' ? 1 : ch == ')' && depth > 0 ? -1 : 0;
    text += depth > 0 || ch == ')' ? ' ' : ch;
  }
  // pp/tp/dp, optionally followed by "rank", then the number and an optional "/size".
  static const std::regex kAxis("(^|[^a-z0-9-])(pp|tp|dp)[ -]?(rank)?[ =:]*([0-9]+)( */ *([0-9]+))?");
  std::string rest;
  auto begin = text.cbegin();
  for (std::sregex_iterator it(text.begin(), text.end(), kAxis), end; it != end; ++it) {
    const std::smatch& m = *it;
    const std::string axis = m[2].str();
    std::optional<int>* coord = axis == "pp" ? &c.pp : axis == "tp" ? &c.tp : &c.dp;
    std::optional<int>* size = axis == "pp" ? &c.ppSize : axis == "tp" ? &c.tpSize : &c.dpSize;
    *coord = number(m[4]);
    if (m[6].matched) *size = number(m[6]);
    rest.append(begin, m[0].first);
    rest += ' ';
    begin = m[0].second;
  }
  rest.append(begin, text.cend());
  static const std::regex kRank("(^|[^a-z0-9])(global-?)?rank[ =:-]*([0-9]+)");
  std::smatch m;
  if (std::regex_search(rest, m, kRank)) c.rank = number(m[3]);
  return c;
}

PipeName pipelineName(std::string_view name) {
  // Called for every span of an import: most names are rejected by their length or first letter.
  if (name.size() < 12 || name.size() > 48) return {};
  if (const char c = name[0]; c != 'f' && c != 'F' && c != 'b' && c != 'B') return {};
  if (std::optional<PipeName> native = nativePassName(name)) return *native;
  const std::string n = normalized(name);
  PipeName out;
  if (n == "forward-compute" || n == "backward-compute") {
    out.role = PipeName::Role::Pass;
    out.forward = n[0] == 'f';
    return out;
  }
  auto add = [&](bool send, bool activation) { out.messages[static_cast<size_t>(out.messageCount++)] = {send, activation}; };
  if (n == "forward-send") add(true, true);
  else if (n == "forward-recv") add(false, true);
  else if (n == "backward-send") add(true, false);
  else if (n == "backward-recv") add(false, false);
  else if (n == "forward-send-backward-recv") add(true, true), add(false, false);
  else if (n == "backward-send-forward-recv") add(true, false), add(false, true);
  else if (n == "forward-backward-send-forward-backward-recv")
    add(true, true), add(true, false), add(false, true), add(false, false);
  if (out.messageCount > 0) out.role = PipeName::Role::Transfer;
  return out;
}

std::optional<tracedb::SpanKind> spanKindFromName(std::string_view name) {
  for (int k = 0; k < tracedb::kSpanKindCount; ++k)
    if (tracedb::spanKindName(static_cast<tracedb::SpanKind>(k)) == name) return static_cast<tracedb::SpanKind>(k);
  return std::nullopt;
}

std::optional<tracedb::Phase> phaseFromName(std::string_view name) {
  for (int p = 0; p <= static_cast<int>(tracedb::Phase::Other); ++p)
    if (tracedb::phaseName(static_cast<tracedb::Phase>(p)) == name) return static_cast<tracedb::Phase>(p);
  return std::nullopt;
}

std::string pipelineCallsite(const PipeMessage& message, int microbatch) {
  return std::string(message.activation ? "pipeline activation of micro-batch " :
                                          "pipeline activation gradient of micro-batch ") +
         std::to_string(microbatch) + (message.activation ? " forward " : " backward ") +
         (message.send ? "send" : "recv");
}

}  // namespace tpscope::formats::kineto
