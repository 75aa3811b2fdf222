// Gradient-health heatmap: rank × layer at a chosen step, or step × rank for a chosen parameter (GradHealthModel).
// NaN/Inf cells are magenta and say "NaN"/"Inf"; a click asks the window to show that rank and step in the timeline.
#pragma once

#include <QComboBox>
#include <QLabel>
#include <QTableView>
#include <QWidget>

#include "tpscope/gui/grad_health_model.h"

namespace tpscope::gui {

class GradHealthView : public QWidget {
  Q_OBJECT
 public:
  explicit GradHealthView(QWidget* parent = nullptr);
  void setRun(RunPtr run);
  // The run's analysis: the heatmap shows the step of its NaN/Inf origin, the analysis' "first" (GradHealthModel).
  void setAnalysis(const AnalysisPtr& analysis);
  // Shows one step (rank × layer).
  void showStep(int step);
  GradHealthModel* model() { return &model_; }
  QTableView* table() { return table_; }

 signals:
  void jumpTo(int rank, int step, int layer);  // layer -1: the whole step

 private:
  void syncControls();
  GradHealthModel model_;
  QComboBox* mode_ = nullptr;
  QComboBox* step_ = nullptr;
  QComboBox* param_ = nullptr;
  QLabel* summary_ = nullptr;
  QTableView* table_ = nullptr;
  bool syncing_ = false;
};

}  // namespace tpscope::gui
