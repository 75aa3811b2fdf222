// Gradient health: one heatmap row per (rank, layer), one column per step (or per range of steps when there are more
// than kMaxColumns). A cell is the largest grad_stats l2 norm among the layer's parameters (the viewer's rule), on a
// log10 colour scale over the finite cells; a cell with any NaN or Inf is magenta and marked, so a NaN's origin and
// its spread to other ranks and layers read off one picture.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "html/html_text.h"
#include "html/palette.h"
#include "html/sections.h"
#include "html/svg.h"
#include "tpscope/analysis/units_text.h"

namespace tpscope::report::html {

namespace {

constexpr size_t kMaxColumns = 120;
constexpr size_t kMaxRows = 256;
constexpr size_t kMaxTitledCells = 6000;  // beyond this only non-finite cells carry a hover title (file size)
constexpr double kLabelW = 118, kPlotW = 720, kTopH = 30, kBottomH = 40;

struct Cell {
  bool present = false;
  double norm = 0;  // largest finite l2 norm
  int64_t nan = 0, inf = 0;
  bool nonFinite() const { return nan > 0 || inf > 0; }
};

struct Grid {
  std::vector<std::pair<int, int>> rows;  // (rank, layer)
  std::vector<int> steps;                 // distinct steps, sorted
  size_t columns = 0;                     // ≤ kMaxColumns; column c holds steps[c·per .. (c+1)·per)
  size_t stepsPerColumn = 1;
  std::vector<Cell> cells;                // rows × columns
  double logMin = 0, logMax = 0;
  bool anyFinite = false;
  Cell& at(size_t r, size_t c) { return cells[r * columns + c]; }
};

Grid buildGrid(const std::vector<tracedb::GradStatRow>& rows) {
  Grid g;
  std::set<std::pair<int, int>> keys;
  std::set<int> steps;
  for (const auto& row : rows) {
    keys.emplace(row.rank, row.layer);
    steps.insert(row.step);
  }
  g.rows.assign(keys.begin(), keys.end());
  if (g.rows.size() > kMaxRows) g.rows.resize(kMaxRows);
  g.steps.assign(steps.begin(), steps.end());
  g.stepsPerColumn = std::max<size_t>(1, (g.steps.size() + kMaxColumns - 1) / kMaxColumns);
  g.columns = (g.steps.size() + g.stepsPerColumn - 1) / g.stepsPerColumn;
  g.cells.assign(g.rows.size() * g.columns, {});
  for (const auto& row : rows) {
    const auto r = std::lower_bound(g.rows.begin(), g.rows.end(), std::make_pair(row.rank, row.layer));
    if (r == g.rows.end() || *r != std::make_pair(row.rank, row.layer)) continue;
    const size_t s = static_cast<size_t>(std::lower_bound(g.steps.begin(), g.steps.end(), row.step) - g.steps.begin());
    Cell& c = g.at(static_cast<size_t>(r - g.rows.begin()), s / g.stepsPerColumn);
    c.nan += row.nanCount;
    c.inf += row.infCount;
    if (std::isfinite(row.l2Norm)) c.norm = c.present ? std::max(c.norm, row.l2Norm) : row.l2Norm;
    c.present = true;
  }
  for (const Cell& c : g.cells) {
    if (!c.present || !(c.norm > 0)) continue;
    const double l = std::log10(c.norm);
    g.logMin = g.anyFinite ? std::min(g.logMin, l) : l;
    g.logMax = g.anyFinite ? std::max(g.logMax, l) : l;
    g.anyFinite = true;
  }
  return g;
}

std::string rowLabel(const std::pair<int, int>& key) {
  return "rank " + std::to_string(key.first) + " · " + (key.second < 0 ? "other" : "layer " + std::to_string(key.second));
}

std::string columnLabel(const Grid& g, size_t c) {
  const int first = g.steps[c * g.stepsPerColumn];
  const int last = g.steps[std::min(g.steps.size(), (c + 1) * g.stepsPerColumn) - 1];
  return first == last ? "step " + std::to_string(first) : "steps " + std::to_string(first) + "–" + std::to_string(last);
}

std::string cellTitle(const Grid& g, size_t r, size_t c, const Cell& cell) {
  std::string t = rowLabel(g.rows[r]) + " · " + columnLabel(g, c) + ": ";
  if (cell.nan > 0) t += std::to_string(cell.nan) + " NaN ";
  if (cell.inf > 0) t += std::to_string(cell.inf) + " Inf ";
  if (cell.nonFinite()) t += "· ";
  return t + "max l2 norm " + text::fixed(cell.norm, 4);
}

std::string_view cellColour(const Grid& g, const Cell& cell, std::string& buffer) {
  if (!cell.present) return palette::kNoData;
  if (cell.nonFinite()) return palette::kNonFinite;
  const double span = g.logMax - g.logMin;
  buffer = palette::heat(cell.norm > 0 && span > 0 ? (std::log10(cell.norm) - g.logMin) / span : 0.5);
  return buffer;
}

void drawAxes(Svg& svg, const Grid& g, double cellW, double rowH, double plotH) {
  for (size_t r = 0; r < g.rows.size(); ++r) {
    const bool rankStart = r == 0 || g.rows[r].first != g.rows[r - 1].first;
    const double y = kTopH + static_cast<double>(r) * rowH;
    if (rankStart && r > 0) svg.line(kLabelW, y, kLabelW + cellW * static_cast<double>(g.columns), y, "#ffffff", 2);
    // Every row when there is room for its label, else the first row of each rank.
    if (rowH >= 9 || rankStart) svg.text(kLabelW - 6, y + std::min(rowH, 14.0) - 3, rowLabel(g.rows[r]), "end", "axis");
  }
  const size_t tickEvery = std::max<size_t>(1, static_cast<size_t>(std::ceil(48.0 / cellW)));
  for (size_t c = 0; c < g.columns; c += tickEvery)
    svg.text(kLabelW + (c + 0.5) * cellW, kTopH + plotH + 14, std::to_string(g.steps[c * g.stepsPerColumn]), "middle",
             "axis");
  svg.text(kLabelW + cellW * g.columns / 2, kTopH + plotH + 32, "step", "middle", "axis");
}

void drawLegend(Svg& svg, const Grid& g) {
  constexpr int kStops = 24;
  const double x0 = kLabelW, w = 160;
  for (int i = 0; i < kStops; ++i) svg.rect(x0 + w * i / kStops, 4, w / kStops + 0.5, 12, palette::heat(i / (kStops - 1.0)));
  svg.text(x0 - 6, 14, g.anyFinite ? text::fixed(std::pow(10.0, g.logMin), 3) : "-", "end", "legend");
  svg.text(x0 + w + 6, 14, (g.anyFinite ? text::fixed(std::pow(10.0, g.logMax), 3) : "-") + "  max l2 norm (log scale)",
           "start", "legend");
  svg.rect(x0 + w + 250, 4, 12, 12, palette::kNonFinite);
  svg.text(x0 + w + 266, 14, "NaN / Inf", "start", "legend");
  svg.rect(x0 + w + 350, 4, 12, 12, palette::kNoData);
  svg.text(x0 + w + 366, 14, "no record", "start", "legend");
}

}  // namespace

std::string gradHealthSection(const std::vector<tracedb::GradStatRow>& rows) {
  std::string out = sectionStart("grad-health", "Gradient health");
  if (rows.empty())
    return out + "<p class=\"note\">No gradient statistics recorded (grad_stats is empty: an imported profiler trace "
                 "or a run without gradient probes).</p></section>";
  Grid g = buildGrid(rows);
  out += "<p class=\"summary\">Largest gradient l2 norm of each layer's parameters, per rank and step (grad_stats). "
         "Magenta cells hold NaN or Inf";
  if (g.stepsPerColumn > 1) out += "; one column per " + std::to_string(g.stepsPerColumn) + " steps";
  out += ".</p>";
  const double cellW = std::max(3.0, std::min(36.0, kPlotW / static_cast<double>(g.columns)));
  const double rowH = std::clamp(520.0 / static_cast<double>(g.rows.size()), 3.0, 18.0);
  const double plotH = rowH * static_cast<double>(g.rows.size());
  Svg svg(std::max(kLabelW + cellW * g.columns + 20, 700.0), kTopH + plotH + kBottomH, "chart heatmap",
          "gradient-health heatmap: rank and layer by step");
  drawLegend(svg, g);
  const bool titled = g.cells.size() <= kMaxTitledCells;
  std::string colour;
  int64_t nonFinite = 0;
  for (size_t r = 0; r < g.rows.size(); ++r) {
    for (size_t c = 0; c < g.columns; ++c) {
      const Cell& cell = g.at(r, c);
      const double x = kLabelW + c * cellW, y = kTopH + r * rowH;
      const bool mark = cell.nonFinite();
      nonFinite += mark ? 1 : 0;
      svg.rect(x, y, cellW - (cellW > 4 ? 1 : 0), rowH - (rowH > 4 ? 1 : 0), cellColour(g, cell, colour),
               titled || mark ? cellTitle(g, r, c, cell) : "", mark ? "nonfinite" : "");
      if (mark && cellW >= 12 && rowH >= 10)
        svg.text(x + cellW / 2, y + rowH / 2 + 3.5, cell.nan > 0 ? "NaN" : "Inf", "middle", "cellmark");
    }
  }
  drawAxes(svg, g, cellW, rowH, plotH);
  out += svg.str();
  out += "<p class=\"note\" data-nonfinite-cells=\"" + std::to_string(nonFinite) + "\">" + std::to_string(nonFinite) +
         " cell" + (nonFinite == 1 ? "" : "s") + " with non-finite values.</p>";
  return out + "</section>";
}

}  // namespace tpscope::report::html
