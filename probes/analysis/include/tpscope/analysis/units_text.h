// Human units for reports (the CLI's tables, the HTML report): one formatting of ms, %, bytes and GB/s, so the same
// figure reads the same everywhere. Output is deterministic (no locale).
#pragma once

#include <string>

namespace tpscope::analysis::text {

std::string fixed(double v, int decimals);
std::string ms(double ns);    // "412.300": milliseconds with 3 decimals (µs resolution)
std::string pct(double v);    // "71.3%"
std::string bytes(double b);  // "512 B", "64 KiB", "1.5 MiB", "2.0 GiB"
std::string gbps(double v);   // "182", "1.25", "0.00512"
std::string sci(double v);    // "0.031", "2.1e-09": two significant digits (p-values)

}  // namespace tpscope::analysis::text
