// Findings and alerts: the list (FindingsModel, sortable), the selected finding's message, details and evidence;
// a double-click asks the window to jump to the evidence.
#pragma once

#include <QPlainTextEdit>
#include <QSortFilterProxyModel>
#include <QTableView>
#include <QWidget>

#include "tpscope/gui/findings_model.h"

namespace tpscope::gui {

class FindingsView : public QWidget {
  Q_OBJECT
 public:
  explicit FindingsView(QWidget* parent = nullptr);
  void setRun(RunPtr run, AnalysisPtr analysis);
  FindingsModel* model() { return &model_; }
  QTableView* table() { return table_; }
  // Jumps to the evidence of source row `row` (what a double-click does).
  void activate(int row);

 signals:
  void jumpToEvidence(tpscope::gui::EvidenceTarget target);

 private:
  FindingsModel model_;
  QSortFilterProxyModel proxy_;
  QTableView* table_ = nullptr;
  QPlainTextEdit* details_ = nullptr;
};

}  // namespace tpscope::gui
