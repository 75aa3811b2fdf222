#include "tpscope/analysis/units_text.h"

#include <cmath>
#include <cstdio>

namespace tpscope::analysis::text {

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string ms(double ns) { return fixed(ns / 1e6, 3); }

std::string pct(double v) { return fixed(v, 1) + "%"; }

std::string bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::fabs(b) >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  if (u == 0) return fixed(b, 0) + " B";
  return (b == std::floor(b) ? fixed(b, 0) : fixed(b, 1)) + " " + units[u];
}

std::string gbps(double v) {
  char buf[32];
  if (v >= 100) std::snprintf(buf, sizeof buf, "%.0f", v);
  else std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

std::string sci(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2g", v);
  return buf;
}

}  // namespace tpscope::analysis::text
