#include "tpscope/gui/grad_health_model.h"

#include <QBrush>
#include <algorithm>
#include <cmath>
#include <set>

#include "tpscope/gui/palette.h"

namespace tpscope::gui {

GradHealthModel::GradHealthModel(QObject* parent) : QAbstractTableModel(parent) {}

void GradHealthModel::setRun(RunPtr run) {
  run_ = std::move(run);
  std::set<int> steps, ranks, layers;
  std::set<std::string> params;
  firstNonFiniteStep_ = -1;
  analysed_ = false;
  if (run_) {
    for (const auto& g : run_->gradStats) {
      steps.insert(g.step);
      ranks.insert(g.rank);
      layers.insert(g.layer);
      params.insert(g.param);
    }
  }
  steps_.assign(steps.begin(), steps.end());
  ranks_.assign(ranks.begin(), ranks.end());
  layers_.assign(layers.begin(), layers.end());
  params_.clear();
  for (const auto& p : params) params_ << QString::fromStdString(p);
  mode_ = Mode::RankByLayer;
  step_ = steps_.empty() ? -1 : steps_.back();
  param_ = params_.isEmpty() ? QString() : params_.front();
  rebuild();
}

void GradHealthModel::setAnalysis(const AnalysisPtr& analysis) {
  analysed_ = analysis != nullptr;
  firstNonFiniteStep_ = -1;
  if (!analysis) return;
  for (const auto& f : analysis->findings)
    if ((f.kind == analysis::FindingKind::NanOrigin || f.kind == analysis::FindingKind::InfOrigin) &&
        f.severity == analysis::Severity::Critical && f.step >= 0) {
      firstNonFiniteStep_ = f.step;
      showStep(f.step);
      return;
    }
}

void GradHealthModel::showStep(int step) {
  mode_ = Mode::RankByLayer;
  step_ = step;
  rebuild();
}

void GradHealthModel::showParam(const QString& param) {
  mode_ = Mode::StepByRank;
  param_ = param;
  rebuild();
}

void GradHealthModel::rebuild() {
  beginResetModel();
  rowKeys_.clear();
  columnKeys_.clear();
  cells_.clear();
  if (run_) {
    rowKeys_ = mode_ == Mode::RankByLayer ? ranks_ : steps_;
    columnKeys_ = mode_ == Mode::RankByLayer ? layers_ : ranks_;
    cells_.resize(rowKeys_.size() * columnKeys_.size());
    auto at = [](const std::vector<int>& keys, int key) {
      return static_cast<size_t>(std::lower_bound(keys.begin(), keys.end(), key) - keys.begin());
    };
    const std::string param = param_.toStdString();
    for (const auto& g : run_->gradStats) {
      size_t r, c;
      if (mode_ == Mode::RankByLayer) {
        if (g.step != step_) continue;
        r = at(rowKeys_, g.rank);
        c = at(columnKeys_, g.layer);
      } else {
        if (g.param != param) continue;
        r = at(rowKeys_, g.step);
        c = at(columnKeys_, g.rank);
      }
      Cell& cell = cells_[r * columnKeys_.size() + c];
      cell.norm = cell.present ? std::max(cell.norm, g.l2Norm) : g.l2Norm;
      cell.present = true;
      cell.nan += g.nanCount;
      cell.inf += g.infCount;
      cell.rank = g.rank;
      cell.step = g.step;
      cell.layer = mode_ == Mode::RankByLayer ? g.layer : -1;
    }
    bool any = false;
    for (const Cell& cell : cells_) {
      if (!cell.present || cell.nan || cell.inf || !std::isfinite(cell.norm) || cell.norm <= 0) continue;
      const double l = std::log10(cell.norm);
      logMin_ = any ? std::min(logMin_, l) : l;
      logMax_ = any ? std::max(logMax_, l) : l;
      any = true;
    }
    if (!any || logMax_ - logMin_ < 1e-9) logMax_ = logMin_ + 1;
  }
  endResetModel();
}

int GradHealthModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(rowKeys_.size());
}
int GradHealthModel::columnCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(columnKeys_.size());
}

const GradHealthModel::Cell* GradHealthModel::cell(const QModelIndex& index) const {
  if (!index.isValid() || index.row() >= rowCount() || index.column() >= columnCount()) return nullptr;
  return &cells_[index.row() * columnKeys_.size() + index.column()];
}

QVariant GradHealthModel::data(const QModelIndex& index, int role) const {
  const Cell* c = cell(index);
  if (!c) return {};
  const bool nonFinite = c->nan > 0 || c->inf > 0 || (c->present && !std::isfinite(c->norm));
  switch (role) {
    case Qt::DisplayRole:
      if (!c->present) return QString();
      if (c->nan > 0) return QString("NaN");
      if (c->inf > 0 || nonFinite) return QString("Inf");
      return QString::number(c->norm, 'g', 3);
    case Qt::BackgroundRole:
      if (!c->present) return QBrush(palette::kNoData);
      if (nonFinite) return QBrush(palette::kNonFinite);
      return QBrush(palette::heat(c->norm > 0 ? (std::log10(c->norm) - logMin_) / (logMax_ - logMin_) : 0.0));
    case Qt::ForegroundRole:  // numbers that read on their cell: light on the dark end of the ramp
      return QBrush(palette::textOn(data(index, Qt::BackgroundRole).value<QBrush>().color()));
    case Qt::ToolTipRole:
      if (!c->present) return QString("no record");
      return QString("rank %1 · step %2%3\nl2 norm %4 · NaN %5 · Inf %6")
          .arg(c->rank)
          .arg(c->step)
          .arg(c->layer >= 0 ? QString(" · layer %1").arg(c->layer) : QString())
          .arg(c->norm, 0, 'g', 4)
          .arg(c->nan)
          .arg(c->inf);
    case NormRole: return c->present ? QVariant(c->norm) : QVariant();
    case NanCountRole: return static_cast<qlonglong>(c->nan);
    case InfCountRole: return static_cast<qlonglong>(c->inf);
    case NonFiniteRole: return nonFinite;
    case RankRole: return mode_ == Mode::RankByLayer ? rowKeys_[index.row()] : columnKeys_[index.column()];
    case StepRole: return mode_ == Mode::RankByLayer ? step_ : rowKeys_[index.row()];
    case LayerRole: return mode_ == Mode::RankByLayer ? columnKeys_[index.column()] : -1;
  }
  return {};
}

QVariant GradHealthModel::headerData(int section, Qt::Orientation orientation, int role) const {
  if (role != Qt::DisplayRole) return {};
  const auto& keys = orientation == Qt::Horizontal ? columnKeys_ : rowKeys_;
  if (section < 0 || section >= static_cast<int>(keys.size())) return {};
  const bool rankAxis = (mode_ == Mode::RankByLayer) == (orientation == Qt::Vertical);
  if (rankAxis) return QString("rank %1").arg(keys[section]);
  if (mode_ == Mode::RankByLayer) return keys[section] < 0 ? QString("no layer") : QString("layer %1").arg(keys[section]);
  return QString("step %1").arg(keys[section]);
}

}  // namespace tpscope::gui
