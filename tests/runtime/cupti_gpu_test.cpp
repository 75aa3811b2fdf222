// The real CUPTI source on a GPU (label gpu; skipped without one): memcpy and memset issued inside host spans come
// back as Memcpy/Memset spans on a cuda-stream lane, correlated to those spans.
// These tests exercise the recorder through the probe macros whatever TPSCOPE_PROBES says for the build (the
// compiled-out case has its own TU), so the macros are on in this file.
#undef TPSCOPE_PROBES_ENABLED
#define TPSCOPE_PROBES_ENABLED 1
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <string>

#include "test_util.h"
#include "tpscope/probes/gpu_activity.h"
#include "tpscope/probes/probes.h"
#include "tpscope/probes/runtime.h"
#include "tpscope/tracedb/query.h"
#include "tpscope/tracedb/reader.h"

namespace tp = tpscope::probes;

namespace {

TEST(CuptiGpu, MemcpyAndMemsetLandCorrelated) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) GTEST_SKIP() << "no CUDA device";
  tpscope::testing::TempDir dir;
  tp::RuntimeOptions o;
  o.outDir = dir.path();
  o.installSignalHandlers = false;
  o.flushAtExit = false;
  ASSERT_TRUE(tp::start(o).isOk());
  tp::GpuActivityRecorder gpu(tp::makeCuptiSource());
  ASSERT_TRUE(gpu.start()) << gpu.reason();
  void* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 1 << 20), cudaSuccess);
  std::string host(1 << 20, 'x');
  {
    TPS_SPAN("gpu.copy", Data, Data);
    ASSERT_EQ(cudaMemcpy(d, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  {
    TPS_SPAN("gpu.clear", Compute, Forward);
    ASSERT_EQ(cudaMemset(d, 0, 1 << 20), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  cudaFree(d);
  gpu.stop();
  tp::stop();
  auto reader = tpscope::tracedb::Reader::open(dir.path() / "rank-0.db");
  ASSERT_TRUE(reader.isOk()) << reader.error();
  bool memcpyInCopy = false, memsetInClear = false;
  const tpscope::tracedb::Status s =
      tpscope::tracedb::Query(**reader,
                              "SELECT s.kind, hn.value FROM spans s JOIN spans h ON h.id = s.correlation"
                              " JOIN strings hn ON hn.id = h.name WHERE s.kind IN (7, 8) ORDER BY s.begin_ns",
                              "copies and their host spans")
          .each([&](tpscope::tracedb::Query& q) {
            const int kind = q.i32(0);
            const std::string hostName = q.text(1);
            memcpyInCopy |= kind == 7 && hostName == "gpu.copy";
            memsetInClear |= kind == 8 && hostName == "gpu.clear";
          });
  ASSERT_TRUE(s.isOk()) << s.message();
  EXPECT_TRUE(memcpyInCopy);
  EXPECT_TRUE(memsetInClear);
}

}  // namespace
