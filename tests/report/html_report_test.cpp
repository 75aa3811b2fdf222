// The HTML report (report/html_report.h) rendered from the fixture runs: self-contained (nothing fetched from the
// network, no external script), every section present, the finding's rank and step in the text, names from the trace
// escaped, the size bound for a demo-sized run, the timeline's level-of-detail budget on a denser run, and the
// complete-or-absent output file. The real-browser checks are in tests/cli/html_browser_test.cpp.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "hostile_names.h"
#include "test_file.h"
#include "test_runs.h"
#include "tpscope/report/html_report.h"

namespace tpscope::report {
namespace {

namespace fs = std::filesystem;
using testing::RunSpec;

HtmlReport render(const std::string& name, const RunSpec& spec, const HtmlReportOptions& options = {},
                  bool hostile = false) {
  const fs::path path = testing::testDir() / (name + ".db");
  const tracedb::Status s = testing::writeRun(path, spec);
  EXPECT_TRUE(s) << s.message();
  if (hostile) {
    const tracedb::Status h = testing::makeNamesHostile(path);
    EXPECT_TRUE(h) << h.message();
  }
  auto reader = testing::openReader(path);
  if (!reader) return {};
  auto report = renderHtmlReport(*reader, options);
  EXPECT_TRUE(report) << report.error();
  return report ? *report : HtmlReport{};
}

RunSpec nanSpec() {
  RunSpec s;
  s.nanRank = 2;
  s.nanStep = 5;
  s.nanLayer = 1;
  return s;
}

RunSpec hangSpec() {
  RunSpec s;
  s.hangGroup = "tp-0";
  s.hangRank = 1;
  s.hangSeq = 7;
  return s;
}

// The part of the page between <section id="ID"> and its </section>.
std::string section(const std::string& html, const std::string& id) {
  const size_t at = html.find("<section id=\"" + id + "\">");
  if (at == std::string::npos) return {};
  return html.substr(at, html.find("</section>", at) - at);
}

void expectSelfContained(const std::string& html) {
  EXPECT_EQ(html.find("http://"), std::string::npos);
  EXPECT_EQ(html.find("https://"), std::string::npos);
  EXPECT_EQ(html.find("<script src"), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);
  EXPECT_EQ(html.find("@import"), std::string::npos);
  EXPECT_EQ(html.find("url("), std::string::npos);
  EXPECT_NE(html.find("default-src 'none'"), std::string::npos);  // the CSP forbids fetching anything
  for (const char* id : {"diagnosis", "breakdown", "grad-health", "communication", "desync", "timeline"})
    EXPECT_FALSE(section(html, id).empty()) << "section " << id;
  EXPECT_EQ(html.rfind("</html>\n"), html.size() - 8);
}

TEST(HtmlReport, NanRunShowsTheOriginAndMarksNonFiniteCells) {
  const HtmlReport r = render("nan", nanSpec());
  expectSelfContained(r.html);
  const std::string diagnosis = section(r.html, "diagnosis");
  const size_t first = diagnosis.find("<li class=\"finding sev-critical\"");
  ASSERT_NE(first, std::string::npos);
  EXPECT_LT(first, diagnosis.find("sev-info"));  // root cause first
  EXPECT_NE(diagnosis.find("nan_origin"), std::string::npos);
  EXPECT_NE(diagnosis.find("rank 2 (tp 0, dp 1, host node-0) · step 5 · layer 1"), std::string::npos);
  const std::string heat = section(r.html, "grad-health");
  EXPECT_NE(heat.find("class=\"nonfinite\"><title>rank 2 · layer 1 · step 5: 3 NaN"), std::string::npos);
  EXPECT_EQ(heat.find("rank 0 · layer 1 · step 4: 3 NaN"), std::string::npos);  // nothing before the origin step
  EXPECT_NE(section(r.html, "timeline").find("around step 5 of the first finding (nan_origin)"), std::string::npos);
  EXPECT_NE(section(r.html, "desync").find("No hang or desync"), std::string::npos);
  EXPECT_GT(r.stats.rects, 0);
}

TEST(HtmlReport, HangRunShowsTheDesyncMatrixCauseFirst) {
  const HtmlReport r = render("hang", hangSpec());
  expectSelfContained(r.html);
  const std::string desync = section(r.html, "desync");
  const size_t tp0 = desync.find("group tp-0 (ranks 0, 1): <span class=\"bad\">stuck at seq 7");
  ASSERT_NE(tp0, std::string::npos);
  EXPECT_LT(tp0, desync.find("group dp-0"));  // the cause before its consequences
  EXPECT_NE(desync.find("<tr class=\"missing\""), std::string::npos);
  EXPECT_NE(desync.find("never entered"), std::string::npos);
  EXPECT_NE(section(r.html, "timeline").find("never entered tp-0 #7"), std::string::npos);
}

TEST(HtmlReport, StragglerAndCleanRunsRender) {
  RunSpec straggler;
  straggler.stragglerRank = 3;
  const HtmlReport s = render("straggler", straggler);
  expectSelfContained(s.html);
  EXPECT_NE(section(s.html, "diagnosis").find("straggler"), std::string::npos);
  EXPECT_NE(section(s.html, "communication").find("Slowest arriver: rank 3"), std::string::npos);
  const HtmlReport c = render("clean", RunSpec{});
  expectSelfContained(c.html);
  EXPECT_NE(section(c.html, "breakdown").find("rank 3"), std::string::npos);
}

TEST(HtmlReport, HostileNamesAreEscaped) {
  const HtmlReport r = render("hostile", hangSpec(), {}, /*hostile=*/true);
  expectSelfContained(r.html);
  EXPECT_EQ(r.html.find("<script>document"), std::string::npos);
  EXPECT_EQ(r.html.find("</script><script>"), std::string::npos);
  EXPECT_EQ(r.html.find("<img"), std::string::npos);
  EXPECT_EQ(r.html.find("<svg onload"), std::string::npos);
  EXPECT_EQ(r.html.find("<b onmouseover"), std::string::npos);
  EXPECT_EQ(r.html.find("onerror=\""), std::string::npos);
  // The names are there, as text: entities in the markup, \u escapes in the timeline's JSON.
  EXPECT_NE(r.html.find("&lt;b onmouseover=alert(1)&gt;tp&lt;/b&gt;pwn"), std::string::npos);
  EXPECT_NE(r.html.find("&quot;&gt;&lt;svg onload="), std::string::npos);
  EXPECT_NE(r.html.find("\\u003c/script\\u003e\\u003cscript\\u003edocument.body.dataset.pwned=1"), std::string::npos);
  // Exactly one executable <script> element (the page's own) and one JSON block.
  const std::regex open("<script[ >]");
  EXPECT_EQ(std::distance(std::sregex_iterator(r.html.begin(), r.html.end(), open), std::sregex_iterator()), 2);
}

TEST(HtmlReport, DemoSizedRunStaysSmall) {
  RunSpec demo = nanSpec();
  demo.steps = 30;
  demo.layers = 4;
  demo.nanStep = 12;
  const HtmlReport r = render("demo", demo);
  expectSelfContained(r.html);
  EXPECT_LE(r.stats.bytes, 5 * 1024 * 1024);
  EXPECT_EQ(r.stats.bytes, static_cast<int64_t>(r.html.size()));
}

// A denser run with a small budget: each lane and level holds at most the cap, whatever the spans in the window.
TEST(HtmlReport, TimelineRespectsTheRectangleBudget) {
  RunSpec dense;
  dense.steps = 4;
  dense.extraSpansPerCompute = 300;
  HtmlReportOptions options;
  options.timeline.rectBudget = 4 * 6 * 200;
  options.timeline.minRectsPerLaneLevel = 200;
  const HtmlReport r = render("dense", dense, options);
  expectSelfContained(r.html);
  EXPECT_EQ(r.stats.lanes, 4);
  EXPECT_GT(r.stats.windowSpans, 4 * 3 * 2000);
  EXPECT_LE(r.stats.rects, int64_t{4} * 6 * 200);
  EXPECT_GT(r.stats.rects, 4 * 6 * 10);
  EXPECT_NE(r.html.find("at most 200 rectangles per lane and zoom level"), std::string::npos);
}

// The timeline's embedded JSON (timeline_section.cpp's format).
nlohmann::json timelineData(const std::string& html) {
  const std::string open = "<script type=\"application/json\" id=\"tl-data\">";
  const size_t at = html.find(open);
  if (at == std::string::npos) return {};
  const size_t from = at + open.size();
  return nlohmann::json::parse(html.substr(from, html.find("</script>", from) - from));
}

// The what-if critical path of a step the overview shows, outlined over its lanes: the legend line with its total and
// split, and its stretches in the timeline's data, in time order, on drawn lanes, inside the window.
TEST(HtmlReport, TimelineOutlinesTheCriticalPath) {
  RunSpec straggler;
  straggler.stragglerRank = 1;
  const HtmlReport r = render("critical", straggler);
  expectSelfContained(r.html);
  const std::string timeline = section(r.html, "timeline");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(timeline, m,
                                std::regex("id=\"tl-critical\"><span class=\"swatch critical\"></span>critical path "
                                           "of step ([0-9]+): [0-9.]+ ms, compute [0-9.]+ ms, transfer [0-9.]+ ms")))
      << timeline.substr(0, 2000);
  const int step = std::stoi(m[1]);
  const nlohmann::json d = timelineData(r.html);
  ASSERT_TRUE(d.contains("critical"));
  bool shown = false;  // the step is one of the window's
  for (const auto& s : d["steps"]) shown = shown || s[0] == step;
  EXPECT_TRUE(shown) << step;
  const auto& critical = d["critical"];
  ASSERT_GE(critical.size(), 3u);
  int64_t previous = 0;
  bool transfer = false;
  for (const auto& c : critical) {
    EXPECT_LT(c[0].get<size_t>(), d["lanes"].size());
    EXPECT_GE(c[1].get<int64_t>(), previous);
    EXPECT_LE(c[1].get<int64_t>() + c[2].get<int64_t>(), d["ns"].get<int64_t>());
    transfer = transfer || c[3] == 1;
    previous = c[1].get<int64_t>();
  }
  EXPECT_TRUE(transfer);
  EXPECT_NE(critical[0][4].get<std::string>().find("on the critical path"), std::string::npos);
}

// A run without step windows has no critical path: no legend line, nothing to outline.
TEST(HtmlReport, NoCriticalPathWithoutSteps) {
  const fs::path path = testing::testDir() / "no-steps.db";
  {
    auto w = testing::newWriter(path);
    ASSERT_TRUE(w);
    auto name = w->intern("forward");
    ASSERT_TRUE(name.isOk());
    for (int i = 0; i < 3; ++i) {
      tracedb::SpanRow s;
      s.kind = tracedb::SpanKind::Compute;
      s.name = *name;
      s.beginNs = i * 1'000'000;
      s.durNs = 500'000;
      ASSERT_TRUE(w->addSpan(s));
    }
    ASSERT_TRUE(w->close());
  }
  auto reader = testing::openReader(path);
  ASSERT_TRUE(reader);
  auto r = renderHtmlReport(*reader);
  ASSERT_TRUE(r) << r.error();
  expectSelfContained(r->html);
  EXPECT_GT(r->stats.rects, 0);
  EXPECT_EQ(r->html.find("id=\"tl-critical\""), std::string::npos);
  EXPECT_TRUE(timelineData(r->html)["critical"].empty());
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(HtmlReport, OutputIsCompleteOrAbsent) {
  const fs::path dir = testing::testDir();
  ASSERT_TRUE(writeHtmlFile(dir / "a.html", "<p>one</p>"));
  ASSERT_TRUE(writeHtmlFile(dir / "a.html", "<p>two</p>"));
  EXPECT_EQ(slurp(dir / "a.html"), "<p>two</p>");
  const tracedb::Status missing = writeHtmlFile(dir / "no" / "such" / "b.html", "x");
  EXPECT_FALSE(missing);
  EXPECT_NE(missing.message().find("b.html: cannot create the report"), std::string::npos) << missing.message();
  fs::create_directories(dir / "sub");
  const tracedb::Status onDir = writeHtmlFile(dir / "sub", "x");  // rename onto a directory fails
  EXPECT_FALSE(onDir);
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir)) files += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(files, 1u) << "a temporary file was left behind";
}

}  // namespace
}  // namespace tpscope::report
