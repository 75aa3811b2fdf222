#include "tpscope/gui/live_follower.h"

#include <QFileInfo>

#include "tpscope/analysis/stall_journal.h"
#include "tpscope/gui/run_data.h"

namespace tpscope::gui {

LiveFollower::LiveFollower(QObject* parent) : QObject(parent) {
  connect(&timer_, &QTimer::timeout, this, [this] {
    if (poll()) emit changed();
  });
}

void LiveFollower::follow(const QString& path, int intervalMs) {
  path_ = path;
  last_ = snapshot();
  timer_.start(intervalMs);
}

void LiveFollower::stop() { timer_.stop(); }

std::map<QString, std::pair<qint64, qint64>> LiveFollower::snapshot() const {
  std::map<QString, std::pair<qint64, qint64>> out;
  if (path_.isEmpty()) return out;
  for (const auto& file : traceFilesOf(path_.toStdString())) {
    const QString f = QString::fromStdString(file.string());
    for (const QString& name : {f, f + "-wal"}) {
      const QFileInfo info(name);
      if (info.exists()) out[name] = {info.size(), info.lastModified().toMSecsSinceEpoch()};
    }
  }
  for (const auto& journal : analysis::stallJournalsIn(path_.toStdString())) {  // a new or resumed stall line
    const QFileInfo info(QString::fromStdString(journal.string()));
    out[info.filePath()] = {info.size(), info.lastModified().toMSecsSinceEpoch()};
  }
  return out;
}

bool LiveFollower::poll() {
  auto now = snapshot();
  const bool changed = now != last_;
  last_ = std::move(now);
  return changed;
}

}  // namespace tpscope::gui
