// Loads runs off the UI thread: the run's data and timeline first (what the first frame needs), the analyses after,
// both from one opened run (opened_run.h: a capture folder's rank files merged once, for both).
// A run file with a lane summary is loaded twice over: runLoaded() comes first with the summary timeline
// (RunData::summaryOnly(), a fraction of a second whatever the run's size), then again with every span — unless the
// run has more spans than TPSCOPE_GUI_FULL_LOAD_LIMIT (default LoadOptions::kFullLoadLimit): such a run stays
// RunData::windowed, and the timeline reads the spans of the time it shows (loadWindow).
//
// Threading: a RunLoader lives on the UI thread; its work runs on its own thread pool and its signals are emitted on
// the thread the loader lives in. A newer load() supersedes an older one: results of a superseded load are dropped.
// The destructor waits for work in flight.
#pragma once

#include <QObject>
#include <QString>
#include <QThreadPool>
#include <memory>

#include "tpscope/gui/analysis_data.h"
#include "tpscope/gui/run_data.h"

namespace tpscope::gui {

using RunPtr = std::shared_ptr<const RunData>;
using AnalysisPtr = std::shared_ptr<const AnalysisData>;

class RunLoader : public QObject {
  Q_OBJECT
 public:
  explicit RunLoader(QObject* parent = nullptr);
  ~RunLoader() override;

  // Starts loading `path` (a run file, a rank file or a capture folder). `withAnalysis`: also run the analyses.
  void load(const QString& path, bool withAnalysis = true);
  bool busy() const { return inFlight_ > 0; }
  void waitForDone();

 signals:
  void runLoaded(tpscope::gui::RunPtr run, qint64 elapsedMs);
  void analysisLoaded(tpscope::gui::AnalysisPtr analysis);
  void failed(QString path, QString message);

 private:
  QThreadPool pool_;
  quint64 generation_ = 0;
  int inFlight_ = 0;
};

}  // namespace tpscope::gui

Q_DECLARE_METATYPE(tpscope::gui::RunPtr)
Q_DECLARE_METATYPE(tpscope::gui::AnalysisPtr)
