// The main window: tabs Timeline / Gradient health / Communication / Desync / Findings, a details dock, span search,
// a run whose root-cause chain has a warning or worse opens on the Findings tab (its first root cause selected),
// File → Open (file or capture folder), recent files, drag and drop, live follow, shortcuts under Help, window state
// kept in QSettings. A run that cannot be read shows an error dialog and keeps the previous run.
//
// Threading: UI thread; loading and analyses run in RunLoader, frames in the timeline's FrameScheduler, search on
// the global thread pool.
#pragma once

#include <QLabel>
#include <QLineEdit>
#include <QMainWindow>
#include <QPlainTextEdit>
#include <QSettings>
#include <QTabWidget>
#include <memory>

#include "communication_view.h"
#include "desync_view.h"
#include "findings_view.h"
#include "grad_health_view.h"
#include "pipeline_view.h"
#include "timeline_view.h"
#include "tpscope/gui/live_follower.h"
#include "tpscope/gui/run_loader.h"

namespace tpscope::gui {

class MainWindow : public QMainWindow {
  Q_OBJECT
 public:
  enum Tab { kTimelineTab, kGradTab, kCommTab, kDesyncTab, kFindingsTab, kPipelineTab };
  // `settingsFile`: an INI file to keep state in (tests); empty: the user's settings.
  explicit MainWindow(const QString& settingsFile = {}, QWidget* parent = nullptr);
  ~MainWindow() override;

  void openPath(const QString& path);
  void reload();
  void setFollowLive(bool on);

  // For tests and screenshots.
  RunLoader* loader() { return &loader_; }
  RunPtr run() const { return run_; }
  AnalysisPtr analysis() const { return analysis_; }
  TimelineView* timeline() { return timeline_; }
  QAction* criticalPathAction() { return criticalPathAction_; }
  GradHealthView* gradHealth() { return grad_; }
  CommunicationView* communication() { return comm_; }
  DesyncView* desync() { return desync_; }
  FindingsView* findings() { return findings_; }
  PipelineView* pipeline() { return pipeline_; }
  QTabWidget* tabs() { return tabs_; }
  QPlainTextEdit* details() { return details_; }
  QLabel* liveStall() { return liveStall_; }  // the open live stall line of a followed capture (hidden: none)
  const QString& lastError() const { return lastError_; }
  QStringList recentFiles() const;
  QString shortcutsText() const;
  void search(const QString& text);  // selects the next match (same text) or the first (new text)

 protected:
  void closeEvent(QCloseEvent*) override;
  void dragEnterEvent(QDragEnterEvent*) override;
  void dropEvent(QDropEvent*) override;

 private:
  void buildMenus();
  void onRunLoaded(RunPtr run, qint64 ms);
  void onAnalysisLoaded(AnalysisPtr analysis);
  void onFailed(const QString& path, const QString& message);
  void jumpToRankStep(int rank, int step, int layer = -1);
  void jumpToEvidence(const EvidenceTarget& target);
  void showCollective(const QString& group, qint64 seq);
  void addRecent(const QString& path);
  void rebuildRecentMenu();
  void saveState();
  void showLiveStall();

  std::unique_ptr<QSettings> settings_;
  RunLoader loader_;
  LiveFollower follower_;
  RunPtr run_;
  AnalysisPtr analysis_;
  QString path_, pendingPath_;
  bool reloading_ = false;
  bool freshOpen_ = false;  // the run on screen was opened (not reloaded) and its analysis has not arrived yet
  QString lastError_;
  QTabWidget* tabs_ = nullptr;
  TimelineView* timeline_ = nullptr;
  GradHealthView* grad_ = nullptr;
  CommunicationView* comm_ = nullptr;
  DesyncView* desync_ = nullptr;
  FindingsView* findings_ = nullptr;
  PipelineView* pipeline_ = nullptr;
  QPlainTextEdit* details_ = nullptr;
  QLabel* liveStall_ = nullptr;  // in the status bar, permanent
  QLineEdit* search_ = nullptr;
  QMenu* recentMenu_ = nullptr;
  QAction* followAction_ = nullptr;
  QAction* criticalPathAction_ = nullptr;  // View → Show critical path (checkable)
  QString searchText_;
  std::vector<SpanRef> matches_;
  size_t matchIndex_ = 0;
};

}  // namespace tpscope::gui
