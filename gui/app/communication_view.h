// Communication: the run's communication overhead at a glance, stacked bars per rank and step (compute / exposed
// communication / other / idle, QtCharts) and the sortable collective table. Double-clicking a collective asks the
// window to show it in the timeline.
#pragma once

#include <QLabel>
#include <QSortFilterProxyModel>
#include <QTableView>
#include <QWidget>
#include <QtCharts/QChartView>

#include "tpscope/gui/breakdown_model.h"
#include "tpscope/gui/collective_model.h"

namespace tpscope::gui {

class CommunicationView : public QWidget {
  Q_OBJECT
 public:
  explicit CommunicationView(QWidget* parent = nullptr);
  void setRun(RunPtr run);
  void setAnalysis(AnalysisPtr analysis);
  CollectiveModel* collectives() { return &collectives_; }
  QTableView* table() { return table_; }
  QChartView* chartView() { return chartView_; }
  QLabel* overhead() { return overhead_; }

 signals:
  void showCollective(QString group, qint64 seq);

 private:
  void rebuildChart();
  AnalysisPtr analysis_;
  BreakdownModel breakdown_;
  CollectiveModel collectives_;
  QSortFilterProxyModel proxy_;
  QLabel* overhead_ = nullptr;
  QChartView* chartView_ = nullptr;
  QTableView* table_ = nullptr;
};

}  // namespace tpscope::gui
