#include "tpscope/gui/breakdown_model.h"

namespace tpscope::gui {

BreakdownModel::BreakdownModel(QObject* parent) : QAbstractTableModel(parent) {}

void BreakdownModel::setAnalysis(AnalysisPtr analysis) {
  beginResetModel();
  analysis_ = std::move(analysis);
  endResetModel();
}

int BreakdownModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() || !analysis_ ? 0 : static_cast<int>(analysis_->breakdown.steps.size());
}
int BreakdownModel::columnCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : kColumnCount; }

QVariant BreakdownModel::data(const QModelIndex& index, int role) const {
  if (!index.isValid() || index.row() >= rowCount()) return {};
  const analysis::StepBreakdown& s = analysis_->breakdown.steps[index.row()];
  const analysis::TimeShares& t = s.time;
  auto nsOf = [&](int column) -> int64_t {
    switch (column) {
      case kStepMs: return t.stepNs;
      case kCompute: return t.computeNs;
      case kExposedComm: return t.exposedCommNs;
      case kOther: return t.otherNs;
      case kIdle: return t.idleNs;
      case kComm: return t.commNs;
    }
    return 0;
  };
  if (role == NsRole) return static_cast<qlonglong>(nsOf(index.column()));
  if (role != Qt::DisplayRole && role != SortRole) return {};
  if (index.column() == kRank) return s.rank;
  if (index.column() == kStep) return s.step;
  if (index.column() == kStepMs)
    return role == SortRole ? QVariant(static_cast<qlonglong>(t.stepNs)) : QVariant(QString::number(t.stepNs / 1e6, 'f', 3));
  const double pct = t.pct(nsOf(index.column()));
  return role == SortRole ? QVariant(pct) : QVariant(QString::number(pct, 'f', 1) + " %");
}

QVariant BreakdownModel::headerData(int section, Qt::Orientation orientation, int role) const {
  if (orientation != Qt::Horizontal || role != Qt::DisplayRole) return {};
  static const char* kNames[] = {"Rank", "Step", "Step ms", "Compute", "Exposed comm", "Other", "Idle", "Comm (all)"};
  return section >= 0 && section < kColumnCount ? QString(kNames[section]) : QVariant();
}

}  // namespace tpscope::gui
