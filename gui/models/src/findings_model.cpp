#include "tpscope/gui/findings_model.h"

#include <QBrush>

#include "tpscope/gui/palette.h"

namespace tpscope::gui {

namespace {

QString evidenceValueText(const analysis::EvidenceValue& v) {
  if (const auto* i = std::get_if<int64_t>(&v)) return QString::number(*i);
  if (const auto* d = std::get_if<double>(&v)) return QString::number(*d, 'g', 6);
  return QString::fromStdString(std::get<std::string>(v));
}

QString fieldsText(const std::vector<analysis::EvidenceField>& fields) {
  QStringList parts;
  for (const auto& f : fields) parts << QString::fromStdString(f.name) + "=" + evidenceValueText(f.value);
  return parts.join(", ");
}

}  // namespace

QString evidenceText(const analysis::Evidence& e) {
  if (e.rows.empty() && e.numbers.empty()) return {};
  QStringList lines{"evidence:"};
  for (const auto& row : e.rows) lines << "  " + QString::fromStdString(row.table) + " {" + fieldsText(row.key) + "}";
  if (e.rowsOmitted > 0) lines << QString("  … %1 more rows").arg(e.rowsOmitted);
  if (!e.numbers.empty()) lines << "  " + fieldsText(e.numbers);
  return lines.join('\n');
}

EvidenceTarget placeOf(std::string_view kind, int rank, int step, int layer,
                       const std::optional<analysis::CollectiveRef>& collective) {
  EvidenceTarget t;
  t.rank = rank;
  t.step = step;
  t.layer = layer;
  const bool origin = kind == analysis::findingKindName(analysis::FindingKind::NanOrigin) ||
                      kind == analysis::findingKindName(analysis::FindingKind::InfOrigin);
  if (collective && !(origin && rank >= 0 && step >= 0)) {
    t.group = QString::fromStdString(collective->group);
    t.seq = collective->seq;
  }
  return t;
}

void placeInTime(EvidenceTarget& t, const RunData& run) {
  if (t.timeNs) return;
  if (t.seq >= 0) {  // the collective: from the earliest arrival to the latest end among its records
    std::optional<qint64> b, e;
    for (const auto& c : run.collectives)
      if (c.seq == t.seq && QString::fromStdString(c.group) == t.group) {
        b = b ? std::min<qint64>(*b, c.enqueueNs) : c.enqueueNs;
        const qint64 end = c.endNs.value_or(run.endNs);
        e = e ? std::max<qint64>(*e, end) : end;
        if (t.step < 0) t.step = c.step;
      }
    if (b) {
      t.timeNs = b;
      t.endNs = e;
      return;
    }
  }
  if (t.rank >= 0 && t.step >= 0) {
    int64_t b = 0, e = 0;
    if (run.stepWindow(t.rank, t.step, b, e)) {
      t.timeNs = b;
      t.endNs = e;
    }
  } else if (t.step >= 0) {
    for (int r : run.rankIds()) {
      int64_t b = 0, e = 0;
      if (run.stepWindow(r, t.step, b, e)) {
        t.timeNs = t.timeNs ? std::min<qint64>(*t.timeNs, b) : b;
        t.endNs = t.endNs ? std::max<qint64>(*t.endNs, e) : e;
      }
    }
  }
}

FindingsModel::FindingsModel(QObject* parent) : QAbstractTableModel(parent) {}

void FindingsModel::setRun(RunPtr run, AnalysisPtr analysis) {
  beginResetModel();
  run_ = std::move(run);
  items_.clear();
  if (analysis) {
    for (const analysis::Finding& f : analysis->findings) {
      Item it;
      it.severity = static_cast<int>(f.severity);
      it.kind = QString::fromStdString(std::string(analysis::findingKindName(f.kind)));
      it.message = QString::fromStdString(f.message);
      QStringList lines;
      for (const auto& d : f.details) lines << QString::fromStdString(d);
      const QString evidence = evidenceText(f.evidence);
      if (!evidence.isEmpty()) lines << evidence;
      it.details = lines.join('\n');
      it.source = "analysis";
      const EvidenceTarget place = placeOf(analysis::findingKindName(f.kind), f.rank, f.step, f.layer, f.collective);
      it.rank = place.rank;
      it.step = place.step;
      it.layer = place.layer;
      it.group = place.group;
      it.seq = place.seq;
      items_.push_back(std::move(it));
    }
  }
  if (run_) {
    for (const tracedb::AlertRow& a : run_->alerts) {
      Item it;
      it.severity = static_cast<int>(analysis::storedSeverity(a.severity));
      it.kind = QString::fromStdString(a.kind);
      it.message = QString::fromStdString(a.message);
      it.details = "param: " + QString::fromStdString(a.param) + "\nevidence: " + QString::fromStdString(a.evidence);
      it.source = "alert";
      it.rank = a.rank;
      it.step = a.step;
      it.layer = a.layer;
      it.timeNs = a.tsNs;
      items_.push_back(std::move(it));
    }
  }
  std::stable_sort(items_.begin(), items_.end(), [](const Item& a, const Item& b) { return a.severity < b.severity; });
  endResetModel();
}

int FindingsModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(items_.size());
}

int FindingsModel::columnCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : kColumnCount; }

QVariant FindingsModel::data(const QModelIndex& index, int role) const {
  if (!index.isValid() || index.row() >= static_cast<int>(items_.size())) return {};
  const Item& it = items_[index.row()];
  auto num = [](int v) { return v < 0 ? QVariant(QString()) : QVariant(v); };
  if (role == SeverityRole) return it.severity;
  if (role == Qt::DisplayRole || role == SortRole) {
    switch (index.column()) {
      case kSeverity:
        return role == SortRole ? QVariant(it.severity)
                                : QVariant(QString::fromStdString(std::string(
                                      analysis::severityName(static_cast<analysis::Severity>(it.severity)))));
      case kKind: return it.kind;
      case kRank: return role == SortRole ? QVariant(it.rank) : num(it.rank);
      case kStep: return role == SortRole ? QVariant(it.step) : num(it.step);
      case kLayer: return role == SortRole ? QVariant(it.layer) : num(it.layer);
      case kCollective: return it.seq >= 0 ? QString("%1 #%2").arg(it.group).arg(it.seq) : QString();
      case kMessage: return it.message;
      case kSource: return it.source;
    }
  }
  if (role == Qt::ForegroundRole && index.column() == kSeverity) return QBrush(palette::severity(it.severity));
  if (role == Qt::ToolTipRole) return it.message + (it.details.isEmpty() ? QString() : "\n" + it.details);
  return {};
}

QVariant FindingsModel::headerData(int section, Qt::Orientation orientation, int role) const {
  if (orientation != Qt::Horizontal || role != Qt::DisplayRole) return {};
  static const char* kNames[] = {"Severity", "Kind", "Rank", "Step", "Layer", "Collective", "Source", "Message"};
  return section >= 0 && section < kColumnCount ? QString(kNames[section]) : QVariant();
}

EvidenceTarget FindingsModel::evidenceTarget(int row) const {
  EvidenceTarget t;
  if (row < 0 || row >= static_cast<int>(items_.size())) return t;
  const Item& it = items_[row];
  t.rank = it.rank;
  t.step = it.step;
  t.layer = it.layer;
  t.group = it.group;
  t.seq = it.seq;
  t.timeNs = it.timeNs;
  if (run_) placeInTime(t, *run_);  // a recorded alert carries its own moment
  return t;
}

QString FindingsModel::detailsText(int row) const {
  if (row < 0 || row >= static_cast<int>(items_.size())) return {};
  const Item& it = items_[row];
  return it.message + (it.details.isEmpty() ? QString() : "\n\n" + it.details);
}

}  // namespace tpscope::gui
