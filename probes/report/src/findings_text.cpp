#include "tpscope/report/findings_text.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace tpscope::report {
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

std::string costText(const analysis::ChainLink& l) {
  std::vector<std::string> parts;
  if (l.costNs > 0) parts.push_back(fmt::format("{:.3f} ms", static_cast<double>(l.costNs) / 1e6));
  if (l.costSteps > 0) parts.push_back(fmt::format("{} step{}", l.costSteps, l.costSteps == 1 ? "" : "s"));
  if (parts.empty()) return "";
  return "  [costs " + fmt::format("{}", fmt::join(parts, ", ")) + "]";
}

// One link and its consequences, each level two spaces deeper, "→" before a consequence; a finding's details
// under its line.
void printLink(const analysis::ChainLink& l, const std::vector<analysis::Finding>& findings, int depth,
               std::ostream& out) {
  const std::string indent(2 * static_cast<size_t>(depth), ' ');
  const std::string head = indent + (depth > 0 ? "→ " : "");
  out << fmt::format("{}{:<{}}{:<{}}{}{}\n", head, severityLabel(analysis::severityName(l.severity)), kSeverityColumn,
                     l.kind, kindColumn(), l.message, costText(l));
  const size_t arrow = depth > 0 ? 2 : 0;  // "→ " is two columns wide (four bytes)
  const std::string pad(indent.size() + arrow + kSeverityColumn + kindColumn(), ' ');
  if (l.because) out << pad << "because " << l.because->text << "\n";
  if (l.finding >= 0 && l.finding < static_cast<int>(findings.size()))
    for (const auto& d : findings[static_cast<size_t>(l.finding)].details) out << pad << d << "\n";
  for (const auto& c : l.consequences) printLink(c, findings, depth + 1, out);
}

}  // namespace

void printChain(const analysis::DiagnoseResult& r, std::ostream& out) {
  if (r.chain.empty()) return;
  out << "root-cause chain (" << r.chain.size() << " incident" << (r.chain.size() == 1 ? "" : "s") << "):\n";
  for (const auto& root : r.chain) printLink(root, r.findings, 0, out);
}

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
  printChain(r, out);
  const std::vector<int> inChain = analysis::chainFindings(r.chain);
  if (!r.chain.empty() && inChain.size() < r.findings.size()) out << "other findings:\n";
  std::map<analysis::Severity, int> counts;
  for (size_t i = 0; i < r.findings.size(); ++i) {
    const analysis::Finding& f = r.findings[i];
    ++counts[f.severity];
    if (!std::binary_search(inChain.begin(), inChain.end(), static_cast<int>(i))) out << findingText(f);
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

}  // namespace tpscope::report
