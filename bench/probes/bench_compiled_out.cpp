// The same span site as bench_probes.cpp's, in a translation unit with the probes compiled out.
#undef TPSCOPE_PROBES_ENABLED
#define TPSCOPE_PROBES_ENABLED 0
#include "tpscope/probes/probes.h"

__attribute__((noinline)) void spanCompiledOut(int* work) {
  TPS_SPAN("bench.span", Compute, Forward);
  ++*work;
}
