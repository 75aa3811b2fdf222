// Rewrites the names in a run file (span names, thread names, host names, a process group) into markup that would
// run script or fetch from the network if a report pasted it unescaped — for the HTML report's escaping tests. Every
// payload marks the page (body[data-pwned]) when it runs, and contains kHostileMarker so a test can find it.
#pragma once

#include <filesystem>
#include <string_view>

#include "tpscope/tracedb/status.h"

namespace tpscope::testing {

inline constexpr std::string_view kHostileMarker = "pwn";

tracedb::Status makeNamesHostile(const std::filesystem::path& run);

}  // namespace tpscope::testing
