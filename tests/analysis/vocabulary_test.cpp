// The shared vocabulary (probes/vocabulary): every spelling of a collective op the code base meets reads as the one
// catalogue op, and each colour of the table comes with a text colour that reads on it.
#include <gtest/gtest.h>

#include "tpscope/vocabulary/collective_ops.h"
#include "tpscope/vocabulary/colours.h"

namespace tpscope::vocabulary {
namespace {

TEST(CollectiveOps, EverySpellingReadsAsTheCatalogueOp) {
  for (const char* name : {"all_reduce", "allreduce", "c10d::allreduce_", "nccl:all_reduce", "gloo:all_reduce",
                           "allreduce_coalesced", "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                           "void ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)", "ncclAllReduce"})
    EXPECT_EQ(canonicalOp(name), CollectiveOp::AllReduce) << name;
  for (const char* name : {"_allgather_base", "c10d::_allgather_base_", "allgather_into_tensor_coalesced",
                           "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"})
    EXPECT_EQ(canonicalOp(name), CollectiveOp::AllGather) << name;
  EXPECT_EQ(canonicalOp("nccl:_reduce_scatter_base"), CollectiveOp::ReduceScatter);
  EXPECT_EQ(canonicalOp("reduce_scatter_tensor_coalesced"), CollectiveOp::ReduceScatter);
  EXPECT_EQ(canonicalOp("all_to_all_single"), CollectiveOp::AllToAll);
  EXPECT_EQ(canonicalOp("alltoallv"), CollectiveOp::AllToAll);
  EXPECT_EQ(canonicalOp("monitored_barrier"), CollectiveOp::Barrier);
  EXPECT_EQ(canonicalOp("nccl:send 1->2"), CollectiveOp::Send);  // Flight Recorder's profiling name
  EXPECT_EQ(canonicalOp("gloo:recv 2<-1"), CollectiveOp::Recv);
  EXPECT_EQ(canonicalOp("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"), CollectiveOp::SendRecv);
  EXPECT_EQ(canonicalOp("batch_isend_irecv"), CollectiveOp::SendRecv);
  EXPECT_EQ(canonicalOp("coalesced"), CollectiveOp::Coalesced);
  for (const char* name : {"record_param_comms", "nccl:", "c10d::wait", "ncclGroupStart", "aten::add", "",
                           "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)"})
    EXPECT_EQ(canonicalOp(name), CollectiveOp::Unknown) << name;
  EXPECT_TRUE(parseOp("allreduce_coalesced").coalesced);
  EXPECT_FALSE(parseOp("allreduce").coalesced);
}

TEST(CollectiveOps, NamesAreTheStoredOnes) {
  for (size_t i = 0; i < kCollectiveOpCount; ++i) {
    const auto op = static_cast<CollectiveOp>(i);
    EXPECT_EQ(canonicalOp(opName(op)), op) << opName(op);
    EXPECT_TRUE(namesOp(opName(op), op));
  }
  EXPECT_EQ(opName(CollectiveOp::Unknown), "");
  EXPECT_TRUE(namesOp("allreduce", CollectiveOp::AllReduce));
  EXPECT_FALSE(namesOp("all_reduce_coalesced", CollectiveOp::AllReduce));
}

TEST(CollectiveOps, ASpanNameMentionsItsOp) {
  EXPECT_EQ(opMentionedIn("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL"), CollectiveOp::ReduceScatter);
  EXPECT_EQ(opMentionedIn("tp all_gather"), CollectiveOp::AllGather);
  EXPECT_EQ(opMentionedIn("c10d::allreduce_"), CollectiveOp::AllReduce);
  EXPECT_EQ(opMentionedIn("send wait"), CollectiveOp::Unknown);  // only the coloured ops
}

TEST(Colours, TextReadsOnItsFill) {
  EXPECT_EQ(textOn(kHeatStops.front()).r, kLightText.r);  // the heatmap's darkest cells get light numbers
  EXPECT_EQ(textOn(kHeatStops.back()).r, kDarkText.r);
  EXPECT_EQ(kSpanKindColours[4].text.r, kLightText.r);  // step: dark grey
  EXPECT_EQ(kSpanKindColours[8].text.r, kDarkText.r);   // memset: light orange
  const Rgb mid = heat(0.5), low = heat(-1), bad = heat(std::nan(""));
  EXPECT_EQ(mid.g, kHeatStops[2].g);
  EXPECT_EQ(low.r, kHeatStops[0].r);
  EXPECT_EQ(bad.r, kNonFinite.r);
}

}  // namespace
}  // namespace tpscope::vocabulary
