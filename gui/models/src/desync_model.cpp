#include "tpscope/gui/desync_model.h"

#include <QBrush>
#include <algorithm>

#include "tpscope/gui/palette.h"

namespace tpscope::gui {

DesyncModel::DesyncModel(QObject* parent) : QAbstractTableModel(parent) {}

void DesyncModel::setAnalysis(AnalysisPtr analysis) {
  beginResetModel();
  analysis_ = std::move(analysis);
  group_ = -1;
  if (analysis_ && !analysis_->desync.groups.empty()) {
    const auto& groups = analysis_->desync.groups;
    auto it = std::find_if(groups.begin(), groups.end(), [](const auto& g) { return !g.healthy(); });
    group_ = it == groups.end() ? 0 : static_cast<int>(it - groups.begin());
  }
  endResetModel();
}

void DesyncModel::setGroup(int index) {
  beginResetModel();
  group_ = analysis_ && index >= 0 && index < static_cast<int>(analysis_->desync.groups.size()) ? index : -1;
  endResetModel();
}

QStringList DesyncModel::groupNames() const {
  QStringList names;
  if (analysis_)
    for (const auto& g : analysis_->desync.groups)
      names << QString::fromStdString(g.group) + (g.healthy() ? QString() : QString(" ⚠"));
  return names;
}

const analysis::GroupDesync* DesyncModel::currentGroup() const {
  return group_ >= 0 ? &analysis_->desync.groups[group_] : nullptr;
}

QString DesyncModel::explanation() const {
  const auto* g = currentGroup();
  if (!g || g->healthy()) return {};
  QStringList lines;
  // The analysis' own findings about this group first (hang / desync messages and details).
  for (const auto& f : analysis_->findings)
    if (f.collective && f.collective->group == g->group &&
        (f.kind == analysis::FindingKind::Hang || f.kind == analysis::FindingKind::Desync)) {
      lines << QString::fromStdString(f.message);
      for (const auto& d : f.details) lines << "  " + QString::fromStdString(d);
    }
  if (lines.isEmpty() && g->stuckSeq) {
    lines << QString("%1 is stuck at seq %2 (%3)")
                 .arg(QString::fromStdString(g->group))
                 .arg(*g->stuckSeq)
                 .arg(analysis::matchStateName(g->stuckState));
    QStringList missing, waiting;
    for (int r : g->missingRanks) missing << QString::number(r);
    for (int r : g->waitingRanks) waiting << QString::number(r);
    if (!missing.isEmpty()) lines << "never entered it: ranks " + missing.join(", ");
    if (!waiting.isEmpty()) lines << "entered it and are waiting: ranks " + waiting.join(", ");
  }
  if (g->mismatchCount > 0) lines << QString("%1 mismatched collectives in this group").arg(g->mismatchCount);
  return lines.join('\n');
}

DesyncModel::Status DesyncModel::status(int rank) const {
  const auto* g = currentGroup();
  if (!g) return Status::Ok;
  if (std::find(g->missingRanks.begin(), g->missingRanks.end(), rank) != g->missingRanks.end()) return Status::Missing;
  if (std::find(g->waitingRanks.begin(), g->waitingRanks.end(), rank) != g->waitingRanks.end()) return Status::Waiting;
  return Status::Ok;
}

int DesyncModel::rowCount(const QModelIndex& parent) const {
  const auto* g = currentGroup();
  return parent.isValid() || !g ? 0 : static_cast<int>(g->progress.size());
}
int DesyncModel::columnCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : kColumnCount; }

QVariant DesyncModel::data(const QModelIndex& index, int role) const {
  const auto* g = currentGroup();
  if (!g || !index.isValid() || index.row() >= rowCount()) return {};
  const analysis::MemberProgress& p = g->progress[index.row()];
  const Status st = status(p.rank);
  if (role == StatusRole) return static_cast<int>(st);
  if (role == RankRole) return p.rank;
  if (role == Qt::BackgroundRole) {
    if (st == Status::Missing) return QBrush(palette::kStuck);
    if (st == Status::Waiting && index.column() == kLastCompleted) return QBrush(palette::kWaiting);
    return {};
  }
  if (role == Qt::ToolTipRole && p.lastSpan)
    return QString("last span: %1 (%2, step %3)")
        .arg(QString::fromStdString(p.lastSpan->name), QString::fromStdString(p.lastSpan->kind))
        .arg(p.lastSpan->step);
  if (role != Qt::DisplayRole) return {};
  auto seq = [](int64_t s) { return s > 0 ? QVariant(static_cast<qlonglong>(s)) : QVariant(QString("—")); };
  switch (index.column()) {
    case kRank: return p.rank;
    case kLastEnqueued: return seq(p.lastEnqueued);
    case kLastStarted: return seq(p.lastStarted);
    case kLastCompleted: return seq(p.lastCompleted);
    case kStatus:
      if (st == Status::Missing) return QString("never entered seq %1").arg(g->stuckSeq.value_or(-1));
      if (st == Status::Waiting) return QString("waiting in seq %1").arg(g->stuckSeq.value_or(-1));
      return QString("ok");
    case kWhere:
      if (p.lastSpan)
        return QString("%1 · step %2").arg(QString::fromStdString(p.lastSpan->name)).arg(p.lastSpan->step);
      if (p.lastRecord)
        return QString("%1 %2").arg(QString::fromStdString(p.lastRecord->op),
                                    QString::fromStdString(p.lastRecord->callsite));
      return QString();
  }
  return {};
}

QVariant DesyncModel::headerData(int section, Qt::Orientation orientation, int role) const {
  if (orientation != Qt::Horizontal || role != Qt::DisplayRole) return {};
  static const char* kNames[] = {"Rank", "Last enqueued", "Last started", "Last completed", "Status", "Where"};
  return section >= 0 && section < kColumnCount ? QString(kNames[section]) : QVariant();
}

}  // namespace tpscope::gui
