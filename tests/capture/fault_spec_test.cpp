// The --inject grammar: every kind parses to the spec it names, round-trips through formatFaultSpec, and every
// malformed spec is refused with a message that quotes it and says what is expected.
#include "tpscope/rules/fault_spec.h"

#include <gtest/gtest.h>

namespace tpscope::rules {
namespace {

FaultSpec parseOk(std::string_view text) {
  std::string error;
  auto spec = parseFaultSpec(text, &error);
  EXPECT_TRUE(spec.has_value()) << text << ": " << error;
  return spec.value_or(FaultSpec{});
}

std::string parseError(std::string_view text) {
  std::string error;
  auto spec = parseFaultSpec(text, &error);
  EXPECT_FALSE(spec.has_value()) << text << " was accepted";
  return error;
}

TEST(FaultSpec, ParsesEveryKind) {
  FaultSpec s = parseOk("nan:rank=1,step=3,layer=2");
  EXPECT_EQ(s.kind, FaultKind::Nan);
  EXPECT_EQ(s.rank, 1);
  EXPECT_EQ(s.step, 3);
  EXPECT_EQ(s.layer, 2);

  s = parseOk("inf:step=4,rank=0");
  EXPECT_EQ(s.kind, FaultKind::Inf);
  EXPECT_EQ(s.step, 4);
  EXPECT_EQ(s.layer, -1);

  s = parseOk("spike:rank=2,step=5,factor=1e3");
  EXPECT_EQ(s.kind, FaultKind::Spike);
  EXPECT_DOUBLE_EQ(s.factor, 1000.0);

  s = parseOk("hang:rank=3,step=7,phase=bwd");
  EXPECT_EQ(s.kind, FaultKind::Hang);
  EXPECT_EQ(s.phase, FaultPhase::Backward);
  EXPECT_EQ(parseOk("hang:rank=3,step=7").phase, FaultPhase::Any);
  EXPECT_EQ(parseOk("hang:rank=3,step=7,phase=fwd").phase, FaultPhase::Forward);

  s = parseOk("mismatch:rank=1,step=2");
  EXPECT_EQ(s.kind, FaultKind::Mismatch);
  EXPECT_EQ(parseOk("mismatch:rank=1,step=2,phase=bwd").phase, FaultPhase::Backward);

  s = parseOk("nan:rank=1,step=3,layer=1,phase=fwd");  // into layer 1's output activation
  EXPECT_EQ(s.phase, FaultPhase::Forward);
  EXPECT_EQ(s.layer, 1);
  EXPECT_EQ(parseOk("inf:rank=1,step=3,phase=bwd").phase, FaultPhase::Backward);
  EXPECT_NE(parseError("nan:rank=1,step=3,phase=up").find("fwd or bwd"), std::string::npos);
  EXPECT_NE(parseError("spike:rank=1,step=3,factor=2,phase=fwd").find("unknown key 'phase'"), std::string::npos);

  s = parseOk("slow:rank=1,ms=40");
  EXPECT_EQ(s.kind, FaultKind::Slow);
  EXPECT_EQ(s.ms, 40);
  EXPECT_EQ(s.step, -1);

  s = parseOk("slow:rank=1,ms=4000,step=3");  // one step only: a rank stuck in compute
  EXPECT_EQ(s.ms, 4000);
  EXPECT_EQ(s.step, 3);
  EXPECT_NE(parseError("delay:rank=1,ms=4,step=3").find("unknown key 'step'"), std::string::npos);

  s = parseOk("delay:rank=0,ms=5");
  EXPECT_EQ(s.kind, FaultKind::Delay);
  EXPECT_EQ(s.ms, 5);

  s = parseOk("crash:rank=1,step=9");
  EXPECT_EQ(s.kind, FaultKind::Crash);
  EXPECT_EQ(s.step, 9);
}

TEST(FaultSpec, RoundTripsThroughItsCanonicalText) {
  for (std::string_view text : {"nan:rank=1,step=3,layer=2", "inf:rank=0,step=4", "spike:rank=2,step=5,factor=250",
                                "hang:rank=3,step=7,phase=bwd", "mismatch:rank=1,step=2", "slow:rank=1,ms=40",
                                "nan:rank=2,step=3,layer=0,phase=fwd", "mismatch:rank=0,step=1,phase=fwd",
                                "delay:rank=0,ms=5", "crash:rank=1,step=9", "nan:stage=1,step=3,layer=2,phase=fwd,mb=1",
                                "hang:stage=0,step=2,mb=3", "slow:stage=2,ms=100", "slow:rank=1,step=3,ms=4000"}) {
    const FaultSpec s = parseOk(text);
    EXPECT_EQ(formatFaultSpec(s), text);
    EXPECT_EQ(parseOk(formatFaultSpec(s)), s);
  }
}

TEST(FaultSpec, ListsJoinWithSemicolons) {
  std::string error;
  auto list = parseFaultList("nan:rank=1,step=3;;slow:rank=0,ms=10", &error);
  ASSERT_TRUE(list.has_value()) << error;
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[1].kind, FaultKind::Slow);
  EXPECT_EQ(formatFaultList(*list), "nan:rank=1,step=3;slow:rank=0,ms=10");
  EXPECT_FALSE(parseFaultList("nan:rank=1,step=3;bogus", &error).has_value());
  EXPECT_NE(error.find("bogus"), std::string::npos);
  EXPECT_TRUE(parseFaultList("", &error).value().empty());
}

TEST(FaultSpec, RefusesMalformedSpecsClearly) {
  EXPECT_NE(parseError("boom:rank=1").find("unknown fault 'boom'"), std::string::npos);
  EXPECT_NE(parseError("nan").find("missing parameters (nan:rank=R|stage=S,step=S[,layer=L][,phase=fwd|bwd][,mb=K])"),
            std::string::npos);
  EXPECT_NE(parseError("nan:rank=1").find("missing step=S"), std::string::npos);
  EXPECT_NE(parseError("spike:rank=1,step=2").find("missing factor=F"), std::string::npos);
  EXPECT_NE(parseError("slow:rank=1").find("missing ms=M"), std::string::npos);
  EXPECT_NE(parseError("nan:rank=x,step=1").find("rank=x is not an integer"), std::string::npos);
  EXPECT_NE(parseError("nan:rank=-1,step=1").find("rank=-1"), std::string::npos);
  EXPECT_NE(parseError("nan:rank=1,step=0").find("steps count from 1"), std::string::npos);
  EXPECT_NE(parseError("nan:rank=1,step=2,factor=3").find("unknown key 'factor' for nan"), std::string::npos);
  EXPECT_NE(parseError("nan:rank=1,rank=2,step=1").find("given twice"), std::string::npos);
  EXPECT_NE(parseError("hang:rank=1,step=2,phase=sideways").find("fwd or bwd"), std::string::npos);
  EXPECT_NE(parseError("spike:rank=1,step=2,factor=-3").find("> 0"), std::string::npos);
  EXPECT_NE(parseError("spike:rank=1,step=2,factor=inf").find("finite"), std::string::npos);
  EXPECT_NE(parseError("slow:rank=1,ms=0").find("between 1"), std::string::npos);
  EXPECT_NE(parseError("nan:rank=1,,step=2").find("not key=value"), std::string::npos);
  EXPECT_NE(parseError("nan:rank=1,step=2 ").find("not an integer"), std::string::npos);
  // Every message quotes the spec.
  EXPECT_EQ(parseError("crash:rank=1").rfind("--inject 'crash:rank=1': ", 0), 0u);
}

// Pipeline placement: stage=S in place of rank=R, mb=K for the kinds that run inside one micro-batch's pass.
TEST(FaultSpec, PlacesFaultsOnAStageAndAMicrobatch) {
  FaultSpec s = parseOk("nan:stage=1,step=3,layer=2,phase=fwd,mb=1");
  EXPECT_EQ(s.stage, 1);
  EXPECT_EQ(s.microbatch, 1);
  EXPECT_EQ(s.phase, FaultPhase::Forward);
  s = parseOk("hang:rank=2,step=2,mb=0");
  EXPECT_EQ(s.stage, -1);
  EXPECT_EQ(s.rank, 2);
  EXPECT_EQ(s.microbatch, 0);
  EXPECT_NE(parseError("nan:rank=1,stage=1,step=2").find("give rank=R or stage=S, not both"), std::string::npos);
  EXPECT_NE(parseError("slow:stage=1,ms=5,mb=1").find("unknown key 'mb' for slow"), std::string::npos);
  EXPECT_NE(parseError("nan:stage=-1,step=2").find("must be a stage >= 0"), std::string::npos);
  EXPECT_NE(parseError("hang:stage=0,step=2,mb=x").find("must be a micro-batch >= 0"), std::string::npos);
  EXPECT_NE(parseError("nan:step=2,mb=1").find("missing rank=R"), std::string::npos);
  // Against the job: stages exist, and a run without pipeline parallelism takes neither key.
  EXPECT_EQ(checkFaultSpec(parseOk("nan:stage=1,step=1"), 4, 2, 2), "");
  EXPECT_NE(checkFaultSpec(parseOk("nan:stage=2,step=1"), 4, 2, 2).find("stage 2 does not exist in a pipeline of 2"),
            std::string::npos);
  EXPECT_NE(checkFaultSpec(parseOk("hang:rank=0,step=1,mb=1"), 4, 2, 1).find("this run has none (--pp 1)"),
            std::string::npos);
  EXPECT_EQ(checkFaultSpec(parseOk("hang:rank=0,step=1,mb=1"), 4, 2, 2), "");
}

TEST(FaultSpec, ChecksRanksAndLayersAgainstTheJob) {
  EXPECT_EQ(checkFaultSpec(parseOk("nan:rank=3,step=1"), 4), "");
  EXPECT_NE(checkFaultSpec(parseOk("nan:rank=4,step=1"), 4).find("rank 4 does not exist in a job of 4 ranks"),
            std::string::npos);
  EXPECT_NE(checkFaultSpec(parseOk("nan:rank=0,step=1,layer=2"), 4, 2).find("layer 2 does not exist"),
            std::string::npos);
  EXPECT_EQ(checkFaultSpec(parseOk("nan:rank=0,step=1,layer=2"), 4, 0), "");
}

}  // namespace
}  // namespace tpscope::rules
