#include "tpscope/gui/collective_model.h"

#include <QBrush>
#include <algorithm>

#include "tpscope/analysis/collectives.h"
#include "tpscope/gui/palette.h"
#include "tpscope/vocabulary/collective_ops.h"

namespace tpscope::gui {

std::vector<CollectiveSummary> summarizeCollectives(const RunData& run) {
  std::vector<CollectiveSummary> out;
  const auto& cs = run.collectives;  // by group, seq, rank
  for (size_t i = 0; i < cs.size();) {
    size_t j = i;
    while (j < cs.size() && cs[j].group == cs[i].group && cs[j].seq == cs[i].seq) ++j;
    CollectiveSummary s;
    s.group = QString::fromStdString(cs[i].group);
    s.seq = cs[i].seq;
    s.op = QString::fromStdString(cs[i].op);
    s.callsite = QString::fromStdString(cs[i].callsite);
    s.step = cs[i].step;
    s.layer = cs[i].layer;
    s.entered = static_cast<int>(j - i);
    s.groupSize = s.entered;
    for (const auto& g : run.groups)
      if (g.name == cs[i].group && !g.ranks.empty()) s.groupSize = static_cast<int>(g.ranks.size());
    s.firstArrivalNs = cs[i].enqueueNs;
    s.lastArrivalNs = cs[i].enqueueNs;
    s.lastRank = cs[i].rank;
    qint64 maxBytes = 0, sumDur = 0;
    for (size_t k = i; k < j; ++k) {
      const auto& c = cs[k];
      maxBytes = std::max<qint64>(maxBytes, c.bytes);
      s.firstArrivalNs = std::min<qint64>(s.firstArrivalNs, c.enqueueNs);
      if (c.enqueueNs > s.lastArrivalNs) {
        s.lastArrivalNs = c.enqueueNs;
        s.lastRank = c.rank;
      }
      if (c.endNs) {
        const qint64 dur = *c.endNs - c.startNs.value_or(c.enqueueNs);
        s.latencyNs = s.completed == 0 ? dur : std::min(s.latencyNs, dur);
        sumDur += dur;
        ++s.completed;
        s.endNs = std::max<qint64>(s.endNs, *c.endNs);
      }
    }
    if (s.entered < 2) s.lastRank = -1;
    const bool gather = s.op.toStdString() == vocabulary::opName(vocabulary::CollectiveOp::AllGather);
    s.bytes = gather ? maxBytes * s.groupSize : maxBytes;
    s.meanNs = s.completed > 0 ? sumDur / s.completed : 0;
    if (s.latencyNs > 0) {
      s.algbwGbps = static_cast<double>(s.bytes) / static_cast<double>(s.latencyNs);  // bytes/ns == GB/s
      s.busbwGbps = s.algbwGbps * analysis::busBandwidthFactor(s.op.toStdString(), s.groupSize);
    }
    out.push_back(std::move(s));
    i = j;
  }
  return out;
}

CollectiveModel::CollectiveModel(QObject* parent) : QAbstractTableModel(parent) {}

void CollectiveModel::setRun(RunPtr run) {
  beginResetModel();
  rows_ = run ? summarizeCollectives(*run) : std::vector<CollectiveSummary>{};
  endResetModel();
}

int CollectiveModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(rows_.size());
}
int CollectiveModel::columnCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : kColumnCount; }

int CollectiveModel::rowOf(const QString& group, qint64 seq) const {
  for (size_t i = 0; i < rows_.size(); ++i)
    if (rows_[i].group == group && rows_[i].seq == seq) return static_cast<int>(i);
  return -1;
}

QVariant CollectiveModel::data(const QModelIndex& index, int role) const {
  if (!index.isValid() || index.row() >= static_cast<int>(rows_.size())) return {};
  const CollectiveSummary& s = rows_[index.row()];
  if (role == StuckRole) return s.stuck();
  if (role == Qt::ForegroundRole && s.stuck()) return QBrush(palette::kStuck);
  auto us = [](qint64 ns) { return QString::number(ns / 1000.0, 'f', 1); };
  const bool sort = role == SortRole;
  if (role != Qt::DisplayRole && !sort) return {};
  switch (index.column()) {
    case kGroup: return s.group;
    case kSeq: return s.seq;
    case kOp: return s.op;
    case kStep: return s.step;
    case kLayer: return s.layer;
    case kMembers:
      return sort ? QVariant(s.completed) : QVariant(QString("%1/%2/%3").arg(s.completed).arg(s.entered).arg(s.groupSize));
    case kBytes: return s.bytes;
    case kSkew: return sort ? QVariant(s.skewNs()) : QVariant(us(s.skewNs()));
    case kLatency: return sort ? QVariant(s.latencyNs) : QVariant(s.completed ? us(s.latencyNs) : QString("—"));
    case kAlgbw: return sort ? QVariant(s.algbwGbps) : QVariant(QString::number(s.algbwGbps, 'f', 3));
    case kBusbw: return sort ? QVariant(s.busbwGbps) : QVariant(QString::number(s.busbwGbps, 'f', 3));
    case kLast:
      if (s.lastRank < 0) return sort ? QVariant(-1) : QVariant(QString());
      return s.lastRank;
    case kState: return s.stuck() ? QString("stuck") : QString("completed");
  }
  return {};
}

QVariant CollectiveModel::headerData(int section, Qt::Orientation orientation, int role) const {
  if (orientation != Qt::Horizontal || role != Qt::DisplayRole) return {};
  static const char* kNames[] = {"Group", "Seq", "Op", "Step", "Layer", "Done/entered/size", "Bytes", "Skew µs",
                                 "Latency µs", "algbw GB/s", "busbw GB/s", "Last rank", "State"};
  return section >= 0 && section < kColumnCount ? QString(kNames[section]) : QVariant();
}

}  // namespace tpscope::gui
