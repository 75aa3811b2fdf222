// The collective table: one row per collective (group, seq), joined across its members' records, with the figures
// of probes/analysis/collectives.h per collective: size S (bytes; ×n for all_gather), arrival skew, latency (min
// member duration), algorithm and bus bandwidth (GB/s, 1e9 bytes/s, nccl-tests' factors), the last arriver, and
// how many members entered and completed it. A collective that some member has not completed is flagged stuck.
//
// Sortable through a QSortFilterProxyModel with sortRole() == SortRole (numbers sort as numbers).
// Threading: UI thread.
#pragma once

#include <QAbstractTableModel>
#include <vector>

#include "tpscope/gui/run_loader.h"

namespace tpscope::gui {

struct CollectiveSummary {
  QString group, op, callsite;
  qint64 seq = 0;
  int step = -1, layer = -1;
  int groupSize = 0, entered = 0, completed = 0;
  qint64 bytes = 0;      // S
  qint64 firstArrivalNs = 0, lastArrivalNs = 0;
  qint64 endNs = 0;      // latest end among members (0 if none)
  qint64 latencyNs = 0;  // min member duration (0 if none completed)
  qint64 meanNs = 0;     // mean member duration
  double algbwGbps = 0, busbwGbps = 0;
  int lastRank = -1;
  bool stuck() const { return completed < groupSize; }
  qint64 skewNs() const { return lastArrivalNs - firstArrivalNs; }
};

// Joins the records of `run` into one summary per (group, seq), in (group, seq) order.
std::vector<CollectiveSummary> summarizeCollectives(const RunData& run);

class CollectiveModel : public QAbstractTableModel {
  Q_OBJECT
 public:
  enum Column {
    kGroup, kSeq, kOp, kStep, kLayer, kMembers, kBytes, kSkew, kLatency, kAlgbw, kBusbw, kLast, kState, kColumnCount
  };
  enum Role { SortRole = Qt::UserRole + 1, StuckRole };

  explicit CollectiveModel(QObject* parent = nullptr);
  void setRun(RunPtr run);

  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role) const override;
  QVariant headerData(int section, Qt::Orientation orientation, int role) const override;

  const CollectiveSummary& summary(int row) const { return rows_[row]; }
  int rowOf(const QString& group, qint64 seq) const;  // -1 if none

 private:
  std::vector<CollectiveSummary> rows_;
};

}  // namespace tpscope::gui
