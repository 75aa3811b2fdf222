#include "findings_text.h"

#include <algorithm>
#include <cctype>
#include <map>

#include <fmt/format.h>

namespace tpscope::cli {
namespace {

constexpr size_t kSeverityColumn = 9;  // "CRITICAL "

size_t kindColumn() {
  static const size_t width = [] {
    size_t w = 0;
    for (size_t k = 0; k < analysis::kFindingKindCount; ++k)
      w = std::max(w, analysis::findingKindName(static_cast<analysis::FindingKind>(k)).size());
    return w + 2;
  }();
  return width;
}

}  // namespace

std::string severityLabel(std::string_view severityName) {
  std::string out(severityName);
  for (auto& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

std::string findingText(const analysis::Finding& f) {
  std::string out = fmt::format("{:<{}}{:<{}}{}\n", severityLabel(analysis::severityName(f.severity)),
                                kSeverityColumn, analysis::findingKindName(f.kind), kindColumn(), f.message);
  const std::string indent(kSeverityColumn + kindColumn(), ' ');
  for (const auto& d : f.details) out += indent + d + "\n";
  return out;
}

void printDiagnosis(const analysis::DiagnoseResult& r, std::ostream& out) {
  if (r.findings.empty()) out << "no findings\n";
  std::map<analysis::Severity, int> counts;
  for (const analysis::Finding& f : r.findings) {
    ++counts[f.severity];
    out << findingText(f);
  }
  for (const auto& [kind, n] : r.omitted) out << "(" << n << " more " << kind << " findings left out)\n";
  for (const auto& e : r.errors) out << "analysis failed: " << e << "\n";
  if (r.findings.empty()) return;
  out << r.findings.size() << " finding" << (r.findings.size() == 1 ? "" : "s") << ":";
  bool first = true;
  for (const auto& [sev, n] : counts) {
    out << (first ? " " : ", ") << n << " " << analysis::severityName(sev);
    first = false;
  }
  out << "\n";
}

std::string alertText(const tracedb::AlertRow& a, std::string_view host) {
  std::string where = fmt::format("rank {}", a.rank);
  if (!host.empty()) where += fmt::format(" (host {})", host);
  if (a.step >= 0) where += fmt::format("  step {}", a.step);
  if (a.layer >= 0) where += fmt::format("  layer {}", a.layer);
  if (!a.param.empty()) where += fmt::format("  {}", a.param);
  std::string out = fmt::format("ALERT {} {}  {}\n      {}", severityLabel(a.severity), a.kind, where, a.message);
  if (!a.evidence.empty() && a.evidence != "{}") out += fmt::format("\n      evidence {}", a.evidence);
  return out;
}

}  // namespace tpscope::cli
