// Live follow of a capture in progress: polls the trace files of a path (the run file, or the rank files of a
// capture folder, each with its SQLite -wal file, and the folder's stall journals: analysis/stall_journal.h) and
// emits changed() when any of them grew, changed time, or a new rank file appeared. Polling, not file-system
// notifications: SQLite's WAL appends are not reliably reported, and a poll every intervalMs costs a few stat() calls.
//
// Threading: UI thread (a QTimer).
#pragma once

#include <QObject>
#include <QString>
#include <QTimer>
#include <map>

namespace tpscope::gui {

class LiveFollower : public QObject {
  Q_OBJECT
 public:
  explicit LiveFollower(QObject* parent = nullptr);
  void follow(const QString& path, int intervalMs = 1000);  // takes the current state as the baseline
  void stop();
  bool following() const { return timer_.isActive(); }
  const QString& path() const { return path_; }
  // One poll now (the timer calls it); true if something changed since the last poll.
  bool poll();

 signals:
  void changed();

 private:
  std::map<QString, std::pair<qint64, qint64>> snapshot() const;  // file → (size, mtime ms)
  QString path_;
  QTimer timer_;
  std::map<QString, std::pair<qint64, qint64>> last_;
};

}  // namespace tpscope::gui
