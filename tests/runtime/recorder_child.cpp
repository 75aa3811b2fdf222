// Helper process for the recorder's fault tests (spawned by recorder_process_test.cpp).
//
//   recorder_child kill    DIR   records batches, flushNow() after each, prints "flushed N" (spans committed so far)
//                                after each flush, forever (the parent SIGKILLs it)
//   recorder_child signal  DIR N records N spans with a 60 s flush interval, prints "ready", then sleeps (the parent
//                                sends SIGTERM, SIGINT or SIGUSR1)
//   recorder_child exit    DIR N records N spans and returns from main without stop(): the atexit dump
//   recorder_child env     N     startFromEnvironment(), records N spans, stop()
// Output is line-buffered on stdout (a pipe to the parent).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tpscope/probes/probes.h"
#include "tpscope/probes/runtime.h"

namespace tp = tpscope::probes;

namespace {

constexpr tp::Site kSite{"child.span", "", __FILE__, __LINE__, tp::SpanKind::Compute, tp::Phase::Forward};

void recordSpans(int n) {
  for (int i = 0; i < n; ++i) {
    tp::setStep(i);
    tp::SpanScope scope(&kSite, i % 7);
  }
}

int fail(const std::string& what) {
  std::fprintf(stderr, "recorder_child: %s\n", what.c_str());
  return 2;
}

tp::RuntimeOptions options(const char* dir) {
  tp::RuntimeOptions o;
  o.outDir = dir;
  o.runId = "child-run";
  o.rank.rank = 0;
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc < 2) return fail("usage: recorder_child kill|signal|exit|env ...");
  const std::string mode = argv[1];

  if (mode == "kill" && argc >= 3) {
    auto o = options(argv[2]);
    o.installSignalHandlers = false;
    if (auto s = tp::start(o); !s) return fail(s.message());
    for (;;) {
      recordSpans(1000);
      tp::flushNow();
      std::printf("flushed %lld\n", static_cast<long long>(tp::recorderStats().spansWritten));
    }
  }
  if (mode == "signal" && argc >= 4) {
    auto o = options(argv[2]);
    o.flushInterval = std::chrono::seconds(60);
    if (auto s = tp::start(o); !s) return fail(s.message());
    recordSpans(std::atoi(argv[3]));
    std::printf("ready\n");
    for (int i = 0; i < 600; ++i) usleep(100'000);
    return 3;  // the parent should have ended us long before
  }
  if (mode == "exit" && argc >= 4) {
    auto o = options(argv[2]);
    o.flushInterval = std::chrono::seconds(60);
    if (auto s = tp::start(o); !s) return fail(s.message());
    recordSpans(std::atoi(argv[3]));
    return 0;
  }
  if (mode == "env" && argc >= 3) {
    if (auto s = tp::startFromEnvironment(); !s) return fail(s.message());
    if (!tp::started()) return fail("not recording (TPSCOPE_OUT unset or empty)");
    recordSpans(std::atoi(argv[2]));
    tp::stop();
    return 0;
  }
  return fail("bad arguments");
}
