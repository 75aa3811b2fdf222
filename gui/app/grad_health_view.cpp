#include "grad_health_view.h"

#include <QHBoxLayout>
#include <QHeaderView>
#include <QVBoxLayout>

#include "tpscope/gui/palette.h"

namespace tpscope::gui {

GradHealthView::GradHealthView(QWidget* parent) : QWidget(parent) {
  auto* layout = new QVBoxLayout(this);
  auto* bar = new QHBoxLayout;
  mode_ = new QComboBox(this);
  mode_->addItems({"Rank × layer at step", "Step × rank for parameter"});
  step_ = new QComboBox(this);
  param_ = new QComboBox(this);
  param_->setMinimumContentsLength(28);
  bar->addWidget(new QLabel("Show", this));
  bar->addWidget(mode_);
  bar->addWidget(new QLabel("step", this));
  bar->addWidget(step_);
  bar->addWidget(new QLabel("parameter", this));
  bar->addWidget(param_);
  bar->addStretch();
  auto* legend = new QLabel(this);
  legend->setText(QString("<span style='background:%1;color:white'>&nbsp;NaN/Inf&nbsp;</span> "
                          "<span style='background:%2;color:white'>&nbsp;low norm&nbsp;</span>"
                          "<span style='background:%3'>&nbsp;high norm&nbsp;</span> (log scale)")
                      .arg(palette::kNonFinite.name(), palette::heat(0).name(), palette::heat(1).name()));
  bar->addWidget(legend);
  layout->addLayout(bar);
  summary_ = new QLabel(this);
  layout->addWidget(summary_);
  table_ = new QTableView(this);
  table_->setModel(&model_);
  table_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  table_->setSelectionMode(QAbstractItemView::SingleSelection);
  table_->horizontalHeader()->setDefaultSectionSize(64);
  table_->verticalHeader()->setDefaultSectionSize(24);
  table_->setShowGrid(true);
  layout->addWidget(table_, 1);

  connect(mode_, &QComboBox::currentIndexChanged, this, [this](int i) {
    if (syncing_) return;
    if (i == 0) model_.showStep(step_->currentData().toInt());
    else model_.showParam(param_->currentText());
    syncControls();
  });
  connect(step_, &QComboBox::currentIndexChanged, this, [this] {
    if (syncing_) return;
    model_.showStep(step_->currentData().toInt());
    syncControls();
  });
  connect(param_, &QComboBox::currentIndexChanged, this, [this] {
    if (syncing_) return;
    model_.showParam(param_->currentText());
    syncControls();
  });
  connect(table_, &QTableView::clicked, this, [this](const QModelIndex& index) {
    if (!index.data(GradHealthModel::NormRole).isValid()) return;
    emit jumpTo(index.data(GradHealthModel::RankRole).toInt(), index.data(GradHealthModel::StepRole).toInt(),
                index.data(GradHealthModel::LayerRole).toInt());
  });
}

void GradHealthView::showStep(int step) {
  model_.showStep(step);
  syncControls();
}

void GradHealthView::setAnalysis(const AnalysisPtr& analysis) {
  model_.setAnalysis(analysis);
  syncControls();
}

void GradHealthView::setRun(RunPtr run) {
  model_.setRun(std::move(run));
  syncing_ = true;
  step_->clear();
  for (int s : model_.steps()) step_->addItem(QString::number(s), s);
  param_->clear();
  param_->addItems(model_.params());
  syncing_ = false;
  syncControls();
}

void GradHealthView::syncControls() {
  syncing_ = true;
  mode_->setCurrentIndex(model_.mode() == GradHealthModel::Mode::RankByLayer ? 0 : 1);
  step_->setCurrentIndex(step_->findData(model_.step()));
  param_->setCurrentText(model_.param());
  step_->setEnabled(model_.mode() == GradHealthModel::Mode::RankByLayer);
  param_->setEnabled(model_.mode() == GradHealthModel::Mode::StepByRank);
  syncing_ = false;
  if (model_.steps().empty()) summary_->setText("No gradient statistics in this run.");
  else if (model_.firstNonFiniteStep() >= 0)
    summary_->setText(QString("<b style='color:%1'>First non-finite value at step %2.</b> Click a cell to see "
                              "that rank and step in the timeline.")
                          .arg(palette::kNonFinite.name())
                          .arg(model_.firstNonFiniteStep()));
  else if (model_.analysed())
    summary_->setText("All gradients finite. Click a cell to see that rank and step in the timeline.");
  else summary_->setText("Click a cell to see that rank and step in the timeline.");
}

}  // namespace tpscope::gui
