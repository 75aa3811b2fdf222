// Desync: per process group, the matrix of members × last enqueued / started / completed sequence numbers
// (DesyncModel); the stuck collective's missing ranks red, waiting ranks amber, and the analysis' explanation.
#pragma once

#include <QComboBox>
#include <QLabel>
#include <QTableView>
#include <QWidget>

#include "tpscope/gui/desync_model.h"

namespace tpscope::gui {

class DesyncView : public QWidget {
  Q_OBJECT
 public:
  explicit DesyncView(QWidget* parent = nullptr);
  void setAnalysis(AnalysisPtr analysis);
  DesyncModel* model() { return &model_; }
  QTableView* table() { return table_; }
  QLabel* explanation() { return explanation_; }

 signals:
  void showCollective(QString group, qint64 seq);

 private:
  void refresh();
  DesyncModel model_;
  QComboBox* group_ = nullptr;
  QLabel* headline_ = nullptr;
  QLabel* explanation_ = nullptr;
  QTableView* table_ = nullptr;
};

}  // namespace tpscope::gui
