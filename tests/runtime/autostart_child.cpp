// A program that only uses the probe API: linked with tpscope::probes_autostart, it is recorded when TPSCOPE_OUT is
// set, without a line of recorder code (spawned by recorder_process_test.cpp).
#include <cstdlib>

#include "tpscope/probes/probes.h"

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 100;
  static constexpr tpscope::probes::Site kSite{"autostart.span", "", __FILE__, __LINE__,
                                               tpscope::probes::SpanKind::Compute, tpscope::probes::Phase::Forward};
  for (int i = 0; i < n; ++i) tpscope::probes::SpanScope span(&kSite);
  return 0;
}
