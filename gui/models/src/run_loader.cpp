#include "tpscope/gui/run_loader.h"

#include <QElapsedTimer>
#include <QThread>

namespace tpscope::gui {

RunLoader::RunLoader(QObject* parent) : QObject(parent) {
  qRegisterMetaType<RunPtr>();
  qRegisterMetaType<AnalysisPtr>();
  pool_.setMaxThreadCount(1);  // one load at a time; the load itself uses its own worker threads
}

RunLoader::~RunLoader() { pool_.waitForDone(); }

void RunLoader::waitForDone() { pool_.waitForDone(); }

void RunLoader::load(const QString& path, bool withAnalysis) {
  const quint64 generation = ++generation_;
  ++inFlight_;
  pool_.start([this, path, withAnalysis, generation] {
    QElapsedTimer timer;
    timer.start();
    LoadOptions options;
    options.workers = std::max(1, QThread::idealThreadCount());
    if (const QByteArray limit = qgetenv("TPSCOPE_GUI_FULL_LOAD_LIMIT"); !limit.isEmpty()) {
      bool ok = false;
      const qlonglong n = limit.toLongLong(&ok);
      if (ok && n >= 0) options.fullLoadLimit = n;
    }
    auto shown = [&](RunPtr run, qint64 ms) {
      QMetaObject::invokeMethod(this, [this, run, ms, generation] {
        if (generation == generation_) emit runLoaded(run, ms);
      });
    };
    auto fail = [&](const std::string& error) {
      const QString message = QString::fromStdString(error);
      QMetaObject::invokeMethod(this, [this, path, message, generation] {
        --inFlight_;
        if (generation == generation_) emit failed(path, message);
      });
    };
    // One opened run for the views and the analysis: a capture folder's rank files merged once (opened_run.h).
    auto opened = openRun(path.toStdString());
    if (!opened) return fail(opened.error());
    const OpenedRun& file = **opened;
    auto analyse = [&] {
      if (!withAnalysis) return;
      auto analysis = std::make_shared<const AnalysisData>(loadAnalysis(file));
      QMetaObject::invokeMethod(this, [this, analysis, generation] {
        if (generation == generation_) emit analysisLoaded(analysis);
      });
    };
    // A run file with a lane summary is on screen from the summary first; every span follows (the same load).
    if (auto summary = loadRunSummary(file, options); summary && *summary) {
      RunPtr first = *summary;
      shown(first, timer.elapsed());
      options.tablesFrom = first;
      if (first->windowed) {  // too big to read whole: the view reads the spans of what it shows
        analyse();
        QMetaObject::invokeMethod(this, [this] { --inFlight_; });
        return;
      }
    }
    auto run = loadRun(file, options);
    if (!run) return fail(run.error());
    RunPtr loaded = *run;
    shown(loaded, timer.elapsed());
    analyse();
    writeTimelineCache(*loaded);  // after the run is on screen: the next open of this file skips the span table
    QMetaObject::invokeMethod(this, [this] { --inFlight_; });
  });
}

}  // namespace tpscope::gui
