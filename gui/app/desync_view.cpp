#include "desync_view.h"

#include <QHBoxLayout>
#include <QHeaderView>
#include <QPushButton>
#include <QVBoxLayout>

#include "tpscope/gui/palette.h"

namespace tpscope::gui {

DesyncView::DesyncView(QWidget* parent) : QWidget(parent) {
  auto* layout = new QVBoxLayout(this);
  auto* bar = new QHBoxLayout;
  group_ = new QComboBox(this);
  group_->setMinimumContentsLength(12);
  bar->addWidget(new QLabel("Process group", this));
  bar->addWidget(group_);
  auto* show = new QPushButton("Show stuck collective in timeline", this);
  bar->addWidget(show);
  bar->addStretch();
  layout->addLayout(bar);
  headline_ = new QLabel(this);
  layout->addWidget(headline_);
  table_ = new QTableView(this);
  table_->setModel(&model_);
  table_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  table_->verticalHeader()->setVisible(false);
  table_->horizontalHeader()->setStretchLastSection(true);
  layout->addWidget(table_, 1);
  explanation_ = new QLabel(this);
  explanation_->setWordWrap(true);
  explanation_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  explanation_->setAlignment(Qt::AlignTop | Qt::AlignLeft);
  layout->addWidget(explanation_);
  connect(group_, &QComboBox::currentIndexChanged, this, [this](int i) {
    if (i != model_.group() && i >= 0) {
      model_.setGroup(i);
      refresh();
    }
  });
  connect(show, &QPushButton::clicked, this, [this] {
    const auto* g = model_.currentGroup();
    if (g && g->stuckSeq) emit showCollective(QString::fromStdString(g->group), *g->stuckSeq);
  });
}

void DesyncView::setAnalysis(AnalysisPtr analysis) {
  model_.setAnalysis(std::move(analysis));
  group_->blockSignals(true);
  group_->clear();
  group_->addItems(model_.groupNames());
  group_->setCurrentIndex(model_.group());
  group_->blockSignals(false);
  refresh();
}

void DesyncView::refresh() {
  const auto* g = model_.currentGroup();
  if (!g) {
    headline_->setText("No collectives recorded.");
    explanation_->clear();
    return;
  }
  if (g->healthy()) {
    headline_->setText(QString("<b style='color:%1'>%2: every member completed every collective it entered (last "
                               "seq %3).</b>")
                           .arg(palette::kOk.name(), QString::fromStdString(g->group))
                           .arg(g->progress.empty() ? 0 : g->progress.front().lastCompleted));
  } else if (g->stuckSeq) {
    headline_->setText(QString("<b style='color:%1'>%2 is stuck at seq %3</b> — red: never entered it; amber: "
                               "entered it and still waiting.")
                           .arg(palette::kStuck.name(), QString::fromStdString(g->group))
                           .arg(*g->stuckSeq));
  } else {
    headline_->setText(QString("<b style='color:%1'>%2: members disagree on %3 collectives.</b>")
                           .arg(palette::kStuck.name(), QString::fromStdString(g->group))
                           .arg(g->mismatchCount));
  }
  explanation_->setText(model_.explanation());
  table_->resizeColumnsToContents();
}

}  // namespace tpscope::gui
