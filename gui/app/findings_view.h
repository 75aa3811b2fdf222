// Findings and alerts: the root-cause chain (analysis/chain.h) as a tree on top — each link with its severity,
// kind, message and cost, a double-click jumps to its evidence — hidden when the chain is empty; below it the list
// (FindingsModel, sortable) and the selected finding's message, details and evidence; a double-click asks the
// window to jump to the evidence.
#pragma once

#include <QPlainTextEdit>
#include <QSortFilterProxyModel>
#include <QTableView>
#include <QTreeWidget>
#include <QWidget>
#include <vector>

#include "tpscope/gui/analysis_data.h"
#include "tpscope/gui/findings_model.h"

namespace tpscope::gui {

// True when the root-cause chain has a link of warning or worse: the viewer then opens the run on the findings.
bool chainNeedsAttention(const AnalysisData& analysis);

class FindingsView : public QWidget {
  Q_OBJECT
 public:
  enum ChainColumn { kChainSeverity, kChainKind, kChainCost, kChainMessage, kChainColumnCount };

  explicit FindingsView(QWidget* parent = nullptr);
  void setRun(RunPtr run, AnalysisPtr analysis);
  FindingsModel* model() { return &model_; }
  QTableView* table() { return table_; }
  QTreeWidget* chain() { return chain_; }
  // Jumps to the evidence of source row `row` (what a double-click does).
  void activate(int row);
  // Jumps to the evidence of a chain link (what a double-click on the tree does).
  void activateLink(QTreeWidgetItem* item);
  // Where a chain link's evidence is (rank, step, layer, collective, time).
  EvidenceTarget linkTarget(QTreeWidgetItem* item) const;

 signals:
  void jumpToEvidence(tpscope::gui::EvidenceTarget target);

 private:
  void fillChain();
  QTreeWidgetItem* addLink(const analysis::ChainLink& link, QTreeWidgetItem* parent);

  FindingsModel model_;
  QSortFilterProxyModel proxy_;
  RunPtr run_;
  AnalysisPtr analysis_;
  QTreeWidget* chain_ = nullptr;
  QTableView* table_ = nullptr;
  QPlainTextEdit* details_ = nullptr;
  std::vector<const analysis::ChainLink*> links_;  // by the item's LinkRole index, into analysis_->chain
};

}  // namespace tpscope::gui
