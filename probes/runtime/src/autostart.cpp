// Linked in through the tpscope::probes_autostart object library: starts the recorder from the environment before
// main() when TPSCOPE_OUT is set, so a launcher can record any program that links the probes.
#include <cstdio>

#include "tpscope/probes/runtime.h"

namespace {
const bool g_started = [] {
  const tpscope::tracedb::Status s = tpscope::probes::startFromEnvironment();
  if (!s) std::fprintf(stderr, "%s\n", s.message().c_str());
  return s.isOk();
}();
}  // namespace
