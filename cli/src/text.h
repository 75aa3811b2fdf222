// Text output helpers: aligned tables and human units (ms, %, KiB/MiB, GB/s). Output is deterministic.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace tpscope::cli {

// A table, columns separated by two spaces. `align` has one letter per column, 'l' (text) or 'r' (numbers);
// by default the first column is left-aligned and the others right-aligned.
class Table {
 public:
  explicit Table(std::vector<std::string> header, std::string align = "")
      : header_(std::move(header)), align_(std::move(align)) {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  bool empty() const { return rows_.empty(); }
  void print(std::ostream& out, const std::string& indent = "") const;

 private:
  std::vector<std::string> header_;
  std::string align_;
  std::vector<std::vector<std::string>> rows_;
};

std::string fixed(double v, int decimals);
std::string ms(double ns);           // "412.300": milliseconds with 3 decimals (µs resolution)
std::string pct(double v);           // "71.3%"
std::string bytes(double b);         // "512 B", "64 KiB", "1.5 MiB", "2.0 GiB"
std::string gbps(double v);          // "182", "1.25", "0.00512"
std::string sci(double v);           // "0.031", "2.1e-09": two significant digits (p-values)

}  // namespace tpscope::cli
