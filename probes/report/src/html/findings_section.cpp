// Diagnosis: the root-cause chain (a nested list, cause → consequences, each link's cost), then the findings of
// analysis::diagnose in its order (most severe first, so the root cause leads), each with
// its severity colour, where it is (rank, step, layer, collective) and its detail lines.
#include <map>

#include "html/html_text.h"
#include "html/palette.h"
#include "html/sections.h"
#include "tpscope/analysis/units_text.h"

namespace tpscope::report::html {

namespace {

constexpr size_t kShownFindings = 40;  // the rest fold into a <details>
constexpr size_t kShownDetails = 6;

std::string where(const Finding& f, const RunInfo& info) {
  std::vector<std::string> parts;
  if (f.rank >= 0) {
    const std::string coords = info.describeRank(f.rank);
    parts.push_back("rank " + std::to_string(f.rank) + (coords.empty() ? "" : " (" + coords + ")"));
  }
  if (f.step >= 0) parts.push_back("step " + std::to_string(f.step));
  if (f.layer >= 0) parts.push_back("layer " + std::to_string(f.layer));
  if (f.collective) {
    std::string c = f.collective->group + " #" + std::to_string(f.collective->seq);
    if (!f.collective->op.empty()) c += " " + f.collective->op;
    parts.push_back(c);
  }
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : " · ") + p;
  return out;
}

void appendFinding(std::string& out, const Finding& f, const RunInfo& info) {
  const std::string_view sev = severityName(f.severity);
  out += "<li class=\"finding sev-" + std::string(sev) + "\" style=\"border-left-color:" +
         std::string(palette::severity(f.severity)) + "\"><div class=\"head\"><span class=\"badge\" style=\"background:" +
         std::string(palette::severity(f.severity)) + "\">";
  appendEscaped(out, sev);
  out += "</span> <span class=\"kind\">";
  appendEscaped(out, findingKindName(f.kind));
  out += "</span> <span class=\"msg\">";
  appendEscaped(out, f.message);
  out += "</span></div>";
  if (const std::string w = where(f, info); !w.empty()) {
    out += "<div class=\"where\">";
    appendEscaped(out, w);
    out += "</div>";
  }
  if (!f.details.empty()) {
    out += "<ul class=\"details\">";
    for (size_t i = 0; i < f.details.size(); ++i) {
      if (i == kShownDetails) out += "</ul><details><summary>" + std::to_string(f.details.size() - i) +
                                     " more lines</summary><ul class=\"details\">";
      out += "<li>";
      appendEscaped(out, f.details[i]);
      out += "</li>";
    }
    out += f.details.size() > kShownDetails ? "</ul></details>" : "</ul>";
  }
  out += "</li>";
}

// One link of the root-cause chain and its consequences as nested lists: severity badge, kind, message, cost.
void appendLink(std::string& out, const ChainLink& l) {
  const std::string_view sev = severityName(l.severity);
  out += "<li class=\"sev-" + std::string(sev) + "\"><span class=\"badge\" style=\"background:" +
         std::string(palette::severity(l.severity)) + "\">";
  appendEscaped(out, sev);
  out += "</span> <span class=\"kind\">";
  appendEscaped(out, l.kind);
  out += "</span> ";
  appendEscaped(out, l.message);
  std::string cost;
  if (l.costNs > 0) cost = text::ms(static_cast<double>(l.costNs)) + " ms";
  if (l.costSteps > 0) cost += (cost.empty() ? "" : ", ") + std::to_string(l.costSteps) + " steps";
  if (!cost.empty()) {
    out += " <span class=\"where\">(costs ";
    appendEscaped(out, cost);
    out += ")</span>";
  }
  if (l.because) {
    out += "<div class=\"where\">because ";
    appendEscaped(out, l.because->text);
    out += "</div>";
  }
  if (!l.consequences.empty()) {
    out += "<ul class=\"chain\">";
    for (const auto& c : l.consequences) appendLink(out, c);
    out += "</ul>";
  }
  out += "</li>";
}

}  // namespace

std::string findingsSection(const DiagnoseResult& d, const RunInfo& info) {
  std::string out = sectionStart("diagnosis", "Diagnosis");
  std::map<Severity, int> counts;
  for (const auto& f : d.findings) ++counts[f.severity];
  out += "<p class=\"summary\">";
  if (d.findings.empty()) out += "No findings.";
  else {
    out += std::to_string(d.findings.size()) + (d.findings.size() == 1 ? " finding" : " findings") + ":";
    bool first = true;
    for (const auto& [sev, n] : counts) {
      out += (first ? " " : ", ") + std::to_string(n) + " " + std::string(severityName(sev));
      first = false;
    }
    out += " — most severe first; the first is the root cause where one is known.";
  }
  out += "</p>";
  if (!d.chain.empty()) {  // the root-cause chain first: cause → consequences (chain.h)
    out += "<h3>Root-cause chain</h3><ul class=\"chain\">";
    for (const auto& root : d.chain) appendLink(out, root);
    out += "</ul>";
  }
  out += "<ol class=\"findings\">";
  for (size_t i = 0; i < d.findings.size(); ++i) {
    if (i == kShownFindings)
      out += "</ol><details><summary>" + std::to_string(d.findings.size() - i) +
             " more findings</summary><ol class=\"findings\" start=\"" + std::to_string(i + 1) + "\">";
    appendFinding(out, d.findings[i], info);
  }
  out += d.findings.size() > kShownFindings ? "</ol></details>" : "</ol>";
  for (const auto& [kind, n] : d.omitted) {
    out += "<p class=\"note\">";
    appendEscaped(out, std::to_string(n) + " more " + kind + " findings left out");
    out += "</p>";
  }
  for (const auto& e : d.errors) {
    out += "<p class=\"error\">analysis failed: ";
    appendEscaped(out, e);
    out += "</p>";
  }
  return out + "</section>";
}

}  // namespace tpscope::report::html
