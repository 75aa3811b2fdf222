// A translation unit built with the probes compiled out: every TPS_* macro must vanish (no span, no step, no
// counter) even while a recorder is running in the same process.
#undef TPSCOPE_PROBES_ENABLED
#define TPSCOPE_PROBES_ENABLED 0
#include "tpscope/probes/probes.h"

int compiledOutWork(int n) {
  int done = 0;
  for (int i = 0; i < n; ++i) {
    TPS_STEP(i);
    TPS_SPAN("compiled.out", Compute, Forward);
    TPS_SPAN_LAYER("compiled.out.layer", Compute, Backward, i);
    TPS_COUNTER("compiled.out.counter", i);
    ++done;
  }
  return done;
}
