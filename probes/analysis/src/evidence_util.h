// Internal: short helpers for building findings' evidence and messages.
#pragma once

#include <cstdio>
#include <string>

#include "tpscope/analysis/finding.h"

namespace tpscope::analysis::detail {

inline EvidenceField f(const char* name, EvidenceValue v) { return EvidenceField{name, std::move(v)}; }

// printf-style number for messages: g3(2.1e4) = "2.1e+04", g3(3.2) = "3.2".
inline std::string g3(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

}  // namespace tpscope::analysis::detail
