// What capture prints while the ranks run. On a terminal: one progress line redrawn in place
//   step 812/1000 ████████████████████▋     loss 2.91   41.2k tok/s   ETA 1m12s
// with messages (alerts, the watchdog) printed above it. Otherwise plain lines: one per new step, at most one every
// `plainEvery`, and always the last one.
//
// Threading: the launcher's thread only.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

namespace tpscope::cli::capture {

struct ProgressLine {
  int step = 0;
  int totalSteps = 0;      // 0: unknown
  double loss = 0;
  bool haveLoss = false;
  double tokensPerS = 0;   // global
  double etaS = -1;        // < 0: unknown
};

class ProgressDisplay {
 public:
  ProgressDisplay(std::FILE* out, bool tty, std::chrono::milliseconds plainEvery = std::chrono::seconds(2));
  void update(const ProgressLine& line);
  // Prints `text` (one or more lines) above the progress line.
  void message(const std::string& text);
  // Ends the progress line (prints the last state on a plain stream).
  void finish();

  static std::string formatLine(const ProgressLine& line, bool bar);
  static std::string formatDuration(double seconds);  // "42s", "3m05s", "1h02m"
  static std::string formatRate(double perS);         // "812", "41.2k", "3.10M"

 private:
  void clearLine();

  std::FILE* out_;
  bool tty_;
  std::chrono::milliseconds plainEvery_;
  std::chrono::steady_clock::time_point lastPlain_{};
  ProgressLine last_;
  int lastPrintedStep_ = -1;
  bool drawn_ = false;
  bool updated_ = false;
};

}  // namespace tpscope::cli::capture
