// renderHtmlReport: runs the analyses the viewer's first screen shows and assembles the page (html_report.h).
#include "tpscope/report/html_report.h"

#include "html/html_text.h"
#include "html/page_assets.h"
#include "html/palette.h"
#include "html/sections.h"
#include "html/timeline_lod.h"
#include "tpscope/analysis/desync.h"
#include "tpscope/analysis/diagnose.h"
#include "tpscope/analysis/report.h"
#include "tpscope/analysis/whatif.h"

namespace tpscope::report {

using namespace tpscope::analysis;

namespace {

using html::escapeHtml;

// Nothing may be fetched: the report is one file. Inline style and script are the page's own.
constexpr std::string_view kCsp =
    "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:; base-uri 'none'; "
    "form-action 'none'";

std::string header(tracedb::Reader& reader, const Report& report, const DiagnoseResult& diagnosis,
                   const std::string& title) {
  int steps = 0;
  for (const auto& r : report.breakdown.ranks) steps = std::max(steps, r.steps);
  std::string meta = std::to_string(report.info.ranks.size()) + (report.info.ranks.size() == 1 ? " rank" : " ranks") +
                     " · " + std::to_string(steps) + (steps == 1 ? " step" : " steps");
  if (auto n = reader.spanCount()) meta += " · " + std::to_string(*n) + " spans";
  if (auto source = reader.metaValue(tracedb::meta_keys::kSource)) meta += " · source: " + *source;
  if (auto run = reader.metaValue(tracedb::meta_keys::kRunId)) meta += " · run " + *run;
  std::string out = "<header><h1>tpscope report: " + escapeHtml(title) + "</h1><div class=\"meta\">" +
                    escapeHtml(meta) + "</div>";
  if (!diagnosis.findings.empty() && diagnosis.findings.front().severity <= Severity::Warning) {
    const Finding& f = diagnosis.findings.front();
    out += "<p class=\"headline\"><span class=\"badge\" style=\"background:" +
           std::string(html::palette::severity(f.severity)) + "\">" + escapeHtml(severityName(f.severity)) +
           "</span> " + escapeHtml(f.message) + "</p>";
  }
  return out + "<nav><a href=\"#diagnosis\">diagnosis</a><a href=\"#breakdown\">time per rank</a>"
               "<a href=\"#grad-health\">gradient health</a><a href=\"#communication\">communication</a>"
               "<a href=\"#desync\">desync</a><a href=\"#timeline\">timeline</a></nav></header>";
}

std::string page(const std::string& title, const std::string& headerHtml, const std::string& sections,
                 const std::string& generator) {
  std::string out = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                    "<meta http-equiv=\"Content-Security-Policy\" content=\"" + std::string(kCsp) + "\">"
                    "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
                    "<meta name=\"generator\" content=\"" + escapeHtml(generator) + "\">"
                    "<title>tpscope report: " + escapeHtml(title) + "</title><style>";
  out += html::kStyle;
  out += "</style></head>\n<body data-report-state=\"loading\">" + headerHtml +
         "<main><p id=\"js-errors\" hidden></p>" + sections + "</main><footer>" +
         escapeHtml((generator.empty() ? std::string("tpscope") : generator) +
                    " · one self-contained file: no network access, nothing to install") +
         "</footer>\n<script>";
  out += html::kScript;
  return out + "</script>\n</body></html>\n";
}

}  // namespace

tracedb::Result<HtmlReport> renderHtmlReport(tracedb::Reader& reader, const HtmlReportOptions& options) {
  auto report = buildReport(reader);
  if (!report) return report.status();
  const DiagnoseResult diagnosis = diagnose(reader);
  auto grads = reader.gradStats();
  if (!grads) return grads.status();
  auto desync = analyzeDesync(reader, report->info);
  if (!desync) return desync.status();
  const html::TimelineWindow window = html::chooseTimelineWindow(report->breakdown, diagnosis.findings, report->info,
                                                                 options.timeline.steps);
  auto overview = html::buildTimelineOverview(reader, window, report->info, report->breakdown, *desync,
                                              options.timeline);
  if (!overview) return overview.status();
  WhatIfOptions whatIfOptions;
  whatIfOptions.pathSteps = window.steps;  // the critical path of a step the timeline shows
  if (auto whatIf = analyzeWhatIf(reader, whatIfOptions)) html::addCriticalPath(*overview, *whatIf);

  std::string sections = html::findingsSection(diagnosis, report->info);
  sections += html::breakdownSection(report->breakdown);
  sections += html::gradHealthSection(*grads);
  sections += html::communicationSection(report->collectives, report->breakdown.run);
  sections += html::desyncSection(*desync, diagnosis.findings);
  sections += html::timelineSection(*overview);

  const std::string title = options.title.empty() ? reader.path().filename().string() : options.title;
  HtmlReport out;
  out.html = page(title, header(reader, *report, diagnosis, title), sections, options.generator);
  out.stats.bytes = static_cast<int64_t>(out.html.size());
  out.stats.windowSpans = overview->spans;
  out.stats.rects = overview->rects;
  out.stats.lanes = static_cast<int>(overview->lanes.size());
  out.stats.lanesOmitted = overview->lanesOmitted;
  return out;
}

}  // namespace tpscope::report
