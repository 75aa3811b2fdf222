// Every view rendered offscreen over the fixture run (NaN at rank 2 / layer 1, tp-0 stuck at seq 8 with rank 1
// missing), checked for structure — lanes present, the NaN cell marked, the stuck collective highlighted — by
// querying the widgets and sampling pixels at known places. The PNGs are kept in the build tree (screenshots/).
#include <gtest/gtest.h>

#include <QApplication>
#include <QHeaderView>
#include <QMessageBox>
#include <QMimeData>
#include <QSignalSpy>
#include <QStatusBar>
#include <QTest>
#include <QTreeWidget>
#include <QUrl>
#include <fstream>
#include <set>

#include "fixture_run.h"
#include "main_window.h"
#include "test_runs.h"
#include "tpscope/analysis/stall_journal.h"
#include "tpscope/analysis/summary.h"
#include "tpscope/gui/palette.h"
#include "tpscope/tracedb/writer.h"

namespace tpscope::gui {
namespace {

namespace fs = std::filesystem;
using namespace tpscope::gui::testing;

// True if some pixel of `area` (clipped to the image) is within `tolerance` (per channel) of `colour`.
bool hasColour(const QImage& image, QRect area, const QColor& colour, int tolerance = 40) {
  area = area.intersected(image.rect());
  for (int y = area.top(); y <= area.bottom(); ++y)
    for (int x = area.left(); x <= area.right(); ++x) {
      const QColor c = image.pixelColor(x, y);
      if (std::abs(c.red() - colour.red()) <= tolerance && std::abs(c.green() - colour.green()) <= tolerance &&
          std::abs(c.blue() - colour.blue()) <= tolerance)
        return true;
    }
  return false;
}

// Shows `window` at 1200×700, opens `run` and waits until it is analysed.
bool openAnalysed(MainWindow& window, const fs::path& run) {
  window.resize(1200, 700);
  window.show();
  QSignalSpy analysed(window.loader(), &RunLoader::analysisLoaded);
  window.openPath(QString::fromStdString(run.string()));
  if (!analysed.wait(30000)) return false;
  QCoreApplication::processEvents();
  return true;
}

QImage save(QWidget* w, const std::string& name) {
  const QImage image = w->grab().toImage();
  const fs::path dir = fs::path(TPSCOPE_GUI_TEST_ARTEFACTS);
  fs::create_directories(dir);
  EXPECT_TRUE(image.save(QString::fromStdString((dir / (name + ".png")).string())));
  return image;
}

// The timeline shows, selected, a span of the NaN origin's rank and layer (where a jump to the origin lands).
void expectOnTheNanSpan(MainWindow& window) {
  EXPECT_EQ(window.tabs()->currentIndex(), MainWindow::kTimelineTab);
  const SpanRef span = window.timeline()->selectedSpan();
  ASSERT_TRUE(span.valid());
  EXPECT_EQ(window.run()->timeline->lanes()[span.lane].rank, kNanRank);
  EXPECT_EQ(window.run()->timeline->row(span).layer[span.index], kNanLayer);
}

class ViewsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = scratchDir("views");
    ASSERT_EQ(writeFixtureRun(dir_ / "run.db"), "");
    window_ = std::make_unique<MainWindow>(QString::fromStdString((dir_ / "settings.ini").string()));
    window_->resize(1400, 850);
    window_->show();
    QSignalSpy analysed(window_->loader(), &RunLoader::analysisLoaded);
    window_->openPath(QString::fromStdString((dir_ / "run.db").string()));
    ASSERT_TRUE(analysed.wait(30000));
    QCoreApplication::processEvents();
    ASSERT_TRUE(window_->run());
    ASSERT_TRUE(window_->analysis());
  }
  fs::path dir_;
  std::unique_ptr<MainWindow> window_;
};

TEST_F(ViewsTest, TimelineShowsLanesAndTheStuckCollective) {
  window_->tabs()->setCurrentIndex(MainWindow::kTimelineTab);
  TimelineView* t = window_->timeline();
  t->zoomAll();
  t->waitForFrame();
  const QImage image = save(t, "timeline");
  ASSERT_EQ(t->layout().laneTop.size(), 8u);
  const int plotLeft = TimelineLayout::kLabelWidth + 2;
  for (int lane = 0; lane < 8; ++lane) {
    const QRect r = t->laneRect(lane);
    ASSERT_TRUE(image.rect().contains(r.center())) << "lane " << lane << " on screen";
    // Spans are drawn: the main lanes show compute (blue), the stream lanes kernels (cyan).
    const QRect plot(plotLeft, r.top(), image.width() - plotLeft - 20, r.height() - TimelineLayout::kLaneGap);
    const QColor kind = palette::kind(lane % 2 == 0 ? tracedb::SpanKind::Compute : tracedb::SpanKind::Kernel);
    EXPECT_TRUE(hasColour(image, plot, kind, 10)) << "lane " << lane;
  }
  // The stuck collective: a red-outlined band from each waiting rank's arrival on its main lane; the missing rank
  // carries a dashed red line.
  TimelinePainter p;
  p.viewport = t->viewport();
  for (const auto& c : window_->run()->collectives) {
    if (c.seq != kStuckSeq) continue;
    const int lane = window_->run()->timeline->laneOf(c.rank, 0);
    const QRect r = t->laneRect(lane);
    const int x = static_cast<int>(std::lround(p.xOf(c.enqueueNs)));
    EXPECT_TRUE(hasColour(image, QRect(x - 2, r.top() + 2, 5, r.height() - 10), palette::kStuck, 25))
        << "stuck band on rank " << c.rank;
  }
  const QRect missing = t->laneRect(window_->run()->timeline->laneOf(kMissingRank, 0));
  EXPECT_TRUE(hasColour(image, QRect(plotLeft, missing.top(), image.width() - plotLeft - 20, missing.height()),
                        palette::kStuck, 25))
      << "the missing rank is marked";
}

TEST_F(ViewsTest, SelectingACollectiveHighlightsItOnEveryRank) {
  window_->tabs()->setCurrentIndex(MainWindow::kTimelineTab);  // the fixture run opens on its findings
  TimelineView* t = window_->timeline();
  const auto& cs = window_->run()->collectives;
  auto first = std::find_if(cs.begin(), cs.end(), [](const auto& c) { return c.seq == 2; });
  ASSERT_NE(first, cs.end());
  // Click the all-reduce span of rank 0 for seq 2 and expect the collective selected everywhere.
  t->showRange(first->enqueueNs - 1'000'000, first->endNs.value() + 1'000'000, 0);
  t->waitForFrame();
  const int lane = window_->run()->timeline->laneOf(0, 0);
  TimelinePainter p;
  p.viewport = t->viewport();
  const int64_t mid = (first->enqueueNs + *first->endNs) / 2;
  // The comm span sits in row 1 of the main lane (inside the step span).
  const QPoint click(static_cast<int>(p.xOf(mid)), t->laneRect(lane).top() + TimelineLayout::kRowHeight * 3 / 2);
  QSignalSpy selected(t, &TimelineView::collectiveSelected);
  QTest::mouseClick(t, Qt::LeftButton, {}, click);
  ASSERT_EQ(selected.count(), 1);
  EXPECT_EQ(t->selectedCollective().group, "tp-0");
  EXPECT_EQ(t->selectedCollective().seq, 2);
  EXPECT_TRUE(window_->details()->toPlainText().contains("tp-0 #2"));
  t->waitForFrame();
  const QImage image = save(t, "timeline-collective");
  for (int rank = 0; rank < kFixtureRanks; ++rank) {
    const QRect r = t->laneRect(window_->run()->timeline->laneOf(rank, 0));
    EXPECT_TRUE(hasColour(image, QRect(TimelineLayout::kLabelWidth, r.top(), image.width() - 200, r.height()),
                          palette::kHighlight, 20))
        << "rank " << rank;
  }
  // Keyboard: W zooms in, A pans, Esc clears.
  const double before = t->viewport().nsPerPx;
  QTest::keyClick(t, Qt::Key_W);
  EXPECT_LT(t->viewport().nsPerPx, before);
  const int64_t start = t->viewport().startNs;
  QTest::keyClick(t, Qt::Key_A);
  EXPECT_LT(t->viewport().startNs, start);
  QTest::keyClick(t, Qt::Key_Escape);
  EXPECT_FALSE(t->selectedCollective().valid());
  // Shift+drag measures.
  QSignalSpy measured(t, &TimelineView::rangeMeasured);
  QTest::mousePress(t, Qt::LeftButton, Qt::ShiftModifier, QPoint(400, 100));
  QMouseEvent move(QEvent::MouseMove, QPointF(600, 100), t->mapToGlobal(QPointF(600, 100)), Qt::NoButton,
                   Qt::LeftButton, Qt::ShiftModifier);
  QApplication::sendEvent(t, &move);
  QTest::mouseRelease(t, Qt::LeftButton, Qt::ShiftModifier, QPoint(600, 100));
  ASSERT_EQ(measured.count(), 1);
  EXPECT_NEAR(static_cast<double>(t->range()->second - t->range()->first), 200 * t->viewport().nsPerPx,
              2 * t->viewport().nsPerPx);
}

TEST_F(ViewsTest, GradientHeatmapMarksTheNanCellAndJumps) {
  window_->tabs()->setCurrentIndex(MainWindow::kGradTab);
  GradHealthView* g = window_->gradHealth();
  QCoreApplication::processEvents();
  const QImage image = save(g, "grad-health");
  QTableView* table = g->table();
  const QModelIndex nan = g->model()->index(kNanRank, kNanLayer);
  const QRect cell = table->visualRect(nan).translated(table->viewport()->mapTo(g, QPoint(0, 0)));
  EXPECT_TRUE(hasColour(image, cell.adjusted(2, 2, -cell.width() / 2, -cell.height() / 2), palette::kNonFinite, 20));
  const QModelIndex fine = g->model()->index(0, kNanLayer);
  const QRect fineCell = table->visualRect(fine).translated(table->viewport()->mapTo(g, QPoint(0, 0)));
  EXPECT_FALSE(hasColour(image, fineCell.adjusted(2, 2, -2, -2), palette::kNonFinite, 20));
  // A click lands on the timeline at that rank and step.
  QTest::mouseClick(table->viewport(), Qt::LeftButton, {}, table->visualRect(nan).center());
  EXPECT_EQ(window_->tabs()->currentIndex(), MainWindow::kTimelineTab);
  const Viewport vp = window_->timeline()->viewport();
  EXPECT_LE(vp.startNs, kNanStep * kStepNs);
  EXPECT_GE(vp.endNs(), (kNanStep + 1) * kStepNs - 400'000);
  EXPECT_LT(vp.endNs() - vp.startNs, 2 * kStepNs);
  const SpanRef span = window_->timeline()->selectedSpan();
  ASSERT_TRUE(span.valid()) << "the click lands on the layer's backward pass";
  const LaneRow& row = window_->run()->timeline->row(span);
  EXPECT_EQ(window_->run()->timeline->lanes()[span.lane].rank, kNanRank);
  EXPECT_EQ(row.layer[span.index], kNanLayer);
  EXPECT_EQ(row.step[span.index], kNanStep);
  EXPECT_EQ(row.phase[span.index], static_cast<uint8_t>(tracedb::Phase::Backward));
}

TEST_F(ViewsTest, CommunicationShowsBarsOverheadAndTheCollectiveTable) {
  window_->tabs()->setCurrentIndex(MainWindow::kCommTab);
  CommunicationView* c = window_->communication();
  QCoreApplication::processEvents();
  save(c, "communication");
  EXPECT_TRUE(c->overhead()->text().contains("Communication overhead"));
  ASSERT_EQ(c->chartView()->chart()->series().size(), 1);
  EXPECT_EQ(c->table()->model()->rowCount(), static_cast<int>(kStuckSeq + 1));
  // Sorting by the State column puts the stuck collective first (descending: "stuck" > "completed").
  c->table()->sortByColumn(CollectiveModel::kState, Qt::DescendingOrder);
  EXPECT_EQ(c->table()->model()->index(0, CollectiveModel::kSeq).data().toLongLong(), kStuckSeq);
  EXPECT_TRUE(c->table()->model()->index(0, 0).data(CollectiveModel::StuckRole).toBool());
}

TEST_F(ViewsTest, DesyncShowsTheMissingRank) {
  window_->tabs()->setCurrentIndex(MainWindow::kDesyncTab);
  DesyncView* d = window_->desync();
  QCoreApplication::processEvents();
  const QImage image = save(d, "desync");
  QTableView* table = d->table();
  int missingRow = -1;
  for (int r = 0; r < d->model()->rowCount(); ++r)
    if (d->model()->index(r, 0).data(DesyncModel::RankRole).toInt() == kMissingRank) missingRow = r;
  ASSERT_GE(missingRow, 0);
  const QRect cell =
      table->visualRect(d->model()->index(missingRow, 0)).translated(table->viewport()->mapTo(d, QPoint(0, 0)));
  EXPECT_TRUE(hasColour(image, cell.adjusted(1, 1, -1, -1), palette::kStuck, 20));
  EXPECT_FALSE(d->explanation()->text().isEmpty());
}

TEST_F(ViewsTest, FindingsJumpToEvidence) {
  window_->tabs()->setCurrentIndex(MainWindow::kFindingsTab);
  FindingsView* f = window_->findings();
  QCoreApplication::processEvents();
  save(f, "findings");
  int hang = -1;
  for (int r = 0; r < f->model()->rowCount(); ++r)
    if (f->model()->index(r, FindingsModel::kKind).data().toString() == "hang") hang = r;
  ASSERT_GE(hang, 0);
  int origin = -1;
  for (int r = 0; r < f->model()->rowCount(); ++r)
    if (f->model()->index(r, FindingsModel::kKind).data().toString() == "nan_origin") origin = r;
  ASSERT_GE(origin, 0);
  f->activate(origin);
  expectOnTheNanSpan(*window_);
  f->activate(hang);
  EXPECT_EQ(window_->tabs()->currentIndex(), MainWindow::kTimelineTab);
  EXPECT_EQ(window_->timeline()->selectedCollective().seq, kStuckSeq);
  window_->timeline()->waitForFrame();
  const QImage image = save(window_->timeline(), "timeline-stuck");
  // Selected and stuck: highlighted, and still outlined red on every rank that entered it.
  TimelinePainter p;
  p.viewport = window_->timeline()->viewport();
  for (const auto& c : window_->run()->collectives) {
    if (c.seq != kStuckSeq) continue;
    const QRect r = window_->timeline()->laneRect(window_->run()->timeline->laneOf(c.rank, 0));
    const int x = static_cast<int>(std::lround(p.xOf(c.enqueueNs)));
    EXPECT_TRUE(hasColour(image, QRect(x - 2, r.top() + 2, 5, r.height() - 10), palette::kStuck, 25)) << c.rank;
    EXPECT_TRUE(hasColour(image, QRect(x, r.top(), 300, r.height()), palette::kHighlight, 60)) << c.rank;
  }
}

// The fixture's chain has critical roots (the NaN origin, the hang): the run opens on the findings with the chain
// as a tree, its first root selected; double-clicking a link jumps to its evidence.
TEST_F(ViewsTest, OpensOnTheChainAndItsLinksJumpToTheirEvidence) {
  EXPECT_EQ(window_->tabs()->currentIndex(), MainWindow::kFindingsTab);
  FindingsView* f = window_->findings();
  QTreeWidget* tree = f->chain();
  ASSERT_TRUE(tree->isVisible());
  save(f, "findings-chain");
  ASSERT_EQ(tree->topLevelItemCount(), static_cast<int>(window_->analysis()->chain.size()));
  ASSERT_GE(tree->topLevelItemCount(), 2);
  QTreeWidgetItem* origin = tree->topLevelItem(0);
  EXPECT_EQ(origin->text(FindingsView::kChainKind), "nan_origin");
  EXPECT_EQ(origin->text(FindingsView::kChainSeverity), "critical");
  EXPECT_EQ(tree->currentItem(), origin);
  QTreeWidgetItem* hang = nullptr;
  for (int i = 0; i < tree->topLevelItemCount(); ++i)
    if (tree->topLevelItem(i)->text(FindingsView::kChainKind) == "hang") hang = tree->topLevelItem(i);
  ASSERT_NE(hang, nullptr);
  // The tree mirrors the chain: each item's children are its link's consequences.
  const auto& root = window_->analysis()->chain.front();
  ASSERT_EQ(origin->childCount(), static_cast<int>(root.consequences.size()));
  for (int i = 0; i < origin->childCount(); ++i)
    EXPECT_EQ(origin->child(i)->text(FindingsView::kChainKind).toStdString(), root.consequences[i].kind);

  f->activateLink(origin);
  expectOnTheNanSpan(*window_);
  f->activateLink(hang);
  EXPECT_EQ(window_->timeline()->selectedCollective().group, kStuckGroup);
  EXPECT_EQ(window_->timeline()->selectedCollective().seq, kStuckSeq);
  for (int i = 0; i < origin->childCount(); ++i) {  // a hop lands on the collective that carried the value
    const auto& link = root.consequences[i];
    if (link.kind != "spread") continue;
    f->activateLink(origin->child(i));
    EXPECT_EQ(window_->timeline()->selectedCollective().group.toStdString(), link.collective->group);
    EXPECT_EQ(window_->timeline()->selectedCollective().seq, link.collective->seq);
  }
}

// Every finding's place is marked on the timeline: the NaN origin's triangle, in the critical colour, at the start
// of rank 2's step 1 on its first lane.
TEST_F(ViewsTest, TimelineMarksEveryFindingsPlace) {
  window_->tabs()->setCurrentIndex(MainWindow::kTimelineTab);
  TimelineView* t = window_->timeline();
  t->zoomAll();
  t->waitForFrame();
  const QImage image = save(t, "timeline-marks");
  const auto& marks = t->findingMarks();
  for (const auto& fd : window_->analysis()->findings) {
    if (fd.rank < 0 || fd.step < 0) continue;
    EXPECT_TRUE(std::any_of(marks.begin(), marks.end(), [&](const auto& m) { return m.rank == fd.rank; }))
        << fd.message;
  }
  auto origin = std::find_if(marks.begin(), marks.end(), [](const auto& m) { return m.label == "nan_origin"; });
  ASSERT_NE(origin, marks.end());
  EXPECT_EQ(origin->rank, kNanRank);
  int64_t b = 0, e = 0;
  ASSERT_TRUE(window_->run()->stepWindow(kNanRank, kNanStep, b, e));
  EXPECT_EQ(origin->timeNs, b);
  const QPointF tip = t->markPoint(*origin);
  EXPECT_EQ(static_cast<int>(tip.y()), t->laneRect(window_->run()->timeline->laneOf(kNanRank, 0)).top());
  EXPECT_TRUE(hasColour(image, QRect(static_cast<int>(tip.x()) - 1, static_cast<int>(tip.y()) - 6, 3, 3),
                        palette::severity(0), 12));
}

// A run with no finding of warning or worse opens where the user left the window (the timeline), the chain hidden.
TEST(ChainWindow, HealthyRunStaysOnTheTimeline) {
  const fs::path dir = scratchDir("healthy-window");
  ASSERT_EQ(writeRankFile(dir / "rank-0.db", 0, 1'000'000, 0, "forward"), "");
  MainWindow window(QString::fromStdString((dir / "settings.ini").string()));
  window.show();
  QSignalSpy analysed(window.loader(), &RunLoader::analysisLoaded);
  window.openPath(QString::fromStdString((dir / "rank-0.db").string()));
  ASSERT_TRUE(analysed.wait(20000));
  QCoreApplication::processEvents();
  ASSERT_TRUE(window.analysis());
  EXPECT_TRUE(window.analysis()->chain.empty());
  EXPECT_EQ(window.tabs()->currentIndex(), MainWindow::kTimelineTab);
  EXPECT_FALSE(window.findings()->chain()->isVisibleTo(window.findings()));
}

// A run file with summaries (as merge writes it) is on screen from its lane summary first; every span then replaces
// the summary without moving the view, and the freshly opened run still opens on its chain.
TEST(SummaryWindow, EverySpanReplacesTheSummaryAndKeepsTheView) {
  const fs::path dir = scratchDir("summary-window");
  ASSERT_EQ(writeFixtureRun(dir / "run.db"), "");
  ASSERT_TRUE(analysis::writeRunSummary(dir / "run.db"));
  MainWindow window(QString::fromStdString((dir / "settings.ini").string()));
  window.resize(1400, 850);
  window.show();
  QSignalSpy loaded(window.loader(), &RunLoader::runLoaded);
  QSignalSpy analysed(window.loader(), &RunLoader::analysisLoaded);
  // While the summary is on screen (the window's own slot has run: it was connected first), the user zooms in.
  Viewport zoomed;
  bool sawSummary = false;
  QObject::connect(window.loader(), &RunLoader::runLoaded, &window, [&](RunPtr run, qint64) {
    if (!run->summaryOnly()) return;
    sawSummary = window.run() == run;
    window.timeline()->showRange(run->beginNs + 1'000'000, run->beginNs + 3'000'000);
    zoomed = window.timeline()->viewport();
  });
  window.openPath(QString::fromStdString((dir / "run.db").string()));
  ASSERT_TRUE(analysed.wait(30000));
  QCoreApplication::processEvents();
  EXPECT_EQ(loaded.count(), 2);
  EXPECT_TRUE(sawSummary) << "the first frame comes from the summary";
  ASSERT_FALSE(window.run()->summaryOnly());
  EXPECT_EQ(window.timeline()->viewport().startNs, zoomed.startNs);
  EXPECT_EQ(window.timeline()->viewport().nsPerPx, zoomed.nsPerPx);
  EXPECT_EQ(window.tabs()->currentIndex(), MainWindow::kFindingsTab) << "the NaN run opens on its chain";
}

// A run over TPSCOPE_GUI_FULL_LOAD_LIMIT stays on its lane summary (one runLoaded, RunData::windowed). Zoomed in, the
// view reads every span of the time it shows: the frame comes from a window that covers the view, and a click on
// the ops row lands on an op — where the summary holds only blocks of several ops.
TEST(WindowedRun, ZoomedInTheViewReadsAndDrawsEverySpanOfTheTimeItShows) {
  const fs::path dir = scratchDir("windowed-view");
  ASSERT_EQ(writeNestedRun(dir / "run.db", 3), "");
  qputenv("TPSCOPE_GUI_FULL_LOAD_LIMIT", "1000");
  MainWindow window(QString::fromStdString((dir / "settings.ini").string()));
  QSignalSpy loaded(window.loader(), &RunLoader::runLoaded);
  const bool opened = openAnalysed(window, dir / "run.db");
  qunsetenv("TPSCOPE_GUI_FULL_LOAD_LIMIT");
  ASSERT_TRUE(opened);
  EXPECT_EQ(loaded.count(), 1) << "a windowed run is not read whole";
  ASSERT_TRUE(window.run()->windowed);
  window.tabs()->setCurrentIndex(MainWindow::kTimelineTab);
  TimelineView* t = window.timeline();
  // Rank 0's step 30 (row 0 of its main lane: a span as itself in the summary), zoomed to a twentieth of it.
  const TimelineData& summary = *window.run()->timeline;
  const int lane = summary.laneOf(0, 0);
  ASSERT_GE(lane, 0);
  const LaneRow& steps = summary.lanes()[lane].rows[0];
  ASSERT_GT(steps.size(), 30u);
  ASSERT_EQ(steps.weight[30], 1u);
  const int64_t b = steps.begin[30] + (steps.end[30] - steps.begin[30]) * 2 / 5;
  t->showRange(b, b + (steps.end[30] - steps.begin[30]) / 20);
  t->waitForFrame();
  const auto frame = t->latestFrame();
  ASSERT_TRUE(frame);
  ASSERT_TRUE(frame->window) << "zoomed in, the frame is drawn from the spans of a window";
  EXPECT_TRUE(frame->window->covers(t->viewport().startNs, t->viewport().endNs()));
  EXPECT_LT(frame->window->spanCount(), summary.spanCount());
  // Click along the ops row (row 2) until a span is hit: an op, not a block of the summary.
  TimelinePainter p;
  p.viewport = t->viewport();
  QSignalSpy selected(t, &TimelineView::spanSelected);
  QString text;
  for (int x = TimelineLayout::kLabelWidth + 20; x < t->width() - 40 && text.isEmpty(); x += 37) {
    QTest::mouseClick(t, Qt::LeftButton, {}, QPoint(x, t->laneRect(lane).top() + TimelineLayout::kRowHeight * 5 / 2));
    if (!selected.isEmpty() && selected.last().at(0).value<SpanRef>().valid())
      text = t->describeSpan(selected.last().at(0).value<SpanRef>());
  }
  EXPECT_TRUE(text.startsWith("aten::")) << text.toStdString();
  EXPECT_FALSE(text.contains("spans, mostly")) << text.toStdString();
  save(t, "timeline-windowed");
}

// A run of 72 ranks in 9 TP groups: lanes grouped under collapsible headers, all but the first group collapsed on
// open (more than 64 lanes); a click on a header, a jump to a rank and the View menu's actions unfold them.
TEST(GroupedLanes, TpGroupsFoldUnderHeaders) {
  const fs::path dir = scratchDir("grouped-lanes");
  {
    tracedb::CreateOptions o;
    o.overwrite = true;
    o.source = "merge";
    auto w = tracedb::Writer::create(dir / "run.db", o);
    ASSERT_TRUE(w) << w.error();
    ASSERT_TRUE((*w)->setMeta(tracedb::meta_keys::kClockAligned, "1"));
    const uint32_t name = *(*w)->intern("forward");
    for (int r = 0; r < 72; ++r) {
      tracedb::RankInfo info;
      info.rank = r;
      info.worldSize = 72;
      ASSERT_TRUE((*w)->putRank(info));
      ASSERT_TRUE((*w)->addSpan({r, 0, tracedb::SpanKind::Compute, name, 1000 + r, 5000, 0, 0,
                                 tracedb::Phase::Forward, {}}));
    }
    for (int g = 0; g < 9; ++g) {
      std::vector<int> ranks;
      for (int r = 8 * g; r < 8 * g + 8; ++r) ranks.push_back(r);
      ASSERT_TRUE((*w)->putGroup({"tp-" + std::to_string(g), ranks, "gloo"}));
    }
    ASSERT_TRUE((*w)->close());
  }
  MainWindow window(QString::fromStdString((dir / "settings.ini").string()));
  ASSERT_TRUE(openAnalysed(window, dir / "run.db"));
  window.tabs()->setCurrentIndex(MainWindow::kTimelineTab);
  TimelineView* view = window.timeline();
  const TimelineLayout& layout = view->layout();
  ASSERT_EQ(layout.groups.size(), 9u);
  EXPECT_EQ(layout.groups[3].label, "tp-3 · ranks 24–31");
  EXPECT_FALSE(layout.groups[0].collapsed);
  for (size_t g = 1; g < 9; ++g) EXPECT_TRUE(layout.groups[g].collapsed) << "group " << g;
  EXPECT_GT(layout.laneHeight[0], 0);
  EXPECT_EQ(layout.laneHeight[8], 0);
  // The header of group 1 is painted, and a click on it unfolds the group.
  view->waitForFrame();
  const int headerY = TimelineLayout::kRulerHeight + layout.groups[1].top + TimelineLayout::kGroupHeight / 2;
  EXPECT_EQ(view->grab().toImage().pixelColor(view->width() / 2, headerY), QColor(38, 41, 50));
  QTest::mouseClick(view, Qt::LeftButton, {}, QPoint(view->width() / 2, headerY));
  EXPECT_FALSE(view->layout().groups[1].collapsed);
  EXPECT_GT(view->layout().laneHeight[8], 0);
  // A jump to a rank of a folded group unfolds it.
  view->showRange(0, 10000, 70);
  EXPECT_FALSE(view->layout().groups[8].collapsed);
  EXPECT_GT(view->layout().laneHeight[70], 0);
  view->showRange(0, 10000, 0);  // back to the top
  view->waitForFrame();
  save(view, "timeline-lane-groups");
  // View → Collapse all: only the headers are left.
  view->setGroupsCollapsed(true);
  EXPECT_EQ(view->layout().totalHeight, 9 * TimelineLayout::kGroupHeight);
}

// The pipeline view: the measured schedule of a step, passes as numbered blocks on the bubble's shade, the longest
// stage named; a click on a block selects its pass span on the timeline.
TEST(PipelineWindow, ShowsTheMeasuredScheduleAndJumpsToAPass) {
  const fs::path dir = scratchDir("pipeline-window");
  ASSERT_EQ(writePipelineRun(dir / "run.db"), "");
  MainWindow window(QString::fromStdString((dir / "settings.ini").string()));
  ASSERT_TRUE(openAnalysed(window, dir / "run.db"));
  window.tabs()->setCurrentIndex(MainWindow::kPipelineTab);
  QCoreApplication::processEvents();
  PipelineCanvas* canvas = window.pipeline()->canvas();
  const PipelineChart& chart = canvas->chart();
  ASSERT_TRUE(chart.present());
  EXPECT_EQ(chart.rows.size(), 2u);
  const QString headline = window.pipeline()->headline()->text();
  EXPECT_TRUE(headline.contains("1f1b · 2 stages × 4 micro-batches")) << headline.toStdString();
  EXPECT_TRUE(headline.contains("analytic bubble 20.0 %")) << headline.toStdString();
  EXPECT_TRUE(headline.contains("measured over")) << headline.toStdString();
  const QImage image = save(canvas, "pipeline");
  // Stage 0's first pass is forward micro-batch 0 (blue); stage 1 idles at the window's start (the bubble's shade).
  const QRect first = canvas->blockRect(0, 0);
  EXPECT_EQ(image.pixelColor(first.left() + 2, first.top() + 3), QColor(66, 133, 244));
  const QRect window1 = canvas->windowRect(1);
  EXPECT_EQ(image.pixelColor(window1.left() + 2, window1.top() + 3), QColor(96, 56, 60));
  // A click on stage 1's first backward block selects that pass on the timeline.
  size_t backward = 0;
  while (!chart.rows[1].blocks[backward].backward) ++backward;
  const SpanRef span = chart.rows[1].blocks[backward].span;
  QTest::mouseClick(canvas, Qt::LeftButton, {}, canvas->blockRect(1, backward).center());
  EXPECT_EQ(window.tabs()->currentIndex(), MainWindow::kTimelineTab);
  EXPECT_EQ(window.timeline()->selectedSpan(), span);
  EXPECT_TRUE(window.details()->toPlainText().contains("backward mb 0")) << window.details()->toPlainText().toStdString();
}

TEST_F(ViewsTest, BadFileShowsAnErrorDialogAndKeepsTheRun) {
  std::ofstream(dir_ / "garbage.db") << "not a database";
  QSignalSpy failed(window_->loader(), &RunLoader::failed);
  window_->openPath(QString::fromStdString((dir_ / "garbage.db").string()));
  ASSERT_TRUE(failed.wait(10000));
  EXPECT_TRUE(window_->lastError().contains("garbage.db"));
  auto* box = window_->findChild<QMessageBox*>("errorDialog");
  ASSERT_NE(box, nullptr);
  EXPECT_TRUE(box->isVisible());
  EXPECT_TRUE(box->text().contains("garbage.db"));
  save(box, "error-dialog");
  EXPECT_TRUE(window_->run()) << "the previous run stays open";
  box->close();
}

// View → Show critical path: the what-if critical path of the analysis' median step, each stretch outlined on the
// lane it lies on (rank, thread) where the trace has it; off again, nothing of it is drawn.
TEST_F(ViewsTest, CriticalPathOverlayToggles) {
  window_->tabs()->setCurrentIndex(MainWindow::kTimelineTab);
  TimelineView* t = window_->timeline();
  const auto& path = window_->analysis()->whatIf.criticalPath;
  ASSERT_FALSE(path.empty()) << "the fixture run has a critical path";
  EXPECT_EQ(t->criticalPath(), nullptr);  // off by default
  EXPECT_TRUE(t->criticalPathRects().empty());
  const auto& seg = path.front();
  int64_t b = 0, e = 0;
  ASSERT_TRUE(window_->run()->stepWindow(seg.rank, window_->analysis()->whatIf.criticalStep, b, e));
  t->showRange(b, e, seg.rank);
  t->waitForFrame();
  const QImage off = save(t, "timeline-critical-off");

  window_->criticalPathAction()->trigger();
  ASSERT_TRUE(t->showsCriticalPath());
  ASSERT_EQ(t->criticalPath(), &path);
  EXPECT_TRUE(window_->statusBar()->currentMessage().startsWith(
      QString("critical path of step %1: ").arg(window_->analysis()->whatIf.criticalStep)));
  const std::vector<QRectF> rects = t->criticalPathRects();
  ASSERT_EQ(rects.size(), path.size());
  const QImage on = save(t, "timeline-critical-on");
  const QRect lane = t->laneRect(window_->run()->timeline->laneOf(seg.rank, seg.thread));
  const QRect r = rects.front().toAlignedRect();
  EXPECT_GE(r.top(), lane.top());
  EXPECT_LE(r.bottom(), lane.bottom() + 1);
  EXPECT_TRUE(hasColour(on, QRect(r.center().x() - 2, r.top() - 1, 5, 3), palette::kCriticalPath, 6));
  int changed = 0;  // the outline and its tint are drawn over the stretch
  for (int y = r.top(); y <= r.bottom(); ++y)
    for (int x = std::max(r.left(), TimelineLayout::kLabelWidth); x <= std::min(r.right(), on.width() - 1); ++x)
      changed += on.pixel(x, y) != off.pixel(x, y) ? 1 : 0;
  EXPECT_GT(changed, r.width());

  window_->criticalPathAction()->trigger();
  EXPECT_FALSE(t->showsCriticalPath());
  EXPECT_TRUE(t->criticalPathRects().empty());
  t->waitForFrame();
  const QImage again = t->grab().toImage();  // the stretch's pixels as they were before
  int still = 0;
  for (int y = r.top(); y <= r.bottom(); ++y)
    for (int x = std::max(r.left(), TimelineLayout::kLabelWidth); x <= std::min(r.right(), on.width() - 1); ++x)
      still += again.pixel(x, y) != off.pixel(x, y) ? 1 : 0;
  EXPECT_EQ(still, 0);
  EXPECT_FALSE(hasColour(again, QRect(r.center().x() - 2, r.top() - 1, 5, 3), palette::kCriticalPath, 6));
}

// The simulated TP×DP run with a straggler (the analysis tests' run): its path runs from the straggler's work through
// transfers to other ranks; each stretch is outlined on its own rank's lane, left to right in the path's order.
TEST(CriticalPathWindow, StretchesLieOnTheirRanksInTimeOrder) {
  const fs::path dir = scratchDir("critical-path");
  tpscope::testing::RunSpec spec;
  spec.stragglerRank = 1;
  ASSERT_TRUE(tpscope::testing::writeRun(dir / "run.db", spec));
  MainWindow window(QString::fromStdString((dir / "settings.ini").string()));
  ASSERT_TRUE(openAnalysed(window, dir / "run.db"));
  const auto& whatIf = window.analysis()->whatIf;
  ASSERT_GE(whatIf.criticalPath.size(), 3u);
  TimelineView* t = window.timeline();
  int64_t b = 0, e = 0;
  ASSERT_TRUE(window.run()->stepWindow(0, whatIf.criticalStep, b, e));
  t->showRange(b, e);
  window.criticalPathAction()->setChecked(true);
  t->waitForFrame();
  save(t, "timeline-critical-straggler");
  const std::vector<QRectF> rects = t->criticalPathRects();
  ASSERT_EQ(rects.size(), whatIf.criticalPath.size());
  std::set<int> lanes;
  for (size_t i = 0; i < rects.size(); ++i) {
    const auto& seg = whatIf.criticalPath[i];
    const int lane = window.run()->timeline->laneOf(seg.rank, seg.thread);
    ASSERT_GE(lane, 0) << "rank " << seg.rank << " thread " << seg.thread;
    lanes.insert(lane);
    EXPECT_GE(rects[i].top(), t->laneRect(lane).top());
    if (i > 0) {
      EXPECT_GE(rects[i].left(), rects[i - 1].left() - 0.5) << i;
    }
  }
  EXPECT_GE(lanes.size(), 2u);  // across ranks
}

TEST_F(ViewsTest, DesktopHabits) {
  // Recent files, search, shortcuts, drag and drop, window state.
  ASSERT_FALSE(window_->recentFiles().isEmpty());
  EXPECT_TRUE(window_->recentFiles().front().endsWith("run.db"));
  window_->search("layers.1.bwd");
  const SpanRef hit = window_->timeline()->selectedSpan();
  ASSERT_TRUE(hit.valid());
  EXPECT_EQ(window_->run()->timeline->string(window_->run()->timeline->row(hit).name[hit.index]), "layers.1.bwd");
  window_->search("layers.1.bwd");
  EXPECT_NE(window_->timeline()->selectedSpan(), hit) << "Enter again goes to the next match";
  EXPECT_TRUE(window_->shortcutsText().contains("W / S"));

  ASSERT_EQ(writeFixtureRun(dir_ / "dropped.db"), "");
  QMimeData mime;
  mime.setUrls({QUrl::fromLocalFile(QString::fromStdString((dir_ / "dropped.db").string()))});
  QDragEnterEvent enter(QPoint(100, 100), Qt::CopyAction, &mime, Qt::LeftButton, Qt::NoModifier);
  QApplication::sendEvent(window_.get(), &enter);
  EXPECT_TRUE(enter.isAccepted());
  QDropEvent drop(QPointF(100, 100), Qt::CopyAction, &mime, Qt::LeftButton, Qt::NoModifier);
  QSignalSpy loaded(window_->loader(), &RunLoader::runLoaded);
  QApplication::sendEvent(window_.get(), &drop);
  ASSERT_TRUE(loaded.wait(20000));
  EXPECT_TRUE(window_->windowTitle().contains("dropped.db"));

  window_->tabs()->setCurrentIndex(MainWindow::kDesyncTab);
  window_->resize(1111, 777);
  window_->close();
  MainWindow again(QString::fromStdString((dir_ / "settings.ini").string()));
  EXPECT_EQ(again.tabs()->currentIndex(), MainWindow::kDesyncTab);
  EXPECT_EQ(again.size(), QSize(1111, 777));
  EXPECT_TRUE(again.recentFiles().front().endsWith("dropped.db"));
}

// Live: a capture folder is followed; a rank file that appears is shown without the user doing anything.
TEST(LiveWindow, FollowsACaptureFolderAsItGrows) {
  const fs::path dir = scratchDir("live-window");
  ASSERT_EQ(writeRankFile(dir / "rank-0.db", 0, 1'000'000, 0, "forward"), "");
  MainWindow window(QString::fromStdString((dir / "settings.ini").string()));
  QSignalSpy loaded(window.loader(), &RunLoader::runLoaded);
  window.openPath(QString::fromStdString(dir.string()));
  ASSERT_TRUE(loaded.wait(20000));
  ASSERT_TRUE(window.run()->live);
  EXPECT_EQ(window.run()->timeline->lanes().size(), 1u);
  ASSERT_EQ(writeRankFile(dir / "rank-1.db", 1, 1'000'000, 0, "backward"), "");
  ASSERT_TRUE(loaded.wait(15000)) << "the follower reloads within its poll interval";
  EXPECT_EQ(window.run()->timeline->lanes().size(), 2u);
  EXPECT_TRUE(window.windowTitle().contains("capture folder"));
  EXPECT_TRUE(window.liveStall()->isHidden());

  // A live stall line in the folder's journal (capture's watcher, `tpscope watch`): shown while open, listed with
  // the alerts, hidden once it resumed.
  tracedb::AlertRow stall;
  stall.rank = 1;
  stall.step = 2;
  stall.tsNs = 1'500;
  stall.severity = "critical";
  stall.kind = "stall";
  stall.message = "WAITING  tp-0 seq 7 (forward all-reduce): rank 0 blocked 1.6 s; rank 1 has not entered it";
  stall.evidence = R"({"stall":"waiting","group":"tp-0","seq":7})";
  ASSERT_TRUE(analysis::writeStallJournal(dir / "stalls.jsonl", std::vector<tracedb::AlertRow>{stall}, 1'000'000));
  ASSERT_TRUE(loaded.wait(15000)) << "a new journal line reloads the run";
  EXPECT_FALSE(window.liveStall()->isHidden());
  EXPECT_TRUE(window.liveStall()->text().startsWith("WAITING  tp-0 seq 7")) << window.liveStall()->text().toStdString();
  bool listed = false;
  for (const auto& a : window.run()->alerts) listed |= a.kind == "stall" && a.rank == 1 && a.tsNs == 1'500;
  EXPECT_TRUE(listed) << "the stall is one of the run's alerts, on its clock";
  stall.severity = "info";
  stall.message += " [resumed after 2.1 s]";
  ASSERT_TRUE(analysis::writeStallJournal(dir / "stalls.jsonl", std::vector<tracedb::AlertRow>{stall}, 1'000'000));
  ASSERT_TRUE(loaded.wait(15000));
  EXPECT_TRUE(window.liveStall()->isHidden());
}

}  // namespace
}  // namespace tpscope::gui
