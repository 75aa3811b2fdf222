// Text output helpers: aligned tables and human units (ms, %, KiB/MiB, GB/s). Output is deterministic.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "tpscope/analysis/units_text.h"

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

// Units: one formatting shared with the HTML report (tpscope/analysis/units_text.h).
using analysis::text::bytes;
using analysis::text::fixed;
using analysis::text::gbps;
using analysis::text::ms;
using analysis::text::pct;
using analysis::text::sci;

}  // namespace tpscope::cli
