#include "main_window.h"

#include <QApplication>
#include <QCloseEvent>
#include <QDockWidget>
#include <QDragEnterEvent>
#include <QFileDialog>
#include <QFileInfo>
#include <QMenuBar>
#include <QMessageBox>
#include <QMimeData>
#include <QStatusBar>
#include <QToolBar>

namespace tpscope::gui {

namespace {
constexpr int kMaxRecent = 10;

struct Shortcut {
  const char* keys;
  const char* what;
};
constexpr Shortcut kShortcuts[] = {
    {"Ctrl+O", "Open a run file"},
    {"Ctrl+Shift+O", "Open a capture folder (rank-*.db, live)"},
    {"F5", "Reload"},
    {"Ctrl+L", "Follow a capture in progress (live)"},
    {"Ctrl+1 … Ctrl+6", "Timeline, Gradient health, Communication, Desync, Findings, Pipeline"},
    {"Ctrl+F", "Search spans by name; Enter / F3: next match"},
    {"W / S, mouse wheel", "Zoom in / out (around the cursor)"},
    {"A / D, drag", "Pan left / right (drag also scrolls lanes)"},
    {"Shift+wheel", "Scroll lanes"},
    {"Shift+drag, drag on the ruler", "Measure a time range"},
    {"Click", "Select a span; a communication span selects its collective on every rank"},
    {"0 / Home", "Zoom to the whole run"},
    {"Click a group header", "Fold or unfold its lanes (a TP group, or a host)"},
    {"Ctrl+] / Ctrl+[", "Expand / collapse all lane groups"},
    {"Ctrl+P", "Show the what-if critical path of the median step over the timeline"},
    {"Esc", "Clear selection and measurement"},
    {"Double-click a finding", "Jump to its evidence"},
    {"F1", "This list"},
    {"Ctrl+Q", "Quit"},
};
}  // namespace

MainWindow::MainWindow(const QString& settingsFile, QWidget* parent) : QMainWindow(parent) {
  settings_ = settingsFile.isEmpty() ? std::make_unique<QSettings>("tpscope", "tpscope-gui")
                                     : std::make_unique<QSettings>(settingsFile, QSettings::IniFormat);
  setWindowTitle("tpscope");
  setAcceptDrops(true);
  tabs_ = new QTabWidget(this);
  timeline_ = new TimelineView(tabs_);
  grad_ = new GradHealthView(tabs_);
  comm_ = new CommunicationView(tabs_);
  desync_ = new DesyncView(tabs_);
  findings_ = new FindingsView(tabs_);
  pipeline_ = new PipelineView(tabs_);
  tabs_->addTab(timeline_, "Timeline");
  tabs_->addTab(grad_, "Gradient health");
  tabs_->addTab(comm_, "Communication");
  tabs_->addTab(desync_, "Desync");
  tabs_->addTab(findings_, "Findings");
  tabs_->addTab(pipeline_, "Pipeline");
  setCentralWidget(tabs_);

  auto* dock = new QDockWidget("Details", this);
  dock->setObjectName("details");
  details_ = new QPlainTextEdit(dock);
  details_->setReadOnly(true);
  details_->setPlaceholderText("Click a span or a collective.");
  dock->setWidget(details_);
  addDockWidget(Qt::RightDockWidgetArea, dock);

  buildMenus();
  liveStall_ = new QLabel(this);
  liveStall_->setObjectName("liveStall");
  liveStall_->setStyleSheet("QLabel { color: white; background: #b3261e; padding: 1px 6px; }");
  liveStall_->hide();
  statusBar()->addPermanentWidget(liveStall_);
  statusBar()->showMessage("Open a run: File → Open, or drop a run file here.");

  connect(&loader_, &RunLoader::runLoaded, this, &MainWindow::onRunLoaded);
  connect(&loader_, &RunLoader::analysisLoaded, this, &MainWindow::onAnalysisLoaded);
  connect(&loader_, &RunLoader::failed, this, &MainWindow::onFailed);
  connect(&follower_, &LiveFollower::changed, this, [this] {
    if (!loader_.busy()) reload();
  });
  connect(timeline_, &TimelineView::spanSelected, this, [this](SpanRef ref) {
    QString text = timeline_->describeSpan(ref);
    const CollectiveKey key = timeline_->selectedCollective();
    if (key.valid()) text += "\n\n" + timeline_->describeCollective(key);
    details_->setPlainText(text);
  });
  connect(timeline_, &TimelineView::rangeMeasured, this, [this](qint64 b, qint64 e) {
    statusBar()->showMessage(QString("Measured %1 ms").arg((e - b) / 1e6, 0, 'f', 3));
  });
  connect(grad_, &GradHealthView::jumpTo, this, &MainWindow::jumpToRankStep);
  connect(comm_, &CommunicationView::showCollective, this, &MainWindow::showCollective);
  connect(desync_, &DesyncView::showCollective, this, &MainWindow::showCollective);
  connect(findings_, &FindingsView::jumpToEvidence, this, &MainWindow::jumpToEvidence);
  connect(pipeline_, &PipelineView::spanRequested, this, [this](SpanRef span) {  // a pass block → its span
    if (!run_ || !run_->timeline->contains(span)) return;
    tabs_->setCurrentIndex(kTimelineTab);
    timeline_->selectSpan(span);
    details_->setPlainText(timeline_->describeSpan(span));
  });

  restoreGeometry(settings_->value("window/geometry").toByteArray());
  restoreState(settings_->value("window/state").toByteArray());
  tabs_->setCurrentIndex(settings_->value("window/tab", 0).toInt());
  if (!settings_->contains("window/geometry")) resize(1400, 850);
  rebuildRecentMenu();
}

MainWindow::~MainWindow() { loader_.waitForDone(); }

void MainWindow::buildMenus() {
  QMenu* file = menuBar()->addMenu("&File");
  file->addAction("&Open run file…", QKeySequence::Open, this, [this] {
    const QString path = QFileDialog::getOpenFileName(this, "Open run", QString(),
                                                      "tpscope traces (*.db);;All files (*)");
    if (!path.isEmpty()) openPath(path);
  });
  file->addAction("Open capture &folder…", QKeySequence("Ctrl+Shift+O"), this, [this] {
    const QString path = QFileDialog::getExistingDirectory(this, "Open capture folder");
    if (!path.isEmpty()) openPath(path);
  });
  recentMenu_ = file->addMenu("Open &recent");
  file->addAction("&Reload", QKeySequence(Qt::Key_F5), this, [this] { reload(); });
  followAction_ = file->addAction("Follow &live capture");
  followAction_->setCheckable(true);
  followAction_->setShortcut(QKeySequence("Ctrl+L"));
  connect(followAction_, &QAction::toggled, this, [this](bool on) { setFollowLive(on); });
  file->addSeparator();
  file->addAction("&Quit", QKeySequence::Quit, this, [this] { close(); });

  QMenu* view = menuBar()->addMenu("&View");
  const char* names[] = {"&Timeline", "&Gradient health", "&Communication", "&Desync", "&Findings", "&Pipeline"};
  for (int i = 0; i < 6; ++i)
    view->addAction(names[i], QKeySequence(QString("Ctrl+%1").arg(i + 1)), this, [this, i] { tabs_->setCurrentIndex(i); });
  view->addSeparator();
  view->addAction("Zoom to &whole run", QKeySequence(Qt::Key_Home), this, [this] { timeline_->zoomAll(); });
  view->addAction("&Expand all lane groups", QKeySequence(Qt::CTRL | Qt::Key_BracketRight), this,
                  [this] { timeline_->setGroupsCollapsed(false); });
  view->addAction("&Collapse all lane groups", QKeySequence(Qt::CTRL | Qt::Key_BracketLeft), this,
                  [this] { timeline_->setGroupsCollapsed(true); });
  criticalPathAction_ = view->addAction("Show critical &path");
  criticalPathAction_->setCheckable(true);
  criticalPathAction_->setShortcut(QKeySequence("Ctrl+P"));
  connect(criticalPathAction_, &QAction::toggled, this, [this](bool on) {
    timeline_->setShowCriticalPath(on);
    if (on) statusBar()->showMessage(timeline_->criticalPathText());
  });

  auto* bar = addToolBar("Search");
  bar->setObjectName("search");
  search_ = new QLineEdit(bar);
  search_->setPlaceholderText("Search spans by name (Ctrl+F)");
  search_->setClearButtonEnabled(true);
  search_->setMaximumWidth(320);
  bar->addWidget(search_);
  connect(search_, &QLineEdit::returnPressed, this, [this] { search(search_->text()); });
  bar->addAction(followAction_);
  view->addAction("&Find span…", QKeySequence::Find, this, [this] {
    search_->setFocus();
    search_->selectAll();
  });
  view->addAction("Find &next", QKeySequence(Qt::Key_F3), this, [this] { search(search_->text()); });

  QMenu* help = menuBar()->addMenu("&Help");
  help->addAction("&Keyboard shortcuts", QKeySequence(Qt::Key_F1), this, [this] {
    auto* box = new QMessageBox(QMessageBox::Information, "Keyboard shortcuts", shortcutsText(), QMessageBox::Close, this);
    box->setAttribute(Qt::WA_DeleteOnClose);
    box->setTextFormat(Qt::RichText);
    box->open();
  });
  help->addAction("&About tpscope", this, [this] {
    QMessageBox::about(this, "About tpscope",
                       "tpscope-gui — the trace viewer of tpscope, a toolkit that makes tensor-parallel training "
                       "observable.");
  });
}

QString MainWindow::shortcutsText() const {
  QString html = "<table cellspacing=4>";
  for (const auto& s : kShortcuts) html += QString("<tr><td><b>%1</b></td><td>%2</td></tr>").arg(s.keys, s.what);
  return html + "</table>";
}

void MainWindow::openPath(const QString& path) {
  pendingPath_ = path;
  reloading_ = false;
  lastError_.clear();
  statusBar()->showMessage("Loading " + path + " …");
  loader_.load(path);
}

void MainWindow::reload() {
  if (path_.isEmpty()) return;
  pendingPath_ = path_;
  reloading_ = true;
  loader_.load(path_);
}

void MainWindow::setFollowLive(bool on) {
  if (followAction_->isChecked() != on) followAction_->setChecked(on);  // re-enters through toggled
  if (on && !path_.isEmpty()) follower_.follow(path_, 1000);
  else follower_.stop();
}

void MainWindow::onRunLoaded(RunPtr run, qint64 ms) {
  // Every span replacing the summary the run opened on (RunLoader) keeps the view, as a reload does.
  const bool detail = run_ && run_->summaryOnly() && !run->summaryOnly() && pendingPath_ == path_;
  const bool keep = (reloading_ || detail) && run_ != nullptr;
  run_ = std::move(run);
  path_ = pendingPath_;
  searchText_.clear();  // matches index the previous timeline
  matches_.clear();
  timeline_->setRun(run_, keep);
  grad_->setRun(run_);
  if (keep && analysis_) grad_->setAnalysis(analysis_);
  comm_->setRun(run_);
  findings_->setRun(run_, analysis_ && keep ? analysis_ : nullptr);
  pipeline_->setRun(run_);
  if (!keep) {
    analysis_.reset();
    comm_->setAnalysis(nullptr);
    desync_->setAnalysis(nullptr);
    pipeline_->setAnalysis(nullptr);
  }
  setWindowTitle(QString("tpscope — %1%2").arg(path_, run_->live ? " (capture folder)" : ""));
  statusBar()->showMessage(QString("%1 spans · %2 ranks · %3 collective records · %4 in %5 ms%6")
                               .arg(run_->timeline->spanCount())
                               .arg(run_->rankIds().size())
                               .arg(run_->collectives.size())
                               .arg(run_->summaryOnly() ? "summary shown" : detail ? "every span read" : "opened")
                               .arg(ms)
                               .arg(follower_.following() ? " · following live"
                                    : run_->windowed      ? " · spans read for the time shown when zoomed in"
                                    : run_->summaryOnly() ? " · reading every span…"
                                                          : ""));
  showLiveStall();
  freshOpen_ = !keep || (detail && freshOpen_);
  if (!reloading_ && !detail) {
    addRecent(path_);
    if (run_->live) setFollowLive(true);
    else if (follower_.following()) follower_.follow(path_, 1000);
  }
  reloading_ = false;
}

// The live stall line of a capture folder (the journal capture or `tpscope watch` keep: alerts of kind 'stall'): the
// newest of those still open (critical); hidden when every one resumed (info), and for run files.
void MainWindow::showLiveStall() {
  const tracedb::AlertRow* open = nullptr;
  if (run_ && run_->live)
    for (const tracedb::AlertRow& a : run_->alerts)
      if (a.kind == "stall" && a.severity == "critical") open = &a;
  liveStall_->setVisible(open != nullptr);
  liveStall_->setText(open ? QString::fromStdString(open->message).section('\n', 0, 0) : QString());
  liveStall_->setToolTip(open ? QString::fromStdString(open->message) : QString());
}

void MainWindow::onAnalysisLoaded(AnalysisPtr analysis) {
  analysis_ = std::move(analysis);
  timeline_->setAnalysis(analysis_);
  comm_->setAnalysis(analysis_);
  desync_->setAnalysis(analysis_);
  findings_->setRun(run_, analysis_);
  pipeline_->setAnalysis(analysis_);
  grad_->setAnalysis(analysis_);  // the heatmap opens on the step of the analysis' first non-finite value
  // A freshly opened run whose chain has a warning or worse opens on the story, not on the timeline.
  if (freshOpen_ && chainNeedsAttention(*analysis_)) {
    tabs_->setCurrentIndex(kFindingsTab);
    statusBar()->showMessage("Root cause: " + QString::fromStdString(analysis_->chain.front().message));
  }
  freshOpen_ = false;
  if (!analysis_->errors.empty())
    statusBar()->showMessage("Some analyses failed: " + QString::fromStdString(analysis_->errors.front()));
}

void MainWindow::onFailed(const QString& path, const QString& message) {
  lastError_ = message;
  reloading_ = false;
  statusBar()->showMessage("Could not open " + path);
  auto* box = new QMessageBox(QMessageBox::Critical, "Cannot open run", "Could not open " + path + "\n\n" + message,
                              QMessageBox::Ok, this);
  box->setObjectName("errorDialog");
  box->setAttribute(Qt::WA_DeleteOnClose);
  box->open();
}

void MainWindow::jumpToRankStep(int rank, int step, int layer) {
  if (!run_) return;
  int64_t b = 0, e = 0;
  if (run_->stepWindow(rank, step, b, e)) {
    tabs_->setCurrentIndex(kTimelineTab);
    timeline_->showRange(b, e, rank);
    if (layer >= 0) {
      // Land on the layer's backward pass (where its gradients were computed), else on any span of the layer.
      SpanRef span = run_->timeline->findSpan(rank, b, e, layer, static_cast<int>(tracedb::Phase::Backward));
      if (!span.valid()) span = run_->timeline->findSpan(rank, b, e, layer);
      if (span.valid()) {
        timeline_->selectSpan(span);
        details_->setPlainText(timeline_->describeSpan(span));
      }
    }
    statusBar()->showMessage(layer >= 0 ? QString("Rank %1, step %2, layer %3").arg(rank).arg(step).arg(layer)
                                        : QString("Rank %1, step %2").arg(rank).arg(step));
  } else {
    statusBar()->showMessage(QString("No spans for rank %1 at step %2").arg(rank).arg(step));
  }
}

void MainWindow::showCollective(const QString& group, qint64 seq) {
  EvidenceTarget t;
  t.group = group;
  t.seq = seq;
  qint64 b = -1, e = -1;
  for (const auto& c : run_ ? run_->collectives : std::vector<tracedb::CollectiveRow>{})
    if (c.seq == seq && QString::fromStdString(c.group) == group) {
      b = b < 0 ? c.enqueueNs : std::min<qint64>(b, c.enqueueNs);
      e = std::max<qint64>(e, c.endNs.value_or(run_->endNs));
    }
  if (b >= 0) {
    t.timeNs = b;
    t.endNs = e;
  }
  jumpToEvidence(t);
}

void MainWindow::jumpToEvidence(const EvidenceTarget& target) {
  if (!run_) return;
  tabs_->setCurrentIndex(kTimelineTab);
  if (target.seq >= 0) {
    timeline_->selectCollective({target.group, target.seq});
    details_->setPlainText(timeline_->describeCollective({target.group, target.seq}));
  }
  if (target.seq < 0 && target.rank >= 0 && target.step >= 0 && target.layer >= 0) {
    jumpToRankStep(target.rank, target.step, target.layer);  // lands on the layer's span, not only its step
  } else if (target.timeNs && target.endNs) {
    timeline_->showRange(*target.timeNs, *target.endNs, target.rank);
  } else if (target.timeNs) {
    const qint64 half = std::max<qint64>(1'000'000, (run_->endNs - run_->beginNs) / 200);
    timeline_->showRange(*target.timeNs - half, *target.timeNs + half, target.rank);
  } else if (target.rank >= 0 && target.step >= 0) {
    jumpToRankStep(target.rank, target.step, target.layer);
  }
}

void MainWindow::search(const QString& text) {
  if (!run_ || text.isEmpty()) return;
  if (text != searchText_) {
    searchText_ = text;
    matches_ = run_->timeline->search(text.toStdString(), 100000);
    matchIndex_ = 0;
  } else if (!matches_.empty()) {
    matchIndex_ = (matchIndex_ + 1) % matches_.size();
  }
  if (matches_.empty()) {
    statusBar()->showMessage("No span named like \"" + text + "\"");
    return;
  }
  tabs_->setCurrentIndex(kTimelineTab);
  timeline_->selectSpan(matches_[matchIndex_]);
  details_->setPlainText(timeline_->describeSpan(matches_[matchIndex_]));
  statusBar()->showMessage(QString("Match %1 of %2%3")
                               .arg(matchIndex_ + 1)
                               .arg(matches_.size())
                               .arg(matches_.size() == 100000 ? "+" : ""));
}

QStringList MainWindow::recentFiles() const { return settings_->value("recent").toStringList(); }

void MainWindow::addRecent(const QString& path) {
  QStringList recent = recentFiles();
  const QString absolute = QFileInfo(path).absoluteFilePath();
  recent.removeAll(absolute);
  recent.prepend(absolute);
  while (recent.size() > kMaxRecent) recent.removeLast();
  settings_->setValue("recent", recent);
  rebuildRecentMenu();
}

void MainWindow::rebuildRecentMenu() {
  recentMenu_->clear();
  for (const QString& path : recentFiles()) recentMenu_->addAction(path, this, [this, path] { openPath(path); });
  recentMenu_->setEnabled(!recentMenu_->isEmpty());
}

void MainWindow::saveState() {
  settings_->setValue("window/geometry", QMainWindow::saveGeometry());
  settings_->setValue("window/state", QMainWindow::saveState());
  settings_->setValue("window/tab", tabs_->currentIndex());
  settings_->sync();
}

void MainWindow::closeEvent(QCloseEvent* e) {
  saveState();
  e->accept();
}

void MainWindow::dragEnterEvent(QDragEnterEvent* e) {
  if (e->mimeData()->hasUrls() && !e->mimeData()->urls().isEmpty() && e->mimeData()->urls().front().isLocalFile())
    e->acceptProposedAction();
}

void MainWindow::dropEvent(QDropEvent* e) {
  const auto urls = e->mimeData()->urls();
  if (!urls.isEmpty() && urls.front().isLocalFile()) {
    openPath(urls.front().toLocalFile());
    e->acceptProposedAction();
  }
}

}  // namespace tpscope::gui
