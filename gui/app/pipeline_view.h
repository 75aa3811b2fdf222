// Pipeline: the schedule of one step of a pipeline-parallel run as it ran (PipelineChart): a row per stage, each
// micro-batch's forward (blue) and backward (green) pass a block with its number, the stage's idle time in the
// pipeline's window shaded (its bubble), the stage with the most pass time outlined. The headline gives the schedule,
// the analytic bubble and the measured one — of this step, and the analysis' mean over the run. A click on a block
// selects its pass span on the timeline.
#pragma once

#include <QLabel>
#include <QSpinBox>
#include <QWidget>

#include "tpscope/gui/pipeline_model.h"
#include "tpscope/gui/run_loader.h"

namespace tpscope::gui {

// The chart itself; separate so tests can find blocks by position.
class PipelineCanvas : public QWidget {
  Q_OBJECT
 public:
  static constexpr int kLabelWidth = 150;
  static constexpr int kRowHeight = 34;
  static constexpr int kRowGap = 8;
  static constexpr int kTop = 8;
  explicit PipelineCanvas(QWidget* parent = nullptr);
  void setChart(PipelineChart chart);
  const PipelineChart& chart() const { return chart_; }
  QRect blockRect(size_t row, size_t block) const;  // widget coordinates
  QRect windowRect(size_t row) const;               // the row's part of the step's window

 signals:
  void blockClicked(tpscope::gui::SpanRef span);

 protected:
  void paintEvent(QPaintEvent*) override;
  void mousePressEvent(QMouseEvent* e) override;

 private:
  double xOf(int64_t ns) const;
  PipelineChart chart_;
};

class PipelineView : public QWidget {
  Q_OBJECT
 public:
  explicit PipelineView(QWidget* parent = nullptr);
  void setRun(RunPtr run);
  void setAnalysis(AnalysisPtr analysis);
  void showStep(int step);
  PipelineCanvas* canvas() { return canvas_; }
  QLabel* headline() { return headline_; }

 signals:
  void spanRequested(tpscope::gui::SpanRef span);

 private:
  void refresh();
  RunPtr run_;
  AnalysisPtr analysis_;
  QSpinBox* step_ = nullptr;
  QLabel* headline_ = nullptr;
  PipelineCanvas* canvas_ = nullptr;
};

}  // namespace tpscope::gui
