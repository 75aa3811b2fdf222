// Internal: short helpers for building findings' evidence and messages.
#pragma once

#include <cstdio>
#include <string>

#include "tpscope/analysis/finding.h"

namespace tpscope::analysis::detail {

// One named field of a finding's evidence or citation: field("rank", int64_t{3}).
inline EvidenceField field(const char* name, EvidenceValue v) { return EvidenceField{name, std::move(v)}; }

// A number for messages, to three significant digits (printf %.3g): threeDigits(2.1e4) = "2.1e+04",
// threeDigits(3.2) = "3.2".
inline std::string threeDigits(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

}  // namespace tpscope::analysis::detail
