// Desync: for every process group that is stuck or saw mismatched collectives, its members × last enqueued /
// started / completed sequence number (analysis desync), coloured as the viewer does: a rank that never entered the
// stuck collective red, one that entered it and is still waiting amber in "last completed".
#include <algorithm>

#include "html/html_text.h"
#include "html/palette.h"
#include "html/sections.h"

namespace tpscope::report::html {

namespace {

constexpr size_t kMaxGroups = 16;

std::string whereText(const MemberProgress& p, bool missing) {
  if (missing && p.lastSpan) {
    std::string s = "last span: " + p.lastSpan->name;
    if (p.lastSpan->step >= 0) s += ", step " + std::to_string(p.lastSpan->step);
    return s;
  }
  return p.lastRecord ? p.lastRecord->callsite : std::string();
}

std::string cell(int64_t value, std::string_view colour = {}) {
  std::string out = colour.empty() ? "<td>" : "<td style=\"background:" + std::string(colour) + "\">";
  return out + (value > 0 ? std::to_string(value) : std::string("–")) + "</td>";
}

std::string groupMatrix(const GroupDesync& g) {
  std::string out = "<h3>group ";
  appendEscaped(out, g.group + " (" + rankList(g.members) + ")");
  out += ": ";
  if (g.stuckSeq) out += "<span class=\"bad\">stuck at seq " + std::to_string(*g.stuckSeq) + " (" +
                         std::string(matchStateName(g.stuckState)) + ")</span>";
  if (g.mismatchCount > 0)
    out += (g.stuckSeq ? ", " : "") + std::to_string(g.mismatchCount) + " mismatched collective" +
           (g.mismatchCount == 1 ? "" : "s");
  out += "</h3><table class=\"matrix\"><thead><tr><th>rank</th><th>last enqueued</th><th>last started</th>"
         "<th>last completed</th><th>state</th><th>where</th></tr></thead><tbody>";
  for (const MemberProgress& p : g.progress) {
    const bool missing = std::find(g.missingRanks.begin(), g.missingRanks.end(), p.rank) != g.missingRanks.end();
    const bool waiting = std::find(g.waitingRanks.begin(), g.waitingRanks.end(), p.rank) != g.waitingRanks.end();
    out += missing ? "<tr class=\"missing\" style=\"background:" + std::string(palette::kStuck) + "\">" : "<tr>";
    out += "<td>" + std::to_string(p.rank) + "</td>" + cell(p.lastEnqueued) + cell(p.lastStarted) +
           cell(p.lastCompleted, waiting ? palette::kWaiting : std::string_view{});
    out += "<td>" + std::string(missing ? "never entered" : waiting ? "waiting" : "ok") + "</td><td>";
    appendEscaped(out, whereText(p, missing));
    out += "</td></tr>";
  }
  return out + "</tbody></table>";
}

}  // namespace

std::string desyncSection(const DesyncReport& d, const std::vector<Finding>& findings) {
  std::string out = sectionStart("desync", "Desync and hangs");
  std::vector<const GroupDesync*> bad;
  for (const auto& g : d.groups)
    if (!g.healthy()) bad.push_back(&g);
  if (bad.empty())
    return out + "<p class=\"note ok\">No hang or desync: every process group (" + std::to_string(d.groups.size()) +
           ") completed every collective its members entered, and their records agree.</p></section>";
  // In the order of the findings that name them (the cause first), then stuck groups before mismatched ones.
  auto rank = [&](const GroupDesync* g) {
    for (size_t i = 0; i < findings.size(); ++i)
      if (findings[i].collective && findings[i].collective->group == g->group) return i;
    return findings.size() + (g->stuckSeq ? 0 : 1);
  };
  std::stable_sort(bad.begin(), bad.end(), [&](const GroupDesync* a, const GroupDesync* b) { return rank(a) < rank(b); });
  out += "<p class=\"summary\">Per member of each unhealthy group: the last sequence number it enqueued, started and "
         "completed. <span class=\"swatch\" style=\"background:" + std::string(palette::kStuck) +
         "\"></span> never entered the stuck collective, <span class=\"swatch\" style=\"background:" +
         std::string(palette::kWaiting) + "\"></span> entered it and is still waiting.</p>";
  for (size_t i = 0; i < bad.size() && i < kMaxGroups; ++i) out += groupMatrix(*bad[i]);
  if (bad.size() > kMaxGroups)
    out += "<p class=\"note\">" + std::to_string(bad.size() - kMaxGroups) + " more groups not shown.</p>";
  return out + "</section>";
}

}  // namespace tpscope::report::html
