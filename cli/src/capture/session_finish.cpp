#include <algorithm>
#include <nlohmann/json.hpp>
#include <sstream>

#include "capture/capture_session.h"
#include "tpscope/analysis/diagnose.h"
#include "tpscope/analysis/stall_journal.h"
#include "tpscope/analysis/summary.h"
#include "tpscope/report/findings_text.h"
#include "tpscope/report/html_report.h"
#include "tpscope/tracedb/merge.h"
#include "tpscope/tracedb/rank_file.h"
#include "tpscope/tracedb/reader.h"
#include "tpscope/version.h"

namespace tpscope::cli::capture {

namespace fs = std::filesystem;

namespace {

// The shared layout of findings and alerts (report/findings_text.h); capture prints them one by one.
std::string formatFinding(const analysis::Finding& f, const std::map<int, tracedb::RankInfo>& /*ranks*/) {
  return report::findingText(f);  // the message names the rank and its place where it matters
}

// --html: the same writer as `tpscope report RUN --html FILE`. Returns false (after one error line) on failure.
bool writeHtmlReport(tracedb::Reader& run, const fs::path& file, std::FILE* out, std::FILE* err) {
  report::HtmlReportOptions options;
  options.generator = "tpscope " TPSCOPE_VERSION;
  auto page = report::renderHtmlReport(run, options);
  tracedb::Status s = page ? report::writeHtmlFile(file, page->html) : page.status();
  if (!s) {
    fmt::print(err, "tpscope capture: error: HTML report: {}\n", s.message());
    return false;
  }
  fmt::print(out, "HTML report → {}\n", file.string());
  return true;
}

}  // namespace

// ---- 5. mark, merge, diagnose -----------------------------------------------------------------------------------
int CaptureSession::finish() {
  const Outcome finalOutcome = outcome_.value_or(Outcome::Success);
  code_ = exitCodeOf(finalOutcome);
  outcomeText_ = outcomeName(finalOutcome);
  checkRecorderWrites();
  finishNodes();
  const auto meta = recordRankExits();
  reportStrangers();
  store_.reset();
  link_.reset();
  if (auto code = mergeRankFiles(meta)) return *code;
  if (o_.nnodes > 1)
    fmt::print(out_, "diagnosis of node {}'s ranks alone (a hang elsewhere shows here as ranks waiting on peers):\n",
               o_.nodeRank);
  diagnose();
  if (o_.nnodes > 1)
    fmt::print(out_, "{} holds node {}'s ranks; the whole job: tpscope merge {} <the other nodes' folders> -o run.db\n",
               runFile_.string(), o_.nodeRank, dir_.string());
  if (code_ == kExitSuccess)
    fmt::print(out_, "exit status 0 (success); every rank's records are in {}\n", runFile_.string());
  else
    fmt::print(out_, "exit status {} ({}); {} records are in {}\n", code_, outcomeText_,
               traceIncomplete_ ? "what the ranks could write of their" : "every rank's", runFile_.string());
  std::fflush(out_);
  return code_;
}

// Connections this node's store dropped or turned away (node 0, or a single node). The job's own clients log in at
// once and stay within the limits, so any count is someone else's doing, or a job larger than the store was sized
// for: worth a line either way.
void CaptureSession::reportStrangers() {
  std::optional<probes::TcpKvServerStats> s;
  if (store_) {
    s = store_->stats();
  } else if (link_) {
    s = link_->storeStats();
  }
  if (!s) return;
  const uint64_t strangers = s->loginTimeouts + s->evictedPending + s->malformed + s->wrongTokens;
  if (strangers > 0)
    fmt::print(out_, "capture: the store dropped {} connection{} that did not log in with the job's token ({} silent "
                     "past the login deadline, {} pushed out by newer ones, {} with a wrong token, {} malformed)\n",
               strangers, strangers == 1 ? "" : "s", s->loginTimeouts, s->evictedPending, s->wrongTokens,
               s->malformed);
  if (const uint64_t dropped = s->stalledRequests + s->unreadReplies; dropped > 0)
    fmt::print(out_, "capture: the store dropped {} logged-in client{} that stalled (a request half-sent for {:g} s, "
                     "or replies left unread)\n",
               dropped, dropped == 1 ? "" : "s", storeLimits(world_, o_.nnodes).requestTimeout.count() / 1000.0);
  if (s->refusedFull > 0)
    fmt::print(out_, "capture: the store turned away {} client{} with the job's token: it admits {} at once\n",
               s->refusedFull, s->refusedFull == 1 ? "" : "s", storeLimits(world_, o_.nnodes).maxClients);
  std::fflush(out_);
}

// Several nodes: says this node's ranks have ended. Node 0 waits for the others (its store is their control channel
// and clock store). A node whose own ranks all succeeded takes the job's failure from another node.
void CaptureSession::finishNodes() {
  if (!link_) return;
  link_->postDone(code_);
  std::map<int, int> done;
  if (o_.nodeRank == 0) {
    const double waitS = o_.dumpWaitS + o_.termGraceS + 30;
    fmt::print(out_, "waiting (at most {:g} s) for the other nodes' ranks to end\n", waitS);
    std::fflush(out_);
    done = link_->waitForDone(std::chrono::milliseconds(static_cast<int64_t>(waitS * 1000)));
    for (int k = 1; k < o_.nnodes; ++k)
      if (!done.contains(k)) fmt::print(err_, "tpscope capture: warning: node {} did not report its end\n", k);
  }
  if (code_ != kExitSuccess) return;
  bool lost = false;
  if (const auto stop = link_->pollStop(&lost)) {
    code_ = stop->exitStatus;
    outcomeText_ = fmt::format("stopped by node {}: {}", stop->node, stop->why);
    return;
  }
  for (const auto& [node, status] : done)
    if (status != kExitSuccess) {
      code_ = status;
      outcomeText_ = fmt::format("node {} ended with exit status {}", node, status);
      return;
    }
}

// A rank whose recorder could not write (a full disk, a file size limit) trained on, but its trace has holes: that
// is said, and a run that otherwise succeeded ends with kExitFailure.
void CaptureSession::checkRecorderWrites() {
  for (auto& p : ranks_) {
    const fs::path log = logOf(p.rank());
    if (std::string why = recorderWriteFailure(log); !why.empty()) {
      fmt::print(err_, "tpscope capture: error: rank {}'s trace is incomplete: {} (see {})\n", p.rank(), why,
                 log.string());
      traceIncomplete_ = true;
      if (code_ == kExitSuccess) {
        code_ = kExitFailure;
        outcomeText_ = "incomplete trace";
      }
    }
  }
}

// Writes the launcher's view of each rank's end into its rank file (where it knows more than the rank) and returns
// the capture_* meta keys of the run file.
std::vector<std::pair<std::string, std::string>> CaptureSession::recordRankExits() {
  std::vector<std::pair<std::string, std::string>> meta = {
      {"capture_outcome", outcomeText_},
      {"capture_exit_status", std::to_string(code_)},
      {"capture_command", command_},
      {"capture_argv", nlohmann::json(argv_).dump()},  // the same, unquoted (tpscope replay)
      {"capture_inject", rules::formatFaultList(faults_)},
      {"capture_health", healthText_},
      {"capture_hang_timeout_s", fmt::format("{:g}", o_.hangTimeoutS)},
  };
  if (o_.nnodes > 1) {
    meta.emplace_back("capture_nnodes", std::to_string(o_.nnodes));
    meta.emplace_back("capture_node_rank", std::to_string(o_.nodeRank));
  }
  std::error_code ec;
  for (auto& p : ranks_) {
    const fs::path file = dir_ / fmt::format("rank-{}.db", p.rank());
    const ExitStatus& s = *p.status();
    const bool ours = signaled_[slot(p.rank())];
    meta.emplace_back(fmt::format("capture_rank_exit:{}", p.rank()),
                      s.describe() + (ours && (s.signaled || s.code >= 128) ? " (stopped by capture)" : ""));
    if (!fs::exists(file, ec)) {
      missingRanks_.push_back(p.rank());
      continue;
    }
    if (s.ok()) continue;  // the rank said "ok" itself
    if (diedAtShutdown_[slot(p.rank())]) continue;  // it said "ok" too, then its shutdown died: its status is in meta
    // Another node's failure was the job's first cause, or this rank ended on its own after the first cause here
    // began the stop: it went down with that cause (its peer gone), and is no cause of its own. A rank our stop
    // signal ended is the stop's, whatever the cause.
    const bool echo = !endedByOurSignal(s, ours) && ((!ours && remoteStop_) || echoed_[slot(p.rank())]);
    const std::string reason =
        echo ? fmt::format("stopped by the job's stop ({}); it ended first: {}", stopWhy_, s.describe())
             : rankExitReason(s, ours, stopWhy_);
    if (tracedb::Status e = tracedb::markRankExit(file, reason, s.describe()); !e)
      fmt::print(err_, "tpscope capture: warning: cannot record rank {}'s exit: {}\n", p.rank(), e.message());
  }
  return meta;
}

// DIR/rank-*.db → DIR/run.db with the capture_* meta keys. Returns the exit status when there is nothing to diagnose.
std::optional<int> CaptureSession::mergeRankFiles(const std::vector<std::pair<std::string, std::string>>& meta) {
  auto files = tracedb::rankFiles(dir_);
  std::erase_if(files, [this](const fs::path& f) { return !ownsRankFile(f.filename().string()); });
  if (files.empty()) {
    // The first rank whose log says why it died: that line is the answer, not a guess about the program.
    std::string quoted;
    for (const auto& p : ranks_) {
      if (std::string line = lastErrorLine(logOf(p.rank())); !line.empty()) {
        quoted = fmt::format(": rank {} died before recording; its log ({}) ends with: {}", p.rank(),
                             logOf(p.rank()).string(), line);
        break;
      }
    }
    fmt::print(err_, "tpscope capture: error: no rank wrote a trace file in {}{}\n", dir_.string(),
               !quoted.empty()     ? quoted
               : defaultProgram_ ? ""
                                 : " (does the program link the tpscope probes runtime and start it?)");
    fmt::print(out_, "exit status {} ({}); rank logs are in {}\n", code_ == 0 ? kExitFailure : code_,
               code_ == 0 ? "no trace" : outcomeText_, logs_.string());
    return code_ == 0 ? kExitFailure : code_;
  }
  if (!missingRanks_.empty()) {
    std::string list;
    for (int r : missingRanks_) list += (list.empty() ? "" : ", ") + std::to_string(r);
    fmt::print(out_, "no trace file from rank{} {} (they ended before recording)\n",
               missingRanks_.size() > 1 ? "s" : "", list);
    if (std::string line = lastErrorLine(logOf(missingRanks_.front())); !line.empty())
      fmt::print(out_, "  rank {}'s log ends with: {}\n", missingRanks_.front(), line);
  }
  auto merged = tracedb::merge(files, runFile_);
  if (!merged) {
    fmt::print(err_, "tpscope capture: error: merge failed: {}\n", merged.error());
    fmt::print(out_, "exit status {}; the rank files are in {}\n", code_ == 0 ? kExitFailure : code_, dir_.string());
    return code_ == 0 ? kExitFailure : code_;
  }
  if (tracedb::Status e = tracedb::addMeta(runFile_, meta); !e)
    fmt::print(err_, "tpscope capture: warning: {}\n", e.message());
  if (auto kept = analysis::addStallJournal(dir_, runFile_); !kept)  // the live stall lines (kind 'stall')
    fmt::print(err_, "tpscope capture: warning: the live stall lines were not kept: {}\n", kept.error());
  if (tracedb::Status e = analysis::writeRunSummary(runFile_); !e)
    fmt::print(err_, "tpscope capture: warning: summaries not written (the analyses will compute them): {}\n",
               e.message());
  fmt::print(out_, "merged {} rank file{} → {} ({} spans, {} collectives)\n", merged->ranks,
             merged->ranks == 1 ? "" : "s", runFile_.string(), merged->spans, merged->collectives);
  return std::nullopt;
}

// Prints the diagnosis of the run file (at most maxFindings) and writes the HTML report when asked.
void CaptureSession::diagnose() {
  auto reader = tracedb::Reader::open(runFile_);
  if (!reader) {
    fmt::print(err_, "tpscope capture: error: {}\n", reader.error());
    return;
  }
  std::map<int, tracedb::RankInfo> rankInfo;
  if (auto rs = (*reader)->ranks())
    for (auto& r : *rs) rankInfo[r.rank] = r;
  const analysis::DiagnoseResult d = analysis::diagnose(**reader);
  std::ostringstream chain;  // the root-cause chain first, when there is one
  report::printChain(d, chain);
  fmt::print(out_, "{}", chain.str());
  // Then the findings the chain does not hold (a finding in it was printed there, with its consequences).
  const std::vector<int> inChain = analysis::chainFindings(d.chain);
  int shown = 0;
  for (size_t i = 0; i < d.findings.size(); ++i) {
    const analysis::Finding& f = d.findings[i];
    if (std::binary_search(inChain.begin(), inChain.end(), static_cast<int>(i))) continue;
    if (shown >= o_.maxFindings) break;
    if (f.severity == analysis::Severity::Info && shown + static_cast<int>(inChain.size()) > 0) continue;
    fmt::print(out_, "{}", formatFinding(f, rankInfo));
    ++shown;
  }
  if (d.findings.empty()) fmt::print(out_, "diagnosis: no findings\n");
  const int more = static_cast<int>(d.findings.size() - inChain.size()) - shown;
  if (more > 0)
    fmt::print(out_, "{} more finding{}: tpscope diagnose {}\n", more, more == 1 ? "" : "s", runFile_.string());
  for (const auto& e : d.errors) fmt::print(err_, "tpscope capture: warning: analysis {}\n", e);
  if (!o_.html.empty() && !writeHtmlReport(**reader, o_.html, out_, err_) && code_ == kExitSuccess)
    code_ = kExitFailure;
}

}  // namespace tpscope::cli::capture
