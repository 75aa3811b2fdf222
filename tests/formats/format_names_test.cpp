// Pure helpers of the formats library: collective names, dtypes, ranks in file names, exact µs -> ns, JSON text.
#include <gtest/gtest.h>

#include "json_text.h"
#include "kineto_model.h"
#include "kineto_names.h"

namespace tpscope::formats {
namespace {

using namespace kineto;

TEST(KinetoNames, CollectiveOpNamesAreTheProfilersNotTheKernels) {
  for (const char* name : {"record_param_comms", "nccl:all_reduce", "gloo:all_reduce", "c10d::allreduce_",
                           "c10d::_allgather_base_", "nccl:_reduce_scatter_base", "c10d::alltoall_base_",
                           "nccl:broadcast", "c10d::barrier"})
    EXPECT_TRUE(isCollectiveOpName(name)) << name;
  for (const char* name : {"ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
                           "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "aten::add",
                           "c10d::wait", "nccl:", "ProfilerStep#3", ""})
    EXPECT_FALSE(isCollectiveOpName(name)) << name;
}

TEST(KinetoNames, OpsAreNormalised) {
  EXPECT_EQ(normalizeCollectiveOp("allreduce"), "all_reduce");
  EXPECT_EQ(normalizeCollectiveOp("nccl:all_reduce"), "all_reduce");
  EXPECT_EQ(normalizeCollectiveOp("c10d::allreduce_"), "all_reduce");
  EXPECT_EQ(normalizeCollectiveOp("_allgather_base"), "all_gather");
  EXPECT_EQ(normalizeCollectiveOp("allgather_into_tensor_coalesced"), "all_gather_coalesced");
  EXPECT_EQ(normalizeCollectiveOp("nccl:_reduce_scatter_base"), "reduce_scatter");
  EXPECT_EQ(normalizeCollectiveOp("c10d::alltoall_base_"), "all_to_all");
  EXPECT_EQ(normalizeCollectiveOp("gloo:broadcast"), "broadcast");
  EXPECT_EQ(normalizeCollectiveOp("record_param_comms"), "");
  EXPECT_TRUE(isNonCollectiveCommName("wait"));
  EXPECT_FALSE(isNonCollectiveCommName("allreduce"));
}

TEST(KinetoNames, DtypesAndSizes) {
  EXPECT_EQ(normalizeDtype("Float"), "float32");
  EXPECT_EQ(normalizeDtype("float"), "float32");
  EXPECT_EQ(normalizeDtype("BFloat16"), "bfloat16");
  EXPECT_EQ(normalizeDtype("c10::Half"), "float16");
  EXPECT_EQ(normalizeDtype("Long"), "int64");
  EXPECT_EQ(normalizeDtype("long int"), "int64");
  EXPECT_EQ(normalizeDtype("unsigned char"), "uint8");
  EXPECT_EQ(normalizeDtype("Scalar"), "");
  EXPECT_EQ(dtypeSize("float32"), 4);
  EXPECT_EQ(dtypeSize("bfloat16"), 2);
  EXPECT_EQ(dtypeSize("int64"), 8);
  EXPECT_EQ(dtypeSize("uint8"), 1);
  EXPECT_EQ(dtypeSize(""), 0);
}

TEST(KinetoNames, RankFromFileName) {
  EXPECT_EQ(rankFromFileName("trace_filter_sampled_rank-1.json.gz"), 1);
  EXPECT_EQ(rankFromFileName("cpu_only_rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"), 34);
  EXPECT_EQ(rankFromFileName("gloo_array_rank3.json"), 3);
  EXPECT_EQ(rankFromFileName("RANK_12.json"), 12);
  EXPECT_EQ(rankFromFileName("trace.json"), std::nullopt);
  EXPECT_EQ(rankFromFileName("ranking.json"), std::nullopt);
}

TEST(KinetoNames, BackendFromConfig) {
  EXPECT_EQ(backendFromConfig("cuda:nccl"), "nccl");
  EXPECT_EQ(backendFromConfig("cpu:gloo,cuda:gloo"), "gloo");
  EXPECT_EQ(backendFromConfig("cpu:gloo,cuda:nccl"), "nccl");
  EXPECT_EQ(backendFromConfig(""), "");
}

TEST(KinetoModel, RankListsAndTensorArgs) {
  EXPECT_EQ(parseRankList("[0, 1, 2]"), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(parseRankList("[]"), std::vector<int>{});
  TensorArg t = largestTensorArg("[[8192, 384], [65536, 384], [], [], []]", R"(["float", "float", "", "", "Scalar"])");
  EXPECT_EQ(t.numel, 65536 * 384);
  EXPECT_EQ(t.shape, (std::vector<int64_t>{65536, 384}));
  EXPECT_EQ(t.dtype, "float32");
  EXPECT_EQ(largestTensorArg("[[], [], []]", R"(["Scalar", "Scalar", ""])").numel, -1);
  EXPECT_EQ(largestTensorArg("", "").numel, -1);
}

TEST(JsonText, MicrosToNsIsExactAtUnixMagnitudes) {
  EXPECT_EQ(microsTokenToNs("1682725898236567"), 1682725898236567000LL);
  EXPECT_EQ(microsTokenToNs("4458676524595.135"), 4458676524595135LL);
  EXPECT_EQ(microsTokenToNs("1.5"), 1500);
  EXPECT_EQ(microsTokenToNs("0.0004"), 0);
  EXPECT_EQ(microsTokenToNs("0.0005"), 1);
  EXPECT_EQ(microsTokenToNs("-2.25"), -2250);
  EXPECT_EQ(microsTokenToNs("1e3"), 1000000);
  EXPECT_EQ(microsTokenToNs("12 "), 12000);
  EXPECT_EQ(microsTokenToNs("abc"), std::nullopt);
  EXPECT_EQ(microsTokenToNs("1."), std::nullopt);
  EXPECT_EQ(microsTokenToNs("99999999999999999999"), std::nullopt);
}

TEST(JsonText, MicrosAndStrings) {
  auto micros = [](int64_t ns) {
    std::string s;
    appendMicros(s, ns);
    return s;
  };
  EXPECT_EQ(micros(1234567), "1234.567");
  EXPECT_EQ(micros(3000), "3");
  EXPECT_EQ(micros(1500), "1.5");
  EXPECT_EQ(micros(-5), "-0.005");
  EXPECT_EQ(micros(0), "0");
  std::string s;
  appendJsonString(s, "a\"b\\c\n\x01 \xC3\xA9 \xFF");
  EXPECT_EQ(s, "\"a\\\"b\\\\c\\n\\u0001 \xC3\xA9 \xEF\xBF\xBD\"");
}

}  // namespace
}  // namespace tpscope::formats
