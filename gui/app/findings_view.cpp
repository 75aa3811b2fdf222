#include "findings_view.h"

#include <QHeaderView>
#include <QSplitter>
#include <QVBoxLayout>

namespace tpscope::gui {

FindingsView::FindingsView(QWidget* parent) : QWidget(parent) {
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  auto* split = new QSplitter(Qt::Horizontal, this);
  table_ = new QTableView(split);
  proxy_.setSourceModel(&model_);
  proxy_.setSortRole(FindingsModel::SortRole);
  table_->setModel(&proxy_);
  table_->setSortingEnabled(true);
  table_->sortByColumn(FindingsModel::kSeverity, Qt::AscendingOrder);
  table_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  table_->setSelectionBehavior(QAbstractItemView::SelectRows);
  table_->setSelectionMode(QAbstractItemView::SingleSelection);
  table_->verticalHeader()->setVisible(false);
  table_->horizontalHeader()->setStretchLastSection(true);
  details_ = new QPlainTextEdit(split);
  details_->setReadOnly(true);
  details_->setPlaceholderText("Select a finding to see its evidence; double-click to jump to it.");
  split->addWidget(table_);
  split->addWidget(details_);
  split->setStretchFactor(0, 3);
  split->setStretchFactor(1, 1);
  layout->addWidget(split);
  connect(table_->selectionModel(), &QItemSelectionModel::currentRowChanged, this,
          [this](const QModelIndex& current) {
            details_->setPlainText(model_.detailsText(proxy_.mapToSource(current).row()));
          });
  connect(table_, &QTableView::doubleClicked, this,
          [this](const QModelIndex& index) { activate(proxy_.mapToSource(index).row()); });
}

void FindingsView::setRun(RunPtr run, AnalysisPtr analysis) {
  model_.setRun(std::move(run), std::move(analysis));
  for (int c = 0; c < FindingsModel::kMessage; ++c) table_->resizeColumnToContents(c);
  details_->clear();
  if (proxy_.rowCount() > 0) table_->setCurrentIndex(proxy_.index(0, 0));  // the most severe, with its evidence
}

void FindingsView::activate(int row) {
  if (row < 0 || row >= model_.rowCount()) return;
  details_->setPlainText(model_.detailsText(row));
  emit jumpToEvidence(model_.evidenceTarget(row));
}

}  // namespace tpscope::gui
