// The pipeline view's picture of one training step of a pipeline-parallel run (issue #14): the familiar schedule
// diagram (stages × time, each micro-batch's forward and backward pass a block with its number), but measured — the
// blocks are the run's own pass spans, and what is left of the pipeline's window between them is its bubble.
//
// Input: meta 'pipeline' (schedule, stages, microbatches, virtual_stages, stage_of_rank) and the pass spans
// "forward mb K" / "backward mb K" [" chunk C"] the engine records (docs/schema.md, analysis/pipeline.h). One row per
// stage, drawn from the stage's first rank (the other ranks of a stage — its TP and DP peers — run the same passes).
// The window is the step's flush: from the first pass any stage begins to the last pass any stage ends.
//
// Threading: pure functions of an immutable RunData; any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tpscope/gui/run_data.h"

namespace tpscope::gui {

struct PipelineBlock {
  int64_t beginNs = 0;
  int64_t endNs = 0;
  int microbatch = -1;
  int chunk = -1;        // model chunk of an interleaved schedule; -1 without chunks
  bool backward = false;
  SpanRef span;          // the pass span on the timeline
};

struct PipelineRow {
  int stage = 0;
  int rank = 0;                       // the rank the row is drawn from
  std::vector<PipelineBlock> blocks;  // by begin
  int64_t busyNs = 0;                 // the union of the blocks
};

struct PipelineChart {
  std::string schedule;
  int stages = 0, microbatches = 0, virtualStages = 1;
  std::vector<int> steps;  // the steps that have pass spans, ascending
  int step = -1;           // the step drawn
  int64_t beginNs = 0, endNs = 0;  // the step's pipeline window
  std::vector<PipelineRow> rows;   // by stage
  int longestStage = -1;           // the stage with the most pass time in this step
  bool present() const { return stages >= 2 && !rows.empty(); }
};

// The chart of `step` (a step absent from the run's pass spans, or −1: the middle step that has them). Not present()
// for a run without meta 'pipeline' or without pass spans.
PipelineChart pipelineChart(const RunData& run, int step = -1);

}  // namespace tpscope::gui
