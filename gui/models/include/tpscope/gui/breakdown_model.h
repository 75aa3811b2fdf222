// Per-rank/step time breakdown (probes/analysis/breakdown.h): one row per (rank, step) with step time and the
// shares compute / exposed communication / other / idle (which sum to the step), plus total communication (overlapped
// or not); the exposed-communication share is the communication overhead. Sortable with SortRole.
//
// Threading: UI thread.
#pragma once

#include <QAbstractTableModel>

#include "tpscope/gui/run_loader.h"

namespace tpscope::gui {

class BreakdownModel : public QAbstractTableModel {
  Q_OBJECT
 public:
  enum Column { kRank, kStep, kStepMs, kCompute, kExposedComm, kOther, kIdle, kComm, kColumnCount };
  enum Role { SortRole = Qt::UserRole + 1, NsRole };  // NsRole: the column's time in ns (share columns)

  explicit BreakdownModel(QObject* parent = nullptr);
  void setAnalysis(AnalysisPtr analysis);
  const analysis::Breakdown* breakdown() const { return analysis_ ? &analysis_->breakdown : nullptr; }

  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role) const override;
  QVariant headerData(int section, Qt::Orientation orientation, int role) const override;

 private:
  AnalysisPtr analysis_;
};

}  // namespace tpscope::gui
