// Findings and alerts: the analyses' findings (diagnose) followed by the alerts recorded during the run (alerts
// table), one row each, most severe first. Each row knows where its evidence is (evidenceTarget) so the viewer can
// jump there.
//
// Threading: UI thread. setRun() resets the model.
#pragma once

#include <QAbstractTableModel>
#include <optional>
#include <string_view>
#include <vector>

#include "tpscope/gui/run_loader.h"

namespace tpscope::gui {

// Where a finding's evidence is: a rank, a step, a layer, a collective (group, seq), a time. Unknown parts are -1 /
// empty / nullopt.
struct EvidenceTarget {
  int rank = -1;
  int step = -1;
  int layer = -1;
  QString group;
  qint64 seq = -1;
  std::optional<qint64> timeNs;  // a moment to centre the timeline on
  std::optional<qint64> endNs;   // with timeNs: a window to show
};

// "evidence:" and one indented line per cited row, then the numbers; "" when there is no evidence.
QString evidenceText(const analysis::Evidence& evidence);

// The place of a finding or chain link (kind name, rank, step, layer, collective), without a time yet. A NaN/Inf
// origin's place is its rank, step and layer: its collective is only the first hop of the spread.
EvidenceTarget placeOf(std::string_view kind, int rank, int step, int layer,
                       const std::optional<analysis::CollectiveRef>& collective);
// Fills in the target's moment from the run, unless it has one: a collective from its earliest arrival to its latest
// end; else the rank's step window; else the step's windows on every rank.
void placeInTime(EvidenceTarget& target, const RunData& run);

class FindingsModel : public QAbstractTableModel {
  Q_OBJECT
 public:
  enum Column { kSeverity, kKind, kRank, kStep, kLayer, kCollective, kSource, kMessage, kColumnCount };
  enum Role { SeverityRole = Qt::UserRole + 1, SortRole };

  explicit FindingsModel(QObject* parent = nullptr);
  void setRun(RunPtr run, AnalysisPtr analysis);  // analysis may be null (alerts only)

  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role) const override;
  QVariant headerData(int section, Qt::Orientation orientation, int role) const override;

  EvidenceTarget evidenceTarget(int row) const;
  QString detailsText(int row) const;  // message, detail lines and evidence, for the details pane

 private:
  struct Item {
    int severity = 3;  // analysis::Severity
    QString kind, message, details, source, group;
    int rank = -1, step = -1, layer = -1;
    qint64 seq = -1;
    std::optional<qint64> timeNs;
  };
  RunPtr run_;
  std::vector<Item> items_;
};

}  // namespace tpscope::gui
