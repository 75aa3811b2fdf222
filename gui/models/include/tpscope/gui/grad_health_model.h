// Gradient-health heatmap data (grad_stats): either rank × layer for one step (rows ranks, columns layers; a cell
// aggregates the layer's parameters: the largest l2 norm, the summed NaN and Inf counts) or step × rank for one
// parameter (rows steps, columns ranks). A cell with any NaN or Inf is flagged (NonFiniteRole) and shows "NaN"/"Inf".
// BackgroundRole is the heat colour of log10(norm) over the shown cells' finite range (palette::heat); non-finite
// cells use palette::kNonFinite, cells without a record palette::kNoData; ForegroundRole is the text colour that
// reads on it (palette::textOn). The counts are grad_stats' (RunData); the
// first non-finite value is the analysis' (its nan_origin / inf_origin finding: setAnalysis), which may be an
// activation's before any gradient shows one.
//
// Threading: UI thread.
#pragma once

#include <QAbstractTableModel>
#include <vector>

#include "tpscope/gui/run_loader.h"

namespace tpscope::gui {

class GradHealthModel : public QAbstractTableModel {
  Q_OBJECT
 public:
  enum class Mode { RankByLayer, StepByRank };
  enum Role {
    NormRole = Qt::UserRole + 1,  // double, largest l2 norm (invalid QVariant: no record)
    NanCountRole,                 // qlonglong
    InfCountRole,                 // qlonglong
    NonFiniteRole,                // bool
    RankRole,                     // int: the cell's rank
    StepRole,                     // int: the cell's step
    LayerRole,                    // int: the cell's layer (-1 in StepByRank mode)
  };

  explicit GradHealthModel(QObject* parent = nullptr);
  void setRun(RunPtr run);  // shows the last step; the origin is unknown until setAnalysis
  // The analysis of the run: shows the step of its NaN/Inf origin finding, when it has one.
  void setAnalysis(const AnalysisPtr& analysis);
  void showStep(int step);  // RankByLayer
  void showParam(const QString& param);  // StepByRank

  Mode mode() const { return mode_; }
  int step() const { return step_; }
  QString param() const { return param_; }
  const std::vector<int>& steps() const { return steps_; }
  const QStringList& params() const { return params_; }
  bool analysed() const { return analysed_; }  // setAnalysis was called since the last setRun
  int firstNonFiniteStep() const { return firstNonFiniteStep_; }  // the origin finding's step; -1 if none (yet)

  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role) const override;
  QVariant headerData(int section, Qt::Orientation orientation, int role) const override;

 private:
  struct Cell {
    bool present = false;
    double norm = 0;
    qint64 nan = 0, inf = 0;
    int rank = -1, step = -1, layer = -1;
  };
  void rebuild();
  const Cell* cell(const QModelIndex& index) const;

  RunPtr run_;
  Mode mode_ = Mode::RankByLayer;
  int step_ = -1;
  QString param_;
  std::vector<int> steps_, ranks_, layers_;
  QStringList params_;
  int firstNonFiniteStep_ = -1;
  bool analysed_ = false;
  std::vector<int> rowKeys_, columnKeys_;
  std::vector<Cell> cells_;  // rows × columns
  double logMin_ = 0, logMax_ = 1;
};

}  // namespace tpscope::gui
