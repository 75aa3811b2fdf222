// Time breakdown: one stacked bar per rank (and one for the run) of compute / exposed communication / other / idle
// as shares of step time — the four parts that sum to step time exactly (breakdown.h).
#include "html/html_text.h"
#include "html/palette.h"
#include "html/sections.h"
#include "html/svg.h"
#include "tpscope/analysis/units_text.h"

namespace tpscope::report::html {

namespace {

constexpr double kWidth = 900, kLabelW = 70, kBarW = 520, kRowH = 22, kBarH = 16, kLegendH = 26;
constexpr size_t kMaxRanks = 256;  // more ranks: the first 256 and the run row

struct Part {
  const char* name;
  std::string_view colour;
  int64_t TimeShares::*field;
};
constexpr Part kParts[] = {{"compute", palette::kCompute, &TimeShares::computeNs},
                           {"exposed communication", palette::kExposedComm, &TimeShares::exposedCommNs},
                           {"other", palette::kOther, &TimeShares::otherNs},
                           {"idle", palette::kIdle, &TimeShares::idleNs}};

void bar(Svg& svg, double y, const std::string& label, int steps, const TimeShares& t) {
  svg.text(kLabelW - 8, y + kBarH - 4, label, "end");
  double x = kLabelW;
  const double perStep = steps > 0 ? static_cast<double>(t.stepNs) / steps : 0.0;
  for (const Part& p : kParts) {
    const double share = t.pct(t.*(p.field));
    const double w = kBarW * share / 100.0;
    if (w <= 0) continue;
    svg.rect(x, y, w, kBarH, p.colour,
             label + " · " + p.name + " " + text::pct(share) + " (" +
                 text::ms(steps > 0 ? static_cast<double>(t.*(p.field)) / steps : 0.0) + " ms per step)",
             "seg");
    x += w;
  }
  svg.text(kLabelW + kBarW + 10, y + kBarH - 4,
           text::ms(perStep) + " ms/step · comm " + text::pct(t.pct(t.commNs)) + " · exposed " +
               text::pct(t.commOverheadPct()),
           "start", "value");
}

}  // namespace

std::string breakdownSection(const Breakdown& b) {
  std::string out = sectionStart("breakdown", "Time per rank");
  if (b.ranks.empty()) return out + "<p class=\"note\">No spans or collectives recorded.</p></section>";
  out += "<p class=\"summary\">Share of step time: compute, communication that no compute overlapped, other recorded "
         "work, nothing recorded. Step windows from " +
         escapeHtml(stepSourceName(b.source)) + "; exposed communication over the run: " +
         text::pct(b.run.commOverheadPct()) + ".</p>";
  const size_t shown = std::min(b.ranks.size(), kMaxRanks);
  Svg svg(kWidth, kLegendH + (static_cast<double>(shown) + 1) * kRowH + 4, "chart breakdown",
          "stacked bars: compute, exposed communication, other, idle per rank");
  double lx = kLabelW;
  for (const Part& p : kParts) {
    svg.rect(lx, 4, 12, 12, p.colour);
    svg.text(lx + 16, 14, p.name, "start", "legend");
    lx += 16 + 8.0 * static_cast<double>(std::string_view(p.name).size()) + 18;
  }
  double y = kLegendH;
  for (size_t i = 0; i < shown; ++i, y += kRowH)
    bar(svg, y, "rank " + std::to_string(b.ranks[i].rank), b.ranks[i].steps, b.ranks[i].time);
  bar(svg, y, "all", static_cast<int>(b.steps.size()), b.run);
  out += svg.str();
  if (b.ranks.size() > shown)
    out += "<p class=\"note\">" + std::to_string(b.ranks.size() - shown) + " more ranks not drawn.</p>";
  return out + "</section>";
}

}  // namespace tpscope::report::html
