#include "pipeline_view.h"

#include <QHBoxLayout>
#include <QMouseEvent>
#include <QPainter>
#include <QScrollArea>
#include <QVBoxLayout>

#include "timeline_view.h"
#include "tpscope/gui/palette.h"

namespace tpscope::gui {

namespace {

const QColor kForward(66, 133, 244);
const QColor kBackward(52, 168, 83);
const QColor kBubble(96, 56, 60);  // idle time inside the pipeline's window
const QColor kLongest(251, 192, 45);

QString percent(double fraction) { return QString::number(100.0 * fraction, 'f', 1) + " %"; }

}  // namespace

PipelineCanvas::PipelineCanvas(QWidget* parent) : QWidget(parent) {
  setMinimumHeight(120);
  setAttribute(Qt::WA_OpaquePaintEvent);
}

void PipelineCanvas::setChart(PipelineChart chart) {
  chart_ = std::move(chart);
  setMinimumHeight(kTop + static_cast<int>(chart_.rows.size()) * (kRowHeight + kRowGap) + 40);
  update();
}

double PipelineCanvas::xOf(int64_t ns) const {
  const double span = std::max<int64_t>(1, chart_.endNs - chart_.beginNs);
  return kLabelWidth + 10 + (static_cast<double>(ns - chart_.beginNs) / span) * (width() - kLabelWidth - 20);
}

QRect PipelineCanvas::windowRect(size_t row) const {
  const int y = kTop + static_cast<int>(row) * (kRowHeight + kRowGap);
  const int x0 = static_cast<int>(xOf(chart_.beginNs)), x1 = static_cast<int>(xOf(chart_.endNs));
  return QRect(x0, y, std::max(1, x1 - x0), kRowHeight);
}

QRect PipelineCanvas::blockRect(size_t row, size_t block) const {
  const PipelineBlock& b = chart_.rows[row].blocks[block];
  const QRect w = windowRect(row);
  const int x0 = static_cast<int>(xOf(b.beginNs)), x1 = static_cast<int>(xOf(b.endNs));
  return QRect(x0, w.top(), std::max(1, x1 - x0), w.height());
}

void PipelineCanvas::paintEvent(QPaintEvent*) {
  QPainter p(this);
  p.fillRect(rect(), palette::kBackground);
  if (!chart_.present()) {
    p.setPen(palette::kText);
    p.drawText(rect(), Qt::AlignCenter, "This run has no pipeline parallelism (no meta 'pipeline', no pass spans).");
    return;
  }
  for (size_t r = 0; r < chart_.rows.size(); ++r) {
    const PipelineRow& row = chart_.rows[r];
    const QRect window = windowRect(r);
    const bool longest = row.stage == chart_.longestStage;
    p.setPen(longest ? kLongest : palette::kText);
    p.drawText(QRect(6, window.top(), kLabelWidth - 10, kRowHeight), Qt::AlignVCenter,
               QString("stage %1 · rank %2%3").arg(row.stage).arg(row.rank).arg(longest ? "\nlongest stage" : ""));
    p.fillRect(window, kBubble);
    for (size_t b = 0; b < row.blocks.size(); ++b) {
      const PipelineBlock& block = row.blocks[b];
      const QRect box = blockRect(r, b);
      QColor c = block.backward ? kBackward : kForward;
      if (block.chunk > 0) c = c.lighter(100 + 15 * block.chunk);
      p.fillRect(box, c);
      p.setPen(QColor(20, 20, 24));
      p.drawRect(box.adjusted(0, 0, -1, -1));
      if (box.width() >= 14) {
        p.setPen(Qt::white);
        p.drawText(box, Qt::AlignCenter,
                   block.chunk >= 0 ? QString("%1.%2").arg(block.microbatch).arg(block.chunk)
                                    : QString::number(block.microbatch));
      }
    }
    if (longest) {
      p.setPen(QPen(kLongest, 2));
      p.setBrush(Qt::NoBrush);
      p.drawRect(window.adjusted(-2, -2, 1, 1));
    }
  }
  // Time axis: the step's window from its start.
  const int y = kTop + static_cast<int>(chart_.rows.size()) * (kRowHeight + kRowGap) + 4;
  p.setPen(palette::kText);
  p.drawText(QPointF(xOf(chart_.beginNs), y + 14), "0");
  const QString total = formatDuration(static_cast<double>(chart_.endNs - chart_.beginNs));
  p.drawText(QRectF(xOf(chart_.endNs) - 120, y, 120, 18), Qt::AlignRight | Qt::AlignVCenter, total);
  p.drawText(QRectF(xOf(chart_.beginNs), y, xOf(chart_.endNs) - xOf(chart_.beginNs), 18), Qt::AlignCenter,
             "forward (blue) · backward (green) · idle in the window: the bubble (red-brown)");
}

void PipelineCanvas::mousePressEvent(QMouseEvent* e) {
  for (size_t r = 0; r < chart_.rows.size(); ++r)
    for (size_t b = 0; b < chart_.rows[r].blocks.size(); ++b)
      if (blockRect(r, b).contains(e->pos())) {
        emit blockClicked(chart_.rows[r].blocks[b].span);
        return;
      }
}

PipelineView::PipelineView(QWidget* parent) : QWidget(parent) {
  auto* layout = new QVBoxLayout(this);
  auto* bar = new QHBoxLayout;
  bar->addWidget(new QLabel("Step", this));
  step_ = new QSpinBox(this);
  step_->setRange(0, 0);
  bar->addWidget(step_);
  headline_ = new QLabel(this);
  headline_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  bar->addWidget(headline_, 1);
  layout->addLayout(bar);
  canvas_ = new PipelineCanvas(this);
  auto* scroll = new QScrollArea(this);
  scroll->setWidget(canvas_);
  scroll->setWidgetResizable(true);
  layout->addWidget(scroll, 1);
  connect(step_, &QSpinBox::valueChanged, this, [this](int step) {
    if (run_ && canvas_->chart().step != step) showStep(step);
  });
  connect(canvas_, &PipelineCanvas::blockClicked, this, &PipelineView::spanRequested);
}

void PipelineView::setRun(RunPtr run) {
  run_ = std::move(run);
  showStep(-1);
}

void PipelineView::setAnalysis(AnalysisPtr analysis) {
  analysis_ = std::move(analysis);
  refresh();
}

void PipelineView::showStep(int step) {
  // A run still shown from its lane summary has no pass spans of its own yet: wait for every span.
  canvas_->setChart(run_ && !run_->summaryOnly() ? pipelineChart(*run_, step) : PipelineChart{});
  const PipelineChart& c = canvas_->chart();
  step_->blockSignals(true);
  step_->setRange(c.steps.empty() ? 0 : c.steps.front(), c.steps.empty() ? 0 : c.steps.back());
  step_->setValue(std::max(0, c.step));
  step_->setEnabled(c.present());
  step_->blockSignals(false);
  refresh();
}

void PipelineView::refresh() {
  const PipelineChart& c = canvas_->chart();
  if (!c.present()) {
    if (run_ && run_->windowed)
      headline_->setText(QString("This run has %1 spans, more than the viewer reads whole; the pipeline chart needs "
                                 "every pass span (TPSCOPE_GUI_FULL_LOAD_LIMIT above %1 reads them all).")
                             .arg(run_->timeline->spanCount()));
    else
      headline_->setText(run_ && run_->summaryOnly() ? "Reading every span…" : "No pipeline parallelism in this run.");
    return;
  }
  const double window = static_cast<double>(std::max<int64_t>(1, c.endNs - c.beginNs));
  QStringList idle;
  for (const PipelineRow& row : c.rows)
    idle << QString("stage %1 %2").arg(row.stage).arg(percent(1.0 - static_cast<double>(row.busyNs) / window));
  QString text = QString("%1 · %2 stages × %3 micro-batches%4 · analytic bubble %5 · this step's idle: %6")
                     .arg(QString::fromStdString(c.schedule))
                     .arg(c.stages)
                     .arg(c.microbatches)
                     .arg(c.virtualStages > 1 ? QString(" × %1 chunks").arg(c.virtualStages) : QString())
                     .arg(percent(analysis::analyticPipelineBubble(c.schedule, c.stages, c.microbatches,
                                                                   c.virtualStages)))
                     .arg(idle.join(", "));
  if (analysis_ && analysis_->pipeline.present) {
    QStringList mean;
    for (const auto& s : analysis_->pipeline.perStage)
      mean << QString("stage %1 %2").arg(s.stage).arg(QString::number(s.bubblePct, 'f', 1) + " %");
    text += QString(" · measured over %1 steps: %2").arg(analysis_->pipeline.steps).arg(mean.join(", "));
  }
  headline_->setText(text);
}

}  // namespace tpscope::gui
