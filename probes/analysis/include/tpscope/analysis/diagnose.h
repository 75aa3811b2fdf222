// diagnose(): every analysis over one run file, as findings sorted most severe first (findingLess), then the
// root-cause chain over them (chain.h): `chain`, roots most severe first.
//
// Runs: crash, desync/hang, NaN/Inf origin, gradient and loss anomalies, stragglers, communication overhead. A
// failing analysis (e.g. a damaged table) does not stop the others: its error is returned in `errors`, named. The
// reports the findings were drawn from come back in `reports` (compute once, hand down): the viewer shows them instead
// of running the analyses a second time. The thresholds of the straggler and communication-overhead findings are at
// DiagnoseOptions; docs/diagnosis.md ("diagnose() and severities") has each kind's severity rules in full.
// Threading: uses `reader` from the calling thread only.
#pragma once

#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tpscope/analysis/anomalies.h"
#include "tpscope/analysis/breakdown.h"
#include "tpscope/analysis/chain.h"
#include "tpscope/analysis/collectives.h"
#include "tpscope/analysis/desync.h"
#include "tpscope/analysis/finding.h"
#include "tpscope/analysis/nonfinite.h"
#include "tpscope/analysis/pipeline.h"
#include "tpscope/analysis/run_info.h"
#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/status.h"

namespace tpscope::analysis {

// straggler (warning): a rank whose waiting caused is significant and material, and that is no victim.
//   significant: the weighted arrival test of collectives.h gives p < stragglerAlpha / R (R the ranks tested: a
//     Bonferroni bound on the run's false-alarm rate), over ≥ stragglerMinCollectives decided collectives — or, for a
//     large effect (the material figure below ≥ stragglerLargeStepPct, a quarter of a step per step),
//     p < stragglerLargeAlpha: a few steps cannot reach the run's bound however late a rank is (but on a host whose
//     every CPU runs a rank, such a lag is info when each waiting rank loses less per step than one CFS scheduling
//     period, 6 ms × (1 + log2 CPUs): the scheduler's turns make that by chance); on a host whose every CPU runs
//     a rank, short of a large effect, also step after step: the step-clustered test of collectives.h at the same
//     bound (the OS favours one rank for a stretch of steps, which the collectives' test counts many times over);
//     short of a large effect, too, the lag per step and waiting rank must exceed what the other ranks of its host
//     wait for a CPU per step (their run delay): below that it is the host's scheduling noise, info;
//   material: the waiting it caused beyond chance (S_r − μ_r) per step, summed over the ranks that waited on it, is
//     ≥ stragglerMinStepPct % of the mean step time (breakdown); significant but not material is an info finding (a
//     figure: e.g. a rank sharing its core);
//   no victim: ranks delayed by the straggler arrive late at their next collective too (a TP peer at its DP
//     all-reduce). A rank that waited on another at least half as long as it is late itself (RankStraggling::lagNs),
//     where the other did not wait on it as much, passes lateness on and is not named; of the rest, those that
//     caused ≥ 75 % of the waiting the worst one caused are.
// comm_overhead (info above commOverheadInfoPct): per rank and run-wide (rank −1), from the breakdown: a figure, not
//   a fault. A warning only against a stated expectation: the run's exposed communication is ≥ commOverheadWarnPct %
//   of step time *and* the TP communication volume per step exceeds what the analytic TP model of the engine expects
//   (collectives.h, TpModelCheck) by more than tpExcessPct % (the model cannot explain the communication).
struct DiagnoseOptions {
  AnomalyOptions anomalies;
  double stragglerAlpha = 1e-3;    // the run's false-alarm rate bound for stragglers
  int stragglerMinCollectives = 4;
  double stragglerMinStepPct = 5.0;
  double stragglerLargeStepPct = 25.0;
  double stragglerLargeAlpha = 0.05;
  double commOverheadWarnPct = 30.0;
  double commOverheadInfoPct = 10.0;
  double tpExcessPct = 10.0;
  int maxFindingsPerKind = 20;  // the rest of a kind are counted in DiagnoseResult::omitted
};

// What diagnose() computed on the way to its findings; an analysis that failed (see DiagnoseResult::errors) or did
// not run is absent.
struct DiagnoseReports {
  std::optional<RunInfo> info;
  std::optional<Breakdown> breakdown;
  std::optional<CollectiveAnalysis> collectives;
  std::optional<DesyncReport> desync;
  std::optional<NonFiniteReport> nonfinite;
  std::optional<PipelineReport> pipeline;  // present() only for a pipeline-parallel run
};

struct DiagnoseResult {
  std::vector<Finding> findings;    // sorted, most severe first
  std::vector<ChainLink> chain;     // the root-cause chain over `findings` (chain.h); empty on a healthy run
  DiagnoseReports reports;
  std::vector<std::string> errors;  // analyses that failed, "<analysis>: <message naming the file>"
  std::vector<std::pair<std::string, int64_t>> omitted;  // kind name → findings left out by maxFindingsPerKind
};

DiagnoseResult diagnose(tracedb::Reader& reader, const DiagnoseOptions& options = {});

// A diagnosis file of a run's rank files (a capture folder's, or several folders': one per node), so that diagnose()
// needs no merged run file: every record diagnose reads, but of the spans only each rank's first and newest
// (tracedb::MergeSpans::Ends), and the summaries that stand for the others (summary.h). Worker threads read the rank
// files, each file's summaries computed by the worker that reads it, while the calling thread writes the records
// (tracedb::merge). diagnose() on it finds what it finds on the run file `tpscope merge` writes of the
// same files.
inline constexpr size_t kMaxDiagnosisReaders = 16;
struct DiagnosisFileOptions {
  size_t readers = 0;  // reading threads; 0: one per core (one where worker threads are off:
                       // TPSCOPE_ANALYSIS_THREADS), at most kMaxDiagnosisReaders
};
// Writes `output` from `rankFiles` (merge's refusals: different runs, a rank twice, unreadable files). On failure
// `output` is left absent.
tracedb::Status writeDiagnosisFile(std::span<const std::filesystem::path> rankFiles,
                                   const std::filesystem::path& output, const DiagnosisFileOptions& options = {});

}  // namespace tpscope::analysis
