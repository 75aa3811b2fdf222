#include "capture/progress_display.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace tpscope::cli::capture {

ProgressDisplay::ProgressDisplay(std::FILE* out, bool tty, std::chrono::milliseconds plainEvery)
    : out_(out), tty_(tty), plainEvery_(plainEvery) {}

std::string ProgressDisplay::formatDuration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const auto t = static_cast<int64_t>(std::llround(s));
  if (t < 60) return fmt::format("{}s", t);
  if (t < 3600) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}h{:02}m", t / 3600, (t % 3600) / 60);
}

std::string ProgressDisplay::formatRate(double v) {
  if (!std::isfinite(v) || v <= 0) return "0";
  if (v < 1e3) return fmt::format("{:.0f}", v);
  if (v < 1e6) return fmt::format("{:.1f}k", v / 1e3);
  return fmt::format("{:.2f}M", v / 1e6);
}

std::string ProgressDisplay::formatLine(const ProgressLine& l, bool bar) {
  std::string s = l.totalSteps > 0 ? fmt::format("step {}/{}", l.step, l.totalSteps) : fmt::format("step {}", l.step);
  if (bar && l.totalSteps > 0) {
    // 24 cells, eighths of a cell with the Unicode block elements.
    static const char* kEighths[] = {"", "▏", "▎", "▍", "▌", "▋", "▊", "▉"};
    constexpr int kCells = 24;
    const double frac = std::clamp(static_cast<double>(l.step) / l.totalSteps, 0.0, 1.0);
    const int eighths = static_cast<int>(frac * kCells * 8);
    std::string b;
    for (int i = 0; i < eighths / 8; ++i) b += "█";
    int used = eighths / 8;
    if (eighths % 8 != 0) {
      b += kEighths[eighths % 8];
      ++used;
    }
    b.append(static_cast<size_t>(kCells - used), ' ');
    s += " " + b;
  }
  if (l.haveLoss) s += fmt::format("  loss {:.4g}", l.loss);
  if (l.tokensPerS > 0) s += fmt::format("  {} tok/s", formatRate(l.tokensPerS));
  if (l.etaS >= 0 && l.totalSteps > 0 && l.step < l.totalSteps) s += "  ETA " + formatDuration(l.etaS);
  return s;
}

void ProgressDisplay::clearLine() {
  if (tty_ && drawn_) {
    std::fputs("\r\033[K", out_);
    drawn_ = false;
  }
}

void ProgressDisplay::update(const ProgressLine& line) {
  last_ = line;
  updated_ = true;
  if (tty_) {
    std::fputs(("\r\033[K" + formatLine(line, true)).c_str(), out_);
    drawn_ = true;
    std::fflush(out_);
    return;
  }
  const auto now = std::chrono::steady_clock::now();
  if (line.step != lastPrintedStep_ && (now - lastPlain_ >= plainEvery_ || line.step == line.totalSteps)) {
    std::fputs((formatLine(line, false) + "\n").c_str(), out_);
    std::fflush(out_);
    lastPrintedStep_ = line.step;
    lastPlain_ = now;
  }
}

void ProgressDisplay::message(const std::string& text) {
  clearLine();
  std::fputs(text.c_str(), out_);
  if (text.empty() || text.back() != '\n') std::fputc('\n', out_);
  if (tty_ && updated_) {
    std::fputs(formatLine(last_, true).c_str(), out_);
    drawn_ = true;
  }
  std::fflush(out_);
}

void ProgressDisplay::finish() {
  if (tty_) {
    if (drawn_) std::fputc('\n', out_);
    drawn_ = false;
  } else if (last_.step != lastPrintedStep_ && last_.step > 0) {
    std::fputs((formatLine(last_, false) + "\n").c_str(), out_);
  }
  std::fflush(out_);
}

}  // namespace tpscope::cli::capture
