// Communication per group: one bar per (group, op) of its bus bandwidth against the best the run measured (the
// longest bar), with count, message size, latency and arrival skew; above it the run's exposed-communication share,
// the TP all-reduce count against the Megatron model, and the worst straggler.
#include <algorithm>

#include "html/html_text.h"
#include "html/palette.h"
#include "html/sections.h"
#include "html/svg.h"
#include "tpscope/analysis/units_text.h"

namespace tpscope::report::html {

namespace {

constexpr double kWidth = 1180, kLabelW = 190, kBarW = 380, kRowH = 22, kBarH = 16;
constexpr size_t kMaxRows = 128;

std::string facts(const CollectiveAnalysis& c, const TimeShares& run) {
  std::vector<std::string> lines;
  lines.push_back("Exposed communication (no compute overlapping it): " + text::pct(run.commOverheadPct()) +
                  " of step time; all communication " + text::pct(run.pct(run.commNs)) + ".");
  const TpModelCheck& tp = c.tp;
  if (tp.measuredPerStep > 0 || tp.haveModel) {
    std::string s = "TP all-reduces (groups tp-*): " + text::fixed(tp.measuredPerStep, 1) + " per step, " +
                    text::bytes(static_cast<double>(tp.measuredBytesEach)) + " each";
    if (tp.haveModel) {
      s += "; the Megatron model expects " + std::to_string(tp.expectedPerStep) + " per step — ";
      s += tp.model.sequenceParallel ? "not comparable (sequence parallelism)" : tp.matches ? "matches" : "does not match";
    }
    lines.push_back(s + ".");
  }
  const StragglerReport& st = c.stragglers;
  if (!st.ranks.empty() && st.ranks.front().causedWaitNs > 0) {
    const RankStraggling& top = st.ranks.front();
    lines.push_back("Slowest arriver: rank " + std::to_string(top.rank) + ", last at " + text::pct(top.lastPct()) +
                    " of its collectives; the others waited " + text::ms(static_cast<double>(top.causedWaitNs)) +
                    " ms on it.");
  }
  std::string out = "<ul class=\"facts\">";
  for (const auto& l : lines) out += "<li>" + escapeHtml(l) + "</li>";
  return out + "</ul>";
}

}  // namespace

std::string communicationSection(const CollectiveAnalysis& c, const TimeShares& run) {
  std::string out = sectionStart("communication", "Communication per group");
  out += facts(c, run);
  if (c.stats.empty()) return out + "<p class=\"note\">No collectives recorded.</p></section>";
  double best = 0;
  for (const auto& s : c.stats) best = std::max(best, s.busbwGbps);
  const size_t shown = std::min(c.stats.size(), kMaxRows);
  out += "<p class=\"summary\">Bus bandwidth (GB/s = 10⁹ bytes/s, nccl-tests factors) of each group's collectives, "
         "against the best measured in this run: " + escapeHtml(text::gbps(best)) + " GB/s.</p>";
  Svg svg(kWidth, static_cast<double>(shown) * kRowH + 6, "chart comm", "bus bandwidth per group against the best");
  double y = 4;
  for (size_t i = 0; i < shown; ++i, y += kRowH) {
    const CollectiveStats& s = c.stats[i];
    const std::string label = s.group + " " + s.op;
    svg.text(kLabelW - 8, y + kBarH - 4, label, "end");
    svg.rect(kLabelW, y, kBarW, kBarH, "#eef0f4");
    const double w = best > 0 ? kBarW * s.busbwGbps / best : 0;
    const std::string each = text::bytes(s.count ? static_cast<double>(s.bytes) / static_cast<double>(s.count) : 0.0);
    const std::string detail = std::to_string(s.count) + " × " + each + " · latency " +
                               text::ms(static_cast<double>(s.latencyNs)) + " ms · skew max " +
                               text::ms(static_cast<double>(s.maxSkewNs)) + " ms" +
                               (s.incomplete ? " · " + std::to_string(s.incomplete) + " incomplete" : "");
    if (w > 0)
      svg.rect(kLabelW, y, w, kBarH, palette::colour(palette::spanColour(tracedb::SpanKind::Comm, s.op)),
               label + ": busbw " + text::gbps(s.busbwGbps) + " GB/s (" + text::pct(100.0 * s.busbwGbps / best) +
                   " of the best) · " + detail,
               "seg");
    svg.text(kLabelW + kBarW + 10, y + kBarH - 4,
             (s.busbwGbps > 0 ? text::gbps(s.busbwGbps) + " GB/s" : std::string("—")) + " · " + detail, "start",
             s.incomplete ? "value bad" : "value");
  }
  out += svg.str();
  if (c.stats.size() > shown)
    out += "<p class=\"note\">" + std::to_string(c.stats.size() - shown) + " more (group, op) rows not drawn.</p>";
  return out + "</section>";
}

}  // namespace tpscope::report::html
