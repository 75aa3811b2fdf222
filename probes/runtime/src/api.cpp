// The free functions of runtime.h and runtime_hooks.h: thin forwards to the process's Recorder.
#include "recorder.h"
#include "tpscope/probes/runtime.h"
#include "tpscope/probes/runtime_hooks.h"

namespace tpscope::probes {

using runtime_detail::Recorder;

tracedb::Status start(const RuntimeOptions& options) { return Recorder::instance().start(options); }
bool started() { return Recorder::instance().started(); }
void stop(std::string_view exitReason) { Recorder::instance().stop(exitReason); }
void flushNow() { Recorder::instance().flushNow(); }
void setRankInfo(const tracedb::RankInfo& info) { Recorder::instance().setRankInfo(info); }
void setMeta(std::string_view key, std::string_view value) { Recorder::instance().setMeta(key, value); }
void putGroup(const tracedb::GroupInfo& group) { Recorder::instance().putGroup(group); }
void setThreadName(std::string_view name) { Recorder::instance().setThreadName(name); }
void publishOpenSpans(bool on) noexcept { Recorder::instance().publishOpenSpans(on); }
void setClockStore(std::shared_ptr<KvStore> store) { Recorder::instance().setClockStore(std::move(store)); }
RecorderStats recorderStats() { return Recorder::instance().stats(); }
std::filesystem::path outputPath() { return Recorder::instance().outputPath(); }

void addFlushParticipant(FlushParticipant* participant) { Recorder::instance().addParticipant(participant); }
void removeFlushParticipant(FlushParticipant* participant) { Recorder::instance().removeParticipant(participant); }
std::optional<uint32_t> threadIdForOsTid(int64_t tid) { return Recorder::instance().threadIdForOsTid(tid); }
std::optional<int64_t> osTidForThreadId(uint32_t thread) { return Recorder::instance().osTidForThreadId(thread); }
uint32_t registerLane(std::string_view kind, std::string_view name) {
  return Recorder::instance().registerLane(kind, name);
}
int64_t fileNsFromMonotonicNs(int64_t monotonicNs) { return Recorder::instance().fileNsFromMonotonicNs(monotonicNs); }
int64_t fileNsFromTicks(uint64_t ticks) { return Recorder::instance().fileNsFromTicks(ticks); }
int64_t monotonicNs() noexcept { return runtime_detail::monotonicNow(); }

}  // namespace tpscope::probes
