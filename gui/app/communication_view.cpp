#include "communication_view.h"

#include <QHeaderView>
#include <QSplitter>
#include <QVBoxLayout>
#include <QtCharts/QBarCategoryAxis>
#include <QtCharts/QBarSet>
#include <QtCharts/QStackedBarSeries>
#include <QtCharts/QValueAxis>

#include "tpscope/gui/palette.h"

namespace tpscope::gui {

CommunicationView::CommunicationView(QWidget* parent) : QWidget(parent) {
  auto* layout = new QVBoxLayout(this);
  overhead_ = new QLabel(this);
  overhead_->setWordWrap(true);
  overhead_->setTextFormat(Qt::RichText);
  layout->addWidget(overhead_);
  auto* split = new QSplitter(Qt::Vertical, this);
  chartView_ = new QChartView(new QChart, split);
  chartView_->setRenderHint(QPainter::Antialiasing);
  chartView_->setMinimumHeight(220);
  table_ = new QTableView(split);
  proxy_.setSourceModel(&collectives_);
  proxy_.setSortRole(CollectiveModel::SortRole);
  table_->setModel(&proxy_);
  table_->setSortingEnabled(true);
  table_->sortByColumn(CollectiveModel::kSeq, Qt::AscendingOrder);
  table_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  table_->setSelectionBehavior(QAbstractItemView::SelectRows);
  table_->verticalHeader()->setVisible(false);
  table_->horizontalHeader()->setStretchLastSection(true);
  split->addWidget(chartView_);
  split->addWidget(table_);
  split->setStretchFactor(0, 3);
  split->setStretchFactor(1, 2);
  layout->addWidget(split, 1);
  connect(table_, &QTableView::doubleClicked, this, [this](const QModelIndex& index) {
    const auto& s = collectives_.summary(proxy_.mapToSource(index).row());
    emit showCollective(s.group, s.seq);
  });
}

void CommunicationView::setRun(RunPtr run) {
  collectives_.setRun(std::move(run));
  table_->resizeColumnsToContents();
}

void CommunicationView::setAnalysis(AnalysisPtr analysis) {
  analysis_ = std::move(analysis);
  breakdown_.setAnalysis(analysis_);
  const analysis::Breakdown* b = breakdown_.breakdown();
  if (!b || b->run.stepNs == 0) {
    overhead_->setText(analysis_ ? "No step time recorded." : "Analysing…");
  } else {
    const auto& t = b->run;
    QString text = QString("<span style='font-size:15pt'><b>Communication overhead %1 %</b></span> of step time is "
                           "communication that no compute overlaps · communication in total %2 % · compute %3 % · "
                           "other %4 % · idle %5 %")
                       .arg(t.commOverheadPct(), 0, 'f', 1)
                       .arg(t.pct(t.commNs), 0, 'f', 1)
                       .arg(t.pct(t.computeNs), 0, 'f', 1)
                       .arg(t.pct(t.otherNs), 0, 'f', 1)
                       .arg(t.pct(t.idleNs), 0, 'f', 1);
    // A straggler is what diagnose names (significant and material); otherwise arrival order is chance.
    const analysis::Finding* straggler = nullptr;
    for (const auto& f : analysis_->findings)
      if (f.kind == analysis::FindingKind::Straggler && straggler == nullptr) straggler = &f;
    if (straggler != nullptr)
      text += "<br>Straggler: " + QString::fromStdString(straggler->message).toHtmlEscaped() + ".";
    else if (!analysis_->collectives.stragglers.ranks.empty())
      text += "<br>No straggler: who arrives last at the collectives is consistent with chance.";
    const auto& tp = analysis_->collectives.tp;
    if (tp.haveModel) {
      const bool sp = tp.model.sequenceParallel;
      text += QString("<br>TP %1 per group per step: %2 measured, %3 expected by the model of the config%4.")
                  .arg(sp ? "all-gathers + reduce-scatters" : "all-reduces of b·s·h elements")
                  .arg(sp ? tp.measuredAllGatherPerStep + tp.measuredReduceScatterPerStep
                          : tp.measuredModelSizedPerStep,
                       0, 'f', 1)
                  .arg(sp ? tp.expectedAllGatherPerStep + tp.expectedReduceScatterPerStep : tp.expectedPerStep)
                  .arg(tp.matches ? " — matches" : " — does not match");
    }
    overhead_->setText(text);
  }
  rebuildChart();
}

void CommunicationView::rebuildChart() {
  QChart* chart = chartView_->chart();
  chart->removeAllSeries();
  for (QAbstractAxis* axis : chart->axes()) {
    chart->removeAxis(axis);
    delete axis;
  }
  chart->setTitle("Time per rank and step (ms)");
  chart->setTheme(QChart::ChartThemeDark);
  const analysis::Breakdown* b = breakdown_.breakdown();
  if (!b || b->steps.empty()) return;
  auto* compute = new QBarSet("compute");
  auto* exposed = new QBarSet("exposed comm");
  auto* other = new QBarSet("other");
  auto* idle = new QBarSet("idle");
  compute->setColor(palette::kind(tracedb::SpanKind::Compute));  // the HTML report's breakdown colours
  exposed->setColor(palette::kind(tracedb::SpanKind::Comm));
  other->setColor(palette::kind(tracedb::SpanKind::Data));
  idle->setColor(QColor(110, 110, 110));
  QStringList categories;
  double maxMs = 0;
  const bool perStep = b->steps.size() <= 48;
  if (perStep) {
    for (const auto& s : b->steps) {
      categories << QString("r%1 s%2").arg(s.rank).arg(s.step);
      *compute << s.time.computeNs / 1e6;
      *exposed << s.time.exposedCommNs / 1e6;
      *other << s.time.otherNs / 1e6;
      *idle << s.time.idleNs / 1e6;
      maxMs = std::max(maxMs, s.time.stepNs / 1e6);
    }
    chart->setTitle("Time per rank and step (ms)");
  } else {  // too many bars: per rank, mean per step
    for (const auto& r : b->ranks) {
      const double n = std::max(1, r.steps);
      categories << QString("rank %1").arg(r.rank);
      *compute << r.time.computeNs / 1e6 / n;
      *exposed << r.time.exposedCommNs / 1e6 / n;
      *other << r.time.otherNs / 1e6 / n;
      *idle << r.time.idleNs / 1e6 / n;
      maxMs = std::max(maxMs, r.time.stepNs / 1e6 / n);
    }
    chart->setTitle("Mean time per step, per rank (ms)");
  }
  auto* series = new QStackedBarSeries;
  series->append({compute, exposed, other, idle});
  series->setBarWidth(0.8);
  chart->addSeries(series);
  auto* x = new QBarCategoryAxis;
  x->append(categories);
  chart->addAxis(x, Qt::AlignBottom);
  series->attachAxis(x);
  auto* y = new QValueAxis;
  y->setRange(0, maxMs * 1.05);
  y->setTitleText("ms");
  chart->addAxis(y, Qt::AlignLeft);
  series->attachAxis(y);
  chart->legend()->setAlignment(Qt::AlignRight);
}

}  // namespace tpscope::gui
