// The desync matrix of one process group (probes/analysis/desync.h): rows are the group's members, columns their
// last enqueued / started / completed sequence numbers, a status and where the rank is. The stuck collective's
// missing ranks (never entered it) and waiting ranks (entered, never completed) are flagged (StatusRole,
// BackgroundRole), and explanation() says what the analysis concluded.
//
// Threading: UI thread.
#pragma once

#include <QAbstractTableModel>
#include <QStringList>

#include "tpscope/gui/run_loader.h"

namespace tpscope::gui {

class DesyncModel : public QAbstractTableModel {
  Q_OBJECT
 public:
  enum Column { kRank, kLastEnqueued, kLastStarted, kLastCompleted, kStatus, kWhere, kColumnCount };
  enum class Status { Ok = 0, Waiting = 1, Missing = 2 };
  enum Role { StatusRole = Qt::UserRole + 1, RankRole };

  explicit DesyncModel(QObject* parent = nullptr);
  void setAnalysis(AnalysisPtr analysis);  // shows the first unhealthy group, else the first group
  void setGroup(int index);

  QStringList groupNames() const;
  int group() const { return group_; }
  const analysis::GroupDesync* currentGroup() const;
  QString explanation() const;  // "" when the group is healthy

  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role) const override;
  QVariant headerData(int section, Qt::Orientation orientation, int role) const override;

 private:
  Status status(int rank) const;
  AnalysisPtr analysis_;
  int group_ = -1;
};

}  // namespace tpscope::gui
