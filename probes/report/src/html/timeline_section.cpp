// The timeline overview's section: a toolbar, an empty <svg> that the page's script draws into, the colour legend, and
// the overview as JSON in <script type="application/json" id="tl-data"> (format below; the script is
// page_assets.cpp's kScript).
//   {"t0": window begin − run begin (ns), "ns": window length (ns), "ticks": level 0 ticks, "levels": n,
//    "colours": [css...], "names": [span names...], "steps": [[step, ns from t0]...],
//    "stuck": [[lane, ns from t0, text]...],
//    "critical": [[lane, ns from t0, ns long, 1: transfer / 0: work, text]...] (the what-if critical path, in order),
//    "lanes": [{"label": text, "rows": n, "spans": n, "l": [[x, w, row, colour, name, ...] per level]}]}
#include <charconv>
#include <set>

#include "html/html_text.h"
#include "html/palette.h"
#include "html/sections.h"
#include "html/timeline_lod.h"
#include "tpscope/analysis/units_text.h"

namespace tpscope::report::html {

namespace {

void appendInt(std::string& out, int64_t v) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

std::string overviewJson(const TimelineOverview& o) {
  std::string j = "{\"t0\":";
  appendInt(j, o.window.beginNs - o.runBeginNs);
  j += ",\"ns\":";
  appendInt(j, o.window.endNs - o.window.beginNs);
  j += ",\"ticks\":";
  appendInt(j, o.options.baseTicks);
  j += ",\"levels\":";
  appendInt(j, std::max(1, o.options.levels));
  j += ",\"colours\":[";
  for (int c = 0; c < palette::kColourCount; ++c) j += (c ? ",\"" : "\"") + std::string(palette::colour(c)) + "\"";
  j += "],\"names\":[";
  for (size_t i = 0; i < o.names.size(); ++i) j += (i ? "," : "") + scriptJsonString(o.names[i]);
  j += "],\"steps\":[";
  for (size_t i = 0; i < o.stepMarks.size(); ++i) {
    j += i ? ",[" : "[";
    appendInt(j, o.stepMarks[i].first);
    j += ",";
    appendInt(j, o.stepMarks[i].second);
    j += "]";
  }
  j += "],\"stuck\":[";
  for (size_t i = 0; i < o.stuck.size(); ++i) {
    j += i ? ",[" : "[";
    appendInt(j, o.stuck[i].lane);
    j += ",";
    appendInt(j, o.stuck[i].ns);
    j += "," + scriptJsonString(o.stuck[i].text) + "]";
  }
  j += "],\"critical\":[";
  for (size_t i = 0; i < o.critical.size(); ++i) {
    const TimelineCriticalSegment& c = o.critical[i];
    j += i ? ",[" : "[";
    appendInt(j, c.lane);
    j += ",";
    appendInt(j, c.ns);
    j += ",";
    appendInt(j, c.lenNs);
    j += c.transfer ? ",1," : ",0,";
    j += scriptJsonString(c.text) + "]";
  }
  j += "],\"lanes\":[";
  for (size_t i = 0; i < o.lanes.size(); ++i) {
    const TimelineLane& lane = o.lanes[i];
    j += (i ? ",{\"label\":" : "{\"label\":") + scriptJsonString(lane.label) + ",\"rows\":";
    appendInt(j, lane.rows);
    j += ",\"spans\":";
    appendInt(j, lane.spans);
    j += ",\"l\":[";
    for (size_t k = 0; k < lane.levels.size(); ++k) {
      j += k ? ",[" : "[";
      for (size_t v = 0; v < lane.levels[k].size(); ++v) {
        if (v) j += ',';
        appendInt(j, lane.levels[k][v]);
      }
      j += "]";
    }
    j += "]}";
  }
  return j + "]}";
}

std::string legend(const TimelineOverview& o) {
  std::set<int> used;
  for (const auto& lane : o.lanes)
    if (!lane.levels.empty())
      for (size_t v = 3; v < lane.levels.front().size(); v += kRectFields) used.insert(lane.levels.front()[v]);
  std::string out = "<div class=\"legend\">";
  for (int c : used)
    out += "<span><span class=\"swatch\" style=\"background:" + std::string(palette::colour(c)) + "\"></span>" +
           escapeHtml(palette::colourName(c)) + "</span>";
  if (!o.stuck.empty())
    out += "<span><span class=\"swatch\" style=\"background:" + std::string(palette::kStuck) +
           "\"></span>stuck collective</span>";
  out += "</div>";
  if (!o.criticalText.empty())  // the outline the script draws over the lanes the path runs through
    out += "<p class=\"legend\" id=\"tl-critical\"><span class=\"swatch critical\"></span>" +
           escapeHtml(o.criticalText) + " (what-if replay; outlined: work, dashed: transfers)</p>";
  return out;
}

std::string summary(const TimelineOverview& o) {
  std::string s = "From " + text::ms(static_cast<double>(o.window.beginNs - o.runBeginNs)) + " to " +
                  text::ms(static_cast<double>(o.window.endNs - o.runBeginNs)) + " ms after the run's start: " +
                  o.window.reason + "; " + std::to_string(o.lanes.size()) + " lanes, " + std::to_string(o.spans) +
                  " spans. Wheel or +/− to zoom, drag to pan, double-click for the whole window; hover for names. "
                  "Narrow spans close together are drawn as one block (at most " +
                  std::to_string(o.rectCap) + " rectangles per lane and zoom level).";
  if (o.lanesOmitted > 0) s += " " + std::to_string(o.lanesOmitted) + " more lanes not drawn.";
  int64_t hidden = 0;
  for (const auto& lane : o.lanes) hidden += lane.hiddenDeep;
  if (hidden > 0) s += " " + std::to_string(hidden) + " spans nested deeper than " +
                       std::to_string(o.options.maxRows) + " levels not drawn.";
  return "<p class=\"summary\">" + escapeHtml(s) + "</p>";
}

}  // namespace

std::string timelineSection(const TimelineOverview& o) {
  std::string out = sectionStart("timeline", "Timeline overview");
  if (o.lanes.empty()) return out + "<p class=\"note\">No spans in the run.</p></section>";
  out += summary(o);
  out += "<div class=\"tl-toolbar\"><button type=\"button\" data-tl=\"in\">+</button>"
         "<button type=\"button\" data-tl=\"out\">−</button>"
         "<button type=\"button\" data-tl=\"reset\">whole window</button><span id=\"tl-range\"></span></div>"
         "<div id=\"tl-wrap\"><svg id=\"tl-svg\" class=\"chart timeline\" role=\"img\" aria-label=\"timeline "
         "overview\"></svg><div id=\"tl-tip\" hidden></div></div>";
  out += legend(o);
  out += "<noscript><p class=\"note\">The timeline is drawn by the page's script; the other sections need none."
         "</p></noscript>";
  out += "<script type=\"application/json\" id=\"tl-data\">" + overviewJson(o) + "</script>";
  return out + "</section>";
}

}  // namespace tpscope::report::html
