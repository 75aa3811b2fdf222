#include "findings_view.h"

#include <QHeaderView>
#include <QSplitter>
#include <QVBoxLayout>
#include <algorithm>

#include "tpscope/gui/palette.h"

namespace tpscope::gui {

namespace {

constexpr int kLinkRole = Qt::UserRole + 1;  // index into links_

QString costText(const analysis::ChainLink& l) {
  QStringList parts;
  if (l.costNs > 0) parts << QString("%1 ms").arg(static_cast<double>(l.costNs) / 1e6, 0, 'f', 3);
  if (l.costSteps > 0) parts << QString("%1 step%2").arg(l.costSteps).arg(l.costSteps == 1 ? "" : "s");
  return parts.join(", ");
}

bool linkNeedsAttention(const analysis::ChainLink& l) {
  if (l.severity <= analysis::Severity::Warning) return true;
  return std::any_of(l.consequences.begin(), l.consequences.end(), linkNeedsAttention);
}

}  // namespace

bool chainNeedsAttention(const AnalysisData& analysis) {
  return std::any_of(analysis.chain.begin(), analysis.chain.end(), linkNeedsAttention);
}

FindingsView::FindingsView(QWidget* parent) : QWidget(parent) {
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  auto* vertical = new QSplitter(Qt::Vertical, this);
  chain_ = new QTreeWidget(vertical);
  chain_->setObjectName("chain");
  chain_->setColumnCount(kChainColumnCount);
  chain_->setHeaderLabels({"Root-cause chain", "Kind", "Cost", "Message"});
  chain_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  chain_->setSelectionMode(QAbstractItemView::SingleSelection);
  chain_->header()->setStretchLastSection(true);
  chain_->setVisible(false);
  auto* split = new QSplitter(Qt::Horizontal, vertical);
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
  vertical->addWidget(chain_);
  vertical->addWidget(split);
  vertical->setStretchFactor(0, 1);
  vertical->setStretchFactor(1, 2);
  layout->addWidget(vertical);
  connect(table_->selectionModel(), &QItemSelectionModel::currentRowChanged, this,
          [this](const QModelIndex& current) {
            details_->setPlainText(model_.detailsText(proxy_.mapToSource(current).row()));
          });
  connect(table_, &QTableView::doubleClicked, this,
          [this](const QModelIndex& index) { activate(proxy_.mapToSource(index).row()); });
  connect(chain_, &QTreeWidget::currentItemChanged, this, [this](QTreeWidgetItem* item) {
    const int i = item ? item->data(0, kLinkRole).toInt() : -1;
    if (i < 0 || i >= static_cast<int>(links_.size())) return;
    const analysis::ChainLink& l = *links_[static_cast<size_t>(i)];
    QString text = QString::fromStdString(l.message);
    if (!costText(l).isEmpty()) text += "\ncost: " + costText(l);
    if (l.finding >= 0 && analysis_ && l.finding < static_cast<int>(analysis_->findings.size()))
      for (const auto& d : analysis_->findings[static_cast<size_t>(l.finding)].details)
        text += "\n" + QString::fromStdString(d);
    const QString evidence = evidenceText(l.evidence);
    details_->setPlainText(evidence.isEmpty() ? text : text + "\n\n" + evidence);
  });
  connect(chain_, &QTreeWidget::itemDoubleClicked, this, [this](QTreeWidgetItem* item) { activateLink(item); });
}

void FindingsView::setRun(RunPtr run, AnalysisPtr analysis) {
  run_ = run;
  analysis_ = analysis;
  model_.setRun(std::move(run), std::move(analysis));
  for (int c = 0; c < FindingsModel::kMessage; ++c) table_->resizeColumnToContents(c);
  details_->clear();
  fillChain();
  if (proxy_.rowCount() > 0) table_->setCurrentIndex(proxy_.index(0, 0));  // the most severe, with its evidence
  if (chain_->topLevelItemCount() > 0) chain_->setCurrentItem(chain_->topLevelItem(0));  // the first root cause
}

QTreeWidgetItem* FindingsView::addLink(const analysis::ChainLink& link, QTreeWidgetItem* parent) {
  auto* item = parent ? new QTreeWidgetItem(parent) : new QTreeWidgetItem(chain_);
  const int sev = static_cast<int>(link.severity);
  item->setText(kChainSeverity, QString::fromStdString(std::string(analysis::severityName(link.severity))));
  item->setForeground(kChainSeverity, QBrush(palette::severity(sev)));
  item->setText(kChainKind, QString::fromStdString(link.kind));
  item->setText(kChainCost, costText(link));
  item->setText(kChainMessage, QString::fromStdString(link.message));
  // A consequence's connection to its cause (chain.h, LinkReason) in the tooltip, below what happened.
  item->setToolTip(kChainMessage, QString::fromStdString(
                                      link.because ? link.message + "\nbecause " + link.because->text : link.message));
  item->setData(0, kLinkRole, static_cast<int>(links_.size()));
  links_.push_back(&link);
  for (const auto& c : link.consequences) addLink(c, item);
  return item;
}

void FindingsView::fillChain() {
  chain_->clear();
  links_.clear();
  if (analysis_)
    for (const auto& root : analysis_->chain) addLink(root, nullptr);
  chain_->expandAll();
  for (int c = 0; c < kChainMessage; ++c) chain_->resizeColumnToContents(c);
  chain_->setVisible(chain_->topLevelItemCount() > 0);
}

EvidenceTarget FindingsView::linkTarget(QTreeWidgetItem* item) const {
  const int i = item ? item->data(0, kLinkRole).toInt() : -1;
  if (i < 0 || i >= static_cast<int>(links_.size())) return {};
  const analysis::ChainLink& l = *links_[static_cast<size_t>(i)];
  EvidenceTarget t = placeOf(l.kind, l.rank, l.step, l.layer, l.collective);
  if (run_) placeInTime(t, *run_);
  return t;
}

void FindingsView::activateLink(QTreeWidgetItem* item) {
  if (item == nullptr) return;
  chain_->setCurrentItem(item);
  emit jumpToEvidence(linkTarget(item));
}

void FindingsView::activate(int row) {
  if (row < 0 || row >= model_.rowCount()) return;
  details_->setPlainText(model_.detailsText(row));
  emit jumpToEvidence(model_.evidenceTarget(row));
}

}  // namespace tpscope::gui
