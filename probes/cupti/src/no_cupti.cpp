// Built without the CUDA toolkit: the CUPTI source exists but is never available.
#include "tpscope/probes/gpu_activity.h"

namespace tpscope::probes {

namespace {
class UnavailableSource final : public GpuActivitySource {
 public:
  std::string_view name() const override { return "cupti"; }
  bool enable(Callback) override { return false; }
  void disable() override {}
  void flush() override {}
  std::string reason() const override { return "tpscope was built without the CUDA toolkit (no CUPTI)"; }
};
}  // namespace

std::unique_ptr<GpuActivitySource> makeCuptiSource() { return std::make_unique<UnavailableSource>(); }

}  // namespace tpscope::probes
