// The models over the fixture run (fixture_run.h): loading, bad files, async loading and frames, and each item
// model checked with QAbstractItemModelTester and against the fixture's planted NaN and stuck collective.
#include <gtest/gtest.h>

#include <QAbstractItemModelTester>
#include <QSignalSpy>
#include <QSortFilterProxyModel>
#include <cmath>
#include <fstream>
#include <random>
#include <tuple>

#include "fixture_run.h"
#include "tpscope/gui/breakdown_model.h"
#include "tpscope/gui/collective_model.h"
#include "tpscope/gui/desync_model.h"
#include "tpscope/gui/findings_model.h"
#include "tpscope/gui/frame_scheduler.h"
#include "tpscope/gui/grad_health_model.h"
#include "tpscope/gui/live_follower.h"
#include "tpscope/gui/palette.h"
#include "tpscope/gui/pipeline_model.h"
#include "tpscope/gui/run_loader.h"
#include "tpscope/analysis/summary.h"
#include "tpscope/tracedb/writer.h"

namespace tpscope::gui {
namespace {

namespace fs = std::filesystem;
using namespace tpscope::gui::testing;

class ModelsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(scratchDir("models"));
    ASSERT_EQ(writeFixtureRun(*dir_ / "run.db"), "");
    auto run = loadRun(*dir_ / "run.db");
    ASSERT_TRUE(run) << run.error();
    run_ = new RunPtr(*run);
    auto opened = openRun(*dir_ / "run.db");
    ASSERT_TRUE(opened) << opened.error();
    analysis_ = new AnalysisPtr(std::make_shared<const AnalysisData>(loadAnalysis(**opened)));
  }
  static void TearDownTestSuite() {
    delete run_;
    delete analysis_;
    delete dir_;
  }
  static fs::path* dir_;
  static RunPtr* run_;
  static AnalysisPtr* analysis_;
  const RunData& run() { return **run_; }
};
fs::path* ModelsTest::dir_ = nullptr;
RunPtr* ModelsTest::run_ = nullptr;
AnalysisPtr* ModelsTest::analysis_ = nullptr;

TEST_F(ModelsTest, LoadsLanesPerRankAndThread) {
  const TimelineData& t = *run().timeline;
  ASSERT_EQ(t.lanes().size(), 8u);  // 4 ranks × (main, stream 7)
  EXPECT_EQ(t.lanes()[0].label, "rank 0 · main");
  EXPECT_EQ(t.lanes()[1].label, "rank 0 · stream 7");
  EXPECT_GE(t.lanes()[0].rows.size(), 2u) << "step spans hold the phase spans";
  EXPECT_EQ(run().rankIds(), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(run().collectives.size(), 2u * 4 * kFixtureRanks + 3);
  EXPECT_FALSE(run().live);
  EXPECT_EQ(run().beginNs, 0);
  int64_t b = 0, e = 0;
  ASSERT_TRUE(run().stepWindow(2, 1, b, e));
  EXPECT_EQ(b, kStepNs);
  EXPECT_TRUE(analysis_ && (*analysis_)->errors.empty()) << (*analysis_)->errors.front();
}

TEST_F(ModelsTest, BadFilesAreErrorsNamingTheFile) {
  const fs::path dir = scratchDir("bad");
  std::ofstream(dir / "empty.db").close();
  std::ofstream(dir / "text.db") << "this is not a database\n";
  {
    std::ifstream in(*dir_ / "run.db", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    std::ofstream(dir / "truncated.db", std::ios::binary) << bytes.substr(0, bytes.size() / 3);
  }
  fs::create_directories(dir / "empty-folder");
  for (const char* name : {"missing.db", "empty.db", "text.db", "truncated.db", "empty-folder"}) {
    auto r = loadRun(dir / name);
    ASSERT_FALSE(r) << name;
    EXPECT_NE(r.error().find(name), std::string::npos) << r.error();
  }
}

TEST_F(ModelsTest, LoaderSignalsRunThenAnalysisOrFailure) {
  RunLoader loader;
  QSignalSpy loaded(&loader, &RunLoader::runLoaded);
  QSignalSpy analysed(&loader, &RunLoader::analysisLoaded);
  QSignalSpy failed(&loader, &RunLoader::failed);
  loader.load(QString::fromStdString((*dir_ / "run.db").string()));
  ASSERT_TRUE(analysed.wait(20000));
  ASSERT_EQ(loaded.count(), 1);
  EXPECT_EQ(failed.count(), 0);
  EXPECT_EQ(loaded.at(0).at(0).value<RunPtr>()->timeline->spanCount(), run().timeline->spanCount());
  loader.load("/nonexistent/run.db");
  ASSERT_TRUE(failed.wait(10000));
  EXPECT_TRUE(failed.at(0).at(1).toString().contains("/nonexistent/run.db"));
  // A superseded load reports nothing.
  loader.load(QString::fromStdString((*dir_ / "run.db").string()), false);
  loader.load("/nonexistent/other.db");
  ASSERT_TRUE(failed.wait(10000));
  loader.waitForDone();
  QCoreApplication::processEvents();
  EXPECT_EQ(loaded.count(), 1);
}

// A run file with summaries (as merge writes it) opens on its lane summary; every span follows with the same tables.
TEST_F(ModelsTest, ASummarisedRunOpensOnItsSummaryThenEverySpan) {
  const fs::path plain = *dir_ / "run.db", summarised = *dir_ / "summarised.db";
  fs::copy_file(plain, summarised, fs::copy_options::overwrite_existing);
  ASSERT_TRUE(analysis::writeRunSummary(summarised));
  auto none = loadRunSummary(plain);
  ASSERT_TRUE(none) << none.error();
  EXPECT_EQ(*none, nullptr) << "a file without a lane summary opens by reading its spans";

  auto first = loadRunSummary(summarised);
  ASSERT_TRUE(first) << first.error();
  ASSERT_NE(*first, nullptr);
  const RunData& s = **first;
  EXPECT_TRUE(s.summaryOnly());
  EXPECT_EQ(s.timeline->spanCount(), run().timeline->spanCount());
  EXPECT_EQ(s.beginNs, run().beginNs);
  EXPECT_EQ(s.endNs, run().endNs);
  EXPECT_EQ(s.collectives.size(), run().collectives.size());
  ASSERT_EQ(s.timeline->lanes().size(), run().timeline->lanes().size());
  for (size_t l = 0; l < s.timeline->lanes().size(); ++l)
    EXPECT_EQ(s.timeline->lanes()[l].rows.size(), run().timeline->lanes()[l].rows.size()) << "lane " << l;

  LoadOptions options;
  options.tablesFrom = *first;
  auto every = loadRun(summarised, options);
  ASSERT_TRUE(every) << every.error();
  const RunData& e = **every;
  EXPECT_FALSE(e.summaryOnly());
  EXPECT_EQ(e.timeline->spanCount(), run().timeline->spanCount());
  EXPECT_EQ(e.collectives.size(), run().collectives.size());
  EXPECT_EQ(e.alerts.size(), run().alerts.size());
  EXPECT_EQ(e.gradStats.size(), run().gradStats.size());
  EXPECT_EQ(e.meta.at("run_id"), run().meta.at("run_id"));
  EXPECT_EQ(e.meta.at("lane_summary.spans"), std::to_string(run().timeline->spanCount()));
  EXPECT_FALSE(writeTimelineCache(s)) << "a summary is never cached as the timeline";

  RunLoader loader;
  QSignalSpy loaded(&loader, &RunLoader::runLoaded);
  QSignalSpy analysed(&loader, &RunLoader::analysisLoaded);
  loader.load(QString::fromStdString(summarised.string()));
  ASSERT_TRUE(analysed.wait(20000));
  ASSERT_EQ(loaded.count(), 2);
  EXPECT_TRUE(loaded.at(0).at(0).value<RunPtr>()->summaryOnly());
  EXPECT_FALSE(loaded.at(1).at(0).value<RunPtr>()->summaryOnly());
  EXPECT_EQ(loaded.at(1).at(0).value<RunPtr>()->timeline->spanCount(), run().timeline->spanCount());
}

// The pipeline view's chart: a row per stage with the measured passes of one step, the step's window, the stage
// with the most pass time; computed here from the fixture's own pass list.
TEST(PipelineChartTest, StagesShowTheirMeasuredPassesAndTheLongestStage) {
  const fs::path dir = scratchDir("pipeline-model");
  ASSERT_EQ(writePipelineRun(dir / "run.db"), "");
  auto run = loadRun(dir / "run.db");
  ASSERT_TRUE(run) << run.error();
  const PipelineChart chart = pipelineChart(**run, 1);
  ASSERT_TRUE(chart.present());
  EXPECT_EQ(chart.schedule, "1f1b");
  EXPECT_EQ(chart.stages, 2);
  EXPECT_EQ(chart.microbatches, 4);
  EXPECT_EQ(chart.steps, (std::vector<int>{0, 1}));
  EXPECT_EQ(chart.step, 1);
  int64_t first = INT64_MAX, last = INT64_MIN;
  std::array<int64_t, 2> busy{};
  for (const auto& p : kPipelinePasses) {
    first = std::min(first, kPipelineStepNs + p.beginNs);
    last = std::max(last, kPipelineStepNs + p.beginNs + p.durNs);
    busy[static_cast<size_t>(p.stage)] += p.durNs;  // a stage's passes do not overlap
  }
  EXPECT_EQ(chart.beginNs, first);
  EXPECT_EQ(chart.endNs, last);
  ASSERT_EQ(chart.rows.size(), 2u);
  for (int stage = 0; stage < 2; ++stage) {
    const PipelineRow& row = chart.rows[static_cast<size_t>(stage)];
    EXPECT_EQ(row.stage, stage);
    EXPECT_EQ(row.rank, stage);
    EXPECT_EQ(row.busyNs, busy[static_cast<size_t>(stage)]);
    ASSERT_EQ(row.blocks.size(), 8u);
    for (size_t i = 1; i < row.blocks.size(); ++i) EXPECT_LE(row.blocks[i - 1].beginNs, row.blocks[i].beginNs);
    for (const PipelineBlock& b : row.blocks) {
      const auto want = std::find_if(kPipelinePasses.begin(), kPipelinePasses.end(), [&](const PipelinePass& p) {
        return p.stage == stage && kPipelineStepNs + p.beginNs == b.beginNs;
      });
      ASSERT_NE(want, kPipelinePasses.end());
      EXPECT_EQ(b.backward, want->backward);
      EXPECT_EQ(b.microbatch, want->microbatch);
      EXPECT_EQ(b.endNs - b.beginNs, want->durNs);
      const TimelineData& t = *(*run)->timeline;
      EXPECT_EQ(t.string(t.row(b.span).name[b.span.index]),
                (b.backward ? "backward mb " : "forward mb ") + std::to_string(b.microbatch));
    }
  }
  EXPECT_EQ(chart.longestStage, 1);
  EXPECT_EQ(pipelineChart(**run, 0).step, 0);
  EXPECT_EQ(pipelineChart(**run, 7).step, 1) << "an unknown step shows the middle one";
}

TEST_F(ModelsTest, ARunWithoutPipelineHasNoChart) { EXPECT_FALSE(pipelineChart(run()).present()); }

TEST_F(ModelsTest, FrameSchedulerDeliversTheNewestRequest) {
  FrameScheduler scheduler;
  scheduler.setTimeline(run().timeline);
  QSignalSpy ready(&scheduler, &FrameScheduler::frameReady);
  Viewport a{0, 1000.0, 800}, b{kStepNs, 50.0, 800}, c{0, 40000.0, 800};
  scheduler.request(a);
  scheduler.request(b);
  scheduler.request(c);
  while (!scheduler.idle()) ASSERT_TRUE(ready.wait(5000));
  ASSERT_TRUE(scheduler.latest());
  EXPECT_EQ(scheduler.latest()->viewport.nsPerPx, c.nsPerPx);
  EXPECT_LE(ready.count(), 2) << "b was superseded by c while a ran";
  const Frame want = computeFrame(*run().timeline, c);
  EXPECT_EQ(scheduler.latest()->items, want.items);
  EXPECT_GT(want.itemCount(), 8u);
}

TEST_F(ModelsTest, FindingsModel) {
  FindingsModel model;
  QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::Fatal);
  model.setRun(*run_, *analysis_);
  ASSERT_GT(model.rowCount(), 0);
  // Most severe first; the recorded alert is there with its rank, step and time.
  for (int r = 1; r < model.rowCount(); ++r)
    EXPECT_LE(model.index(r - 1, 0).data(FindingsModel::SeverityRole).toInt(),
              model.index(r, 0).data(FindingsModel::SeverityRole).toInt());
  int alertRow = -1, hangRow = -1, nanRow = -1;
  for (int r = 0; r < model.rowCount(); ++r) {
    const QString kind = model.index(r, FindingsModel::kKind).data().toString();
    if (kind == "nonfinite_grad") alertRow = r;
    if (kind == "hang") hangRow = r;
    if (kind == "nan_origin") nanRow = r;
  }
  ASSERT_GE(alertRow, 0);
  EvidenceTarget t = model.evidenceTarget(alertRow);
  EXPECT_EQ(t.rank, kNanRank);
  EXPECT_EQ(t.step, kNanStep);
  ASSERT_TRUE(t.timeNs);
  EXPECT_EQ(*t.timeNs, kNanStep * kStepNs + 5'000'000);
  ASSERT_GE(nanRow, 0) << "diagnose finds the NaN origin";
  EXPECT_EQ(model.index(nanRow, FindingsModel::kRank).data().toInt(), kNanRank);
  ASSERT_GE(hangRow, 0) << "diagnose finds the hang";
  t = model.evidenceTarget(hangRow);
  EXPECT_EQ(t.group, kStuckGroup);
  EXPECT_EQ(t.seq, kStuckSeq);
  ASSERT_TRUE(t.timeNs);
  EXPECT_GE(*t.timeNs, (kFixtureSteps - 1) * kStepNs);
  EXPECT_FALSE(model.detailsText(hangRow).isEmpty());
  model.setRun(nullptr, nullptr);
  EXPECT_EQ(model.rowCount(), 0);
}

TEST_F(ModelsTest, CollectiveModelJoinsRanksAndSortsNumerically) {
  CollectiveModel model;
  QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::Fatal);
  model.setRun(*run_);
  ASSERT_EQ(model.rowCount(), static_cast<int>(kStuckSeq + 1));
  const int stuck = model.rowOf(kStuckGroup, kStuckSeq);
  ASSERT_GE(stuck, 0);
  const CollectiveSummary& s = model.summary(stuck);
  EXPECT_TRUE(s.stuck());
  EXPECT_EQ(s.entered, 3);
  EXPECT_EQ(s.completed, 0);
  EXPECT_EQ(s.groupSize, 4);
  EXPECT_TRUE(model.index(stuck, 0).data(CollectiveModel::StuckRole).toBool());
  const CollectiveSummary& ok = model.summary(model.rowOf("tp-0", 0));
  EXPECT_FALSE(ok.stuck());
  EXPECT_EQ(ok.lastRank, 3) << "rank 3 arrives last";
  EXPECT_EQ(ok.latencyNs, 300'000);
  EXPECT_EQ(ok.bytes, 8192);
  EXPECT_NEAR(ok.algbwGbps, 8192.0 / 300'000, 1e-12);
  EXPECT_NEAR(ok.busbwGbps, ok.algbwGbps * 2 * 3 / 4, 1e-12);
  // Sorting by skew puts numbers in numeric order.
  QSortFilterProxyModel proxy;
  proxy.setSourceModel(&model);
  proxy.setSortRole(CollectiveModel::SortRole);
  proxy.sort(CollectiveModel::kSkew, Qt::DescendingOrder);
  for (int r = 1; r < proxy.rowCount(); ++r)
    EXPECT_GE(proxy.index(r - 1, CollectiveModel::kSkew).data(CollectiveModel::SortRole).toLongLong(),
              proxy.index(r, CollectiveModel::kSkew).data(CollectiveModel::SortRole).toLongLong());
}

TEST_F(ModelsTest, GradHealthFlagsTheNanCell) {
  GradHealthModel model;
  QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::Fatal);
  QSignalSpy reset(&model, &QAbstractItemModel::modelReset);
  model.setRun(*run_);
  EXPECT_EQ(reset.count(), 1);
  model.setAnalysis(*analysis_);  // the first non-finite value is the analysis' origin finding
  EXPECT_EQ(model.firstNonFiniteStep(), kNanStep);
  EXPECT_EQ(model.step(), kNanStep);
  ASSERT_EQ(model.rowCount(), kFixtureRanks);
  ASSERT_EQ(model.columnCount(), kFixtureLayers);
  const QModelIndex nan = model.index(kNanRank, kNanLayer);
  EXPECT_TRUE(nan.data(GradHealthModel::NonFiniteRole).toBool());
  EXPECT_EQ(nan.data(GradHealthModel::NanCountRole).toLongLong(), 3);
  EXPECT_EQ(nan.data().toString(), "NaN");
  EXPECT_EQ(nan.data(Qt::BackgroundRole).value<QBrush>().color(), palette::kNonFinite);
  EXPECT_EQ(nan.data(Qt::ForegroundRole).value<QBrush>().color(), palette::textOn(palette::kNonFinite));
  EXPECT_EQ(nan.data(GradHealthModel::RankRole).toInt(), kNanRank);
  EXPECT_EQ(nan.data(GradHealthModel::StepRole).toInt(), kNanStep);
  EXPECT_EQ(nan.data(GradHealthModel::LayerRole).toInt(), kNanLayer);
  EXPECT_FALSE(model.index(0, kNanLayer).data(GradHealthModel::NonFiniteRole).toBool());
  EXPECT_TRUE(model.index(0, 0).data(GradHealthModel::NonFiniteRole).toBool()) << "spread through the all-reduce";
  model.showStep(0);
  for (int r = 0; r < model.rowCount(); ++r)
    for (int c = 0; c < model.columnCount(); ++c)
      EXPECT_FALSE(model.index(r, c).data(GradHealthModel::NonFiniteRole).toBool());
  EXPECT_EQ(model.headerData(1, Qt::Horizontal, Qt::DisplayRole).toString(), "layer 1");
  EXPECT_EQ(model.headerData(2, Qt::Vertical, Qt::DisplayRole).toString(), "rank 2");
  model.showParam("layers.1.mlp.fc2.weight");
  EXPECT_EQ(model.mode(), GradHealthModel::Mode::StepByRank);
  ASSERT_EQ(model.rowCount(), 2);  // steps 0 and 1 have gradients
  ASSERT_EQ(model.columnCount(), kFixtureRanks);
  EXPECT_TRUE(model.index(kNanStep, kNanRank).data(GradHealthModel::NonFiniteRole).toBool());
  EXPECT_FALSE(model.index(kNanStep, 0).data(GradHealthModel::NonFiniteRole).toBool());
  EXPECT_EQ(model.headerData(kNanStep, Qt::Vertical, Qt::DisplayRole).toString(), "step 1");
}

TEST_F(ModelsTest, DesyncMatrixFlagsStuckSeqAndMissingRank) {
  DesyncModel model;
  QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::Fatal);
  model.setAnalysis(*analysis_);
  ASSERT_NE(model.currentGroup(), nullptr);
  EXPECT_EQ(model.currentGroup()->group, kStuckGroup);
  ASSERT_TRUE(model.currentGroup()->stuckSeq);
  EXPECT_EQ(*model.currentGroup()->stuckSeq, kStuckSeq);
  ASSERT_EQ(model.rowCount(), kFixtureRanks);
  for (int r = 0; r < model.rowCount(); ++r) {
    const int rank = model.index(r, 0).data(DesyncModel::RankRole).toInt();
    const auto st = static_cast<DesyncModel::Status>(model.index(r, 0).data(DesyncModel::StatusRole).toInt());
    EXPECT_EQ(st, rank == kMissingRank ? DesyncModel::Status::Missing : DesyncModel::Status::Waiting) << rank;
    EXPECT_EQ(model.index(r, DesyncModel::kLastEnqueued).data().toLongLong(),
              rank == kMissingRank ? kStuckSeq - 1 : kStuckSeq);
  }
  EXPECT_EQ(model.index(kMissingRank, DesyncModel::kRank).data(Qt::BackgroundRole).value<QBrush>().color(),
            palette::kStuck);
  EXPECT_FALSE(model.explanation().isEmpty());
  EXPECT_TRUE(model.groupNames().join(",").contains("tp-0"));
  const int healthy = static_cast<int>(model.groupNames().indexOf("dp-0"));
  if (healthy >= 0) {
    model.setGroup(healthy);
    EXPECT_TRUE(model.explanation().isEmpty());
  }
}

TEST_F(ModelsTest, BreakdownSharesSumToTheStep) {
  BreakdownModel model;
  QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::Fatal);
  model.setAnalysis(*analysis_);
  ASSERT_GE(model.rowCount(), kFixtureRanks * (kFixtureSteps - 1));
  for (int r = 0; r < model.rowCount(); ++r) {
    double sum = 0;
    for (int c : {BreakdownModel::kCompute, BreakdownModel::kExposedComm, BreakdownModel::kOther, BreakdownModel::kIdle})
      sum += model.index(r, c).data(BreakdownModel::SortRole).toDouble();
    EXPECT_NEAR(sum, 100.0, 1e-6);
    EXPECT_GT(model.index(r, BreakdownModel::kStepMs).data(BreakdownModel::SortRole).toLongLong(), 0);
  }
}

// The timeline cache: written once, then read instead of the span table; a damaged or stale cache is ignored.
TEST(TimelineCache, RoundTripAndFallbacks) {
  const fs::path dir = scratchDir("cache");
  ASSERT_EQ(writeFixtureRun(dir / "run.db"), "");
  auto first = loadRun(dir / "run.db");
  ASSERT_TRUE(first) << first.error();
  EXPECT_FALSE((*first)->timelineFromCache);
  ASSERT_TRUE(writeTimelineCache(**first));
  const fs::path cache = dir / "run.db.tpscope-gui-cache";
  ASSERT_TRUE(fs::exists(cache));
  auto second = loadRun(dir / "run.db");
  ASSERT_TRUE(second) << second.error();
  EXPECT_TRUE((*second)->timelineFromCache);
  const TimelineData& a = *(*first)->timeline;
  const TimelineData& b = *(*second)->timeline;
  ASSERT_EQ(a.lanes().size(), b.lanes().size());
  EXPECT_EQ(a.strings(), b.strings());
  for (size_t l = 0; l < a.lanes().size(); ++l) {
    EXPECT_EQ(a.lanes()[l].label, b.lanes()[l].label);
    ASSERT_EQ(a.lanes()[l].rows.size(), b.lanes()[l].rows.size());
    for (size_t d = 0; d < a.lanes()[l].rows.size(); ++d) {
      const LaneRow& x = a.lanes()[l].rows[d];
      const LaneRow& y = b.lanes()[l].rows[d];
      EXPECT_EQ(x.begin, y.begin);
      EXPECT_EQ(x.end, y.end);
      EXPECT_EQ(x.name, y.name);
      EXPECT_EQ(x.kind, y.kind);
      EXPECT_EQ(x.kindPrefix, y.kindPrefix);
    }
  }
  EXPECT_EQ((*second)->beginNs, (*first)->beginNs);
  EXPECT_EQ((*second)->endNs, (*first)->endNs);
  LoadOptions noCache;
  noCache.useCache = false;
  EXPECT_FALSE((*loadRun(dir / "run.db", noCache))->timelineFromCache);
  // Truncated cache: ignored.
  fs::resize_file(cache, fs::file_size(cache) / 2);
  auto third = loadRun(dir / "run.db");
  ASSERT_TRUE(third) << third.error();
  EXPECT_FALSE((*third)->timelineFromCache);
  EXPECT_EQ((*third)->timeline->spanCount(), a.spanCount());
  // A rewritten run makes the cache stale.
  ASSERT_TRUE(writeTimelineCache(**third));
  ASSERT_EQ(writeFixtureRun(dir / "run.db"), "");
  fs::last_write_time(dir / "run.db", fs::last_write_time(dir / "run.db") + std::chrono::seconds(5));
  EXPECT_FALSE((*loadRun(dir / "run.db"))->timelineFromCache);
}

// A capture folder of rank files with different epochs and clock offsets loads aligned, and the follower notices
// a new rank file.
TEST(LiveFolder, AlignsRankFilesAndNoticesGrowth) {
  const fs::path dir = scratchDir("live");
  auto writeRank = [&](int rank, int64_t epoch, int64_t offset) {
    ASSERT_EQ(writeRankFile(dir / ("rank-" + std::to_string(rank) + ".db"), rank, epoch, offset,
                            rank == 0 ? "forward" : "backward"),
              "");
  };
  writeRank(0, 1'000'000, 0);
  LiveFollower follower;
  follower.follow(QString::fromStdString(dir.string()), 50);
  EXPECT_FALSE(follower.poll());
  writeRank(1, 1'000'300, 200);
  EXPECT_TRUE(follower.poll());
  QSignalSpy changed(&follower, &LiveFollower::changed);
  std::ofstream(dir / "rank-1.db", std::ios::app) << "x";  // growth
  EXPECT_TRUE(changed.wait(2000));

  fs::remove(dir / "rank-1.db");
  writeRank(1, 1'000'300, 200);
  auto run = loadRun(dir);
  ASSERT_TRUE(run) << run.error();
  EXPECT_TRUE((*run)->live);
  const TimelineData& t = *(*run)->timeline;
  ASSERT_EQ(t.lanes().size(), 2u);
  EXPECT_EQ(t.lanes()[0].rows[0].begin[0], 1000);
  EXPECT_EQ(t.lanes()[1].rows[0].begin[0], 1000 + 300 + 200) << "epoch difference plus clock offset";
  EXPECT_EQ(t.string(t.lanes()[1].rows[0].name[0]), "backward") << "names re-interned across files";
}

// The views and the analysis of a capture folder read one merge of its rank files, made once and removed with the
// last reference to the opened run.
TEST(LiveFolder, ViewsAndAnalysisReadOneMerge) {
  const fs::path dir = scratchDir("one-merge");
  ASSERT_EQ(writeRankFile(dir / "rank-0.db", 0, 1'000'000, 0, "forward"), "");
  ASSERT_EQ(writeRankFile(dir / "rank-1.db", 1, 1'000'300, 200, "backward"), "");
  auto opened = openRun(dir);
  ASSERT_TRUE(opened) << opened.error();
  const OpenedRun& file = **opened;
  ASSERT_TRUE(file.merged());
  EXPECT_TRUE(file.live);
  EXPECT_EQ(file.files, traceFilesOf(dir));
  const fs::path merge = file.file;
  EXPECT_TRUE(fs::exists(merge));
  auto run = loadRun(file);
  ASSERT_TRUE(run) << run.error();
  EXPECT_EQ((*run)->files, file.files);
  ASSERT_EQ((*run)->timeline->lanes().size(), 2u);
  EXPECT_EQ((*run)->timeline->lanes()[1].rows[0].begin[0], 1000 + 300 + 200);
  const AnalysisData analysis = loadAnalysis(file);
  EXPECT_EQ(analysis.info.ranks.size(), 2u);
  opened = tracedb::Status::error("closed");
  EXPECT_FALSE(fs::exists(merge)) << "the merge goes with the opened run";
}

// A run over the full-load limit opens on its summary only (RunData::windowed); a window read from the file then
// holds, row by row, exactly the spans the full timeline has overlapping it — checked against loadRun of the same
// file at random windows from a hundredth of a step to a fifth of the run — and a frame inside the window is the
// frame the full timeline draws.
TEST(WindowedRun, AWindowHoldsEverySpanThatOverlapsItAsTheFullTimelineDoes) {
  const fs::path path = scratchDir("windowed-model") / "run.db";
  ASSERT_EQ(writeNestedRun(path, 7), "");
  LoadOptions small;
  small.fullLoadLimit = 1000;
  auto summary = loadRunSummary(path, small);
  ASSERT_TRUE(summary) << summary.error();
  ASSERT_NE(*summary, nullptr);
  const RunData& s = **summary;
  ASSERT_TRUE(s.windowed);
  ASSERT_TRUE(s.summaryOnly());
  EXPECT_FALSE(loadRunSummary(path)->get()->windowed) << "under the default limit a run is read whole";
  LoadOptions plain;
  plain.useCache = false;
  auto full = loadRun(path, plain);
  ASSERT_TRUE(full) << full.error();
  const TimelineData& f = *(*full)->timeline;
  ASSERT_GT(f.spanCount(), 15'000u);
  ASSERT_EQ(s.timeline->lanes().size(), f.lanes().size());

  std::mt19937_64 rng(99);
  const int64_t extent = f.endNs() - f.beginNs();
  int compared = 0, framesCompared = 0, beganBefore = 0;
  for (int trial = 0; trial < 24; ++trial) {
    const int64_t width = std::max<int64_t>(100, static_cast<int64_t>(
                                                     extent * std::pow(10.0, -std::uniform_real_distribution<>(0.7, 4.5)(rng))));
    const int64_t a = f.beginNs() + std::uniform_int_distribution<int64_t>(0, extent - width)(rng), b = a + width;
    auto window = loadWindow(s, a, b, 2);
    ASSERT_TRUE(window) << window.error();
    const TimelineData& w = **window;
    EXPECT_TRUE(w.covers(a, b));
    EXPECT_FALSE(w.covers(a - 1, b));
    ASSERT_EQ(w.lanes().size(), f.lanes().size());
    for (size_t l = 0; l < f.lanes().size(); ++l) {
      EXPECT_EQ(w.lanes()[l].rank, f.lanes()[l].rank);
      EXPECT_EQ(w.lanes()[l].thread, f.lanes()[l].thread);
      const size_t rows = std::max(w.lanes()[l].rows.size(), f.lanes()[l].rows.size());
      for (size_t d = 0; d < rows; ++d) {
        using Key = std::tuple<int64_t, int64_t, std::string, int32_t, int16_t, uint8_t, uint8_t>;
        auto keys = [&](const TimelineData& t, bool filter) {
          std::vector<Key> out;
          if (d >= t.lanes()[l].rows.size()) return out;
          const LaneRow& r = t.lanes()[l].rows[d];
          for (size_t i = 0; i < r.size(); ++i)
            if (!filter || (r.begin[i] < b && (r.end[i] > a || r.begin[i] >= a)))
              out.emplace_back(r.begin[i], r.end[i], t.string(r.name[i]), r.step[i], r.layer[i], r.kind[i], r.phase[i]);
          return out;
        };
        const auto expected = keys(f, true);
        const auto got = keys(w, false);
        ASSERT_EQ(got, expected) << "window [" << a << ", " << b << ") lane " << l << " row " << d;
        for (const Key& k : expected) beganBefore += std::get<0>(k) < a;
        compared += static_cast<int>(expected.size());
      }
    }
    // A frame well inside the window, zoomed in past the full timeline's coarsest level: the same picture.
    Viewport vp;
    vp.widthPx = 800;
    vp.startNs = a + width / 4;
    vp.nsPerPx = static_cast<double>(width) / 2 / vp.widthPx;
    if (f.levelFor(vp.nsPerPx) >= 0) continue;
    const Frame fromWindow = computeFrame(w, vp), fromFull = computeFrame(f, vp);
    ASSERT_EQ(fromWindow.items.size(), fromFull.items.size());
    for (size_t l = 0; l < fromFull.items.size(); ++l)
      for (size_t d = 0; d < fromFull.items[l].size(); ++d) {
        const auto& x = fromFull.items[l][d];
        const auto& y = d < fromWindow.items[l].size() ? fromWindow.items[l][d] : std::vector<DrawItem>{};
        ASSERT_EQ(x.size(), y.size()) << "lane " << l << " row " << d;
        for (size_t i = 0; i < x.size(); ++i) {
          EXPECT_EQ(std::tie(x[i].beginNs, x[i].endNs, x[i].count, x[i].kind, x[i].merged),
                    std::tie(y[i].beginNs, y[i].endNs, y[i].count, y[i].kind, y[i].merged));
        }
      }
    ++framesCompared;
  }
  EXPECT_GT(compared, 1000);
  EXPECT_GT(beganBefore, 24) << "spans that began before the window (the whole-run span at least) are in it";
  EXPECT_GT(framesCompared, 5);
  // The summary's estimate of a window bounds what is read: the weights of the entries overlapping it.
  EXPECT_EQ(s.timeline->weightIn(f.beginNs(), f.endNs() + 1), f.spanCount());
  auto wrong = loadWindow(**full, 0, 10);
  EXPECT_FALSE(wrong) << "only a run opened from its summary is read by windows";
}

}  // namespace
}  // namespace tpscope::gui
