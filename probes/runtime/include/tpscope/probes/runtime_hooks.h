// Extension points of the recorder for sources that add rows while it flushes (probes/cupti). Less stable than
// runtime.h: training code does not need this header.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "tpscope/probes/probes.h"

namespace tpscope::tracedb {
class Writer;
}

namespace tpscope::probes {

// A host span written by the current flush, with its row id (spans.id).
struct HostSpanRef {
  int64_t id = 0;
  uint32_t thread = 0;  // dense thread id (spans.thread)
  SpanKind kind = SpanKind::Compute;
  int64_t beginNs = 0;  // ns since the file's epoch
  int64_t endNs = 0;
  int32_t step = -1;
  int16_t layer = -1;
  Phase phase = Phase::None;
};

// Valid only during FlushParticipant::onFlush.
struct FlushContext {
  tracedb::Writer& writer;                 // inside the flush's transaction; do not begin/commit
  int rank = 0;
  bool final = false;                      // the session's last flush: write everything still pending
  std::span<const HostSpanRef> hostSpans;  // grouped by thread; within a thread in ring order (by end time)
  int64_t* recordsWritten = nullptr;       // add what you wrote / dropped (recorder_stats)
  int64_t* recordsDropped = nullptr;
  int64_t* spansWritten = nullptr;
  int64_t* spansDropped = nullptr;
};

class FlushParticipant {
 public:
  virtual ~FlushParticipant() = default;
  // Flusher thread, inside every flush's transaction, after this flush's host spans were written.
  virtual void onFlush(FlushContext& context) noexcept = 0;
};

// Registers `participant` (process-wide, across sessions; not owned). Any thread.
void addFlushParticipant(FlushParticipant* participant);
// Unregisters; returns after any flush that is calling it has finished.
void removeFlushParticipant(FlushParticipant* participant);

// Dense thread id of the thread with Linux tid `tid`, if it has recorded a span.
std::optional<uint32_t> threadIdForOsTid(int64_t tid);
// The inverse: the Linux tid of the CPU thread with dense id `thread`, if it has recorded a span.
std::optional<int64_t> osTidForThreadId(uint32_t thread);
// A lane that is not a CPU thread (e.g. kind "cuda-stream", name "cuda0 stream 7"): returns its thread id (>= 65536,
// never a CPU thread's) and writes its threads row at the next flush. Same kind and name → same id.
uint32_t registerLane(std::string_view kind, std::string_view name);

// Clock of the current session. CLOCK_MONOTONIC ns → ns since the file's epoch; 0 when not started.
int64_t fileNsFromMonotonicNs(int64_t monotonicNs);
// Raw ticks (rawTicks()) → ns since the file's epoch, with the calibration as of now.
int64_t fileNsFromTicks(uint64_t ticks);
// Now, in CLOCK_MONOTONIC ns (the clock CUPTI is told to use).
int64_t monotonicNs() noexcept;

}  // namespace tpscope::probes
