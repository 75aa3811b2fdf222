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
    auto analyse = [&](const RunPtr& run) {
      if (!withAnalysis) return;
      auto analysis = std::make_shared<const AnalysisData>(loadAnalysis(run->files));
      QMetaObject::invokeMethod(this, [this, analysis, generation] {
        if (generation == generation_) emit analysisLoaded(analysis);
      });
    };
    // A run file with a lane summary is on screen from the summary first; every span follows (the same load).
    if (auto summary = loadRunSummary(path.toStdString(), options); summary && *summary) {
      RunPtr first = *summary;
      shown(first, timer.elapsed());
      options.tablesFrom = first;
      if (first->windowed) {  // too big to read whole: the view reads the spans of what it shows
        analyse(first);
        QMetaObject::invokeMethod(this, [this] { --inFlight_; });
        return;
      }
    }
    auto run = loadRun(path.toStdString(), options);
    if (!run) {
      const QString message = QString::fromStdString(run.error());
      QMetaObject::invokeMethod(this, [this, path, message, generation] {
        --inFlight_;
        if (generation == generation_) emit failed(path, message);
      });
      return;
    }
    RunPtr loaded = *run;
    shown(loaded, timer.elapsed());
    analyse(loaded);
    writeTimelineCache(*loaded);  // after the run is on screen: the next open of this file skips the span table
    QMetaObject::invokeMethod(this, [this] { --inFlight_; });
  });
}

}  // namespace tpscope::gui
