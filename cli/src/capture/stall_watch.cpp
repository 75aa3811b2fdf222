#include "capture/stall_watch.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "capture/run_poller.h"
#include "tpscope/analysis/stall_journal.h"

namespace tpscope::cli::capture {

namespace {
std::string siteOf(const analysis::LiveStall& s) { return s.group + "|" + std::to_string(s.seq); }
}  // namespace

std::vector<std::string> StallWatch::update(RunPoller& poller, const std::vector<bool>& exited, bool startup) {
  const double after = startup ? std::max(afterS_, startupAfterS_) : afterS_;
  const auto afterNs = static_cast<int64_t>(after * 1e9);
  std::vector<std::string> lines;
  if (poller.longestQuiet().count() < afterNs && open_.empty()) return lines;  // everyone records: nothing to read
  epochUnixNs_ = poller.epochUnixNs();
  const size_t loggedBefore = log_.size();
  bool resumed = false;

  std::vector<analysis::LiveGroup> groups;
  std::vector<analysis::LiveRankState> ranks;
  poller.liveState(exited, &groups, &ranks);
  const int64_t now = poller.nowFileNs();
  const std::vector<analysis::LiveStall> stalls = analysis::detectStalls(groups, ranks, now, {afterNs});

  std::set<std::string> current;
  for (const analysis::LiveStall& s : stalls) {
    const std::string site = siteOf(s);
    current.insert(site);
    auto it = open_.find(site);
    if (it != open_.end() && it->second.stall.key() == s.key()) {
      it->second.stall = s;  // the same situation, a longer wait: no new line
      log_[it->second.logIndex].stall = s;
      continue;
    }
    lines.push_back(analysis::stallLine(s));
    log_.push_back({s, now - s.blockedNs, false, 0});
    open_[site] = {s, log_.size() - 1};
  }
  // A site no longer stalled: RESUMED when the ranks it blocked still run and are recording again (not when they
  // were stopped or exited: the job did not move).
  for (auto it = open_.begin(); it != open_.end();) {
    if (current.contains(it->first)) {
      ++it;
      continue;
    }
    const analysis::LiveStall& s = it->second.stall;
    const bool moved = std::all_of(s.blocked.begin(), s.blocked.end(), [&](const analysis::StalledRank& b) {
      auto r = std::find_if(ranks.begin(), ranks.end(), [&](const auto& x) { return x.rank == b.rank; });
      return r != ranks.end() && r->seen && !r->exited && r->quietNs < afterNs;
    });
    if (moved) {
      Logged& l = log_[it->second.logIndex];
      l.resumed = true;
      l.resumedAfterS = static_cast<double>(now - l.firstNs) * 1e-9;
      lines.push_back(analysis::resumedLine(s, l.resumedAfterS));
      resumed = true;
      it = open_.erase(it);
    } else {
      ++it;  // unknown yet (a read failed, the rank is stopping): keep it open
    }
  }
  keepJournal(log_.size() != loggedBefore || resumed, now, lines);
  return lines;
}

void StallWatch::journalTo(std::filesystem::path file) {
  std::error_code ec;
  std::filesystem::remove(file, ec);
  journal_ = std::move(file);
}

void StallWatch::keepJournal(bool changed, int64_t nowNs, std::vector<std::string>& lines) {
  if (journal_.empty()) return;
  const bool stale = !open_.empty() && nowNs - journalWrittenNs_ >= 1'000'000'000;
  if (!changed && !stale) return;
  if (std::string error = writeJournal(); !error.empty()) {
    if (!journalWarned_) lines.push_back("warning: the stall lines are not kept in a journal: " + error);
    journalWarned_ = true;
    return;
  }
  journalWrittenNs_ = nowNs;
}

std::string StallWatch::writeJournal() {
  if (journal_.empty() || (log_.empty() && journalWrittenNs_ < 0)) return "";
  const std::vector<tracedb::AlertRow> rows = alerts();
  tracedb::Status s = analysis::writeStallJournal(journal_, rows, epochUnixNs_);
  return s ? "" : s.message();
}

std::vector<std::string> StallWatch::desyncsAfterEnd(RunPoller& poller) {
  std::vector<analysis::LiveGroup> groups;
  std::vector<analysis::LiveRankState> ranks;
  // Ended ranks count as present: their files hold what they had entered when they died.
  poller.liveState({}, &groups, &ranks);
  const int64_t now = poller.nowFileNs();
  epochUnixNs_ = poller.epochUnixNs();
  std::vector<std::string> lines;
  for (const analysis::LiveStall& s : analysis::detectStalls(groups, ranks, now, {0})) {
    if (s.kind != analysis::StallKind::Desync || open_.contains(siteOf(s)) || !endDesyncs_.insert(siteOf(s)).second)
      continue;
    lines.push_back(analysis::stallLine(s));
    log_.push_back({s, now - s.blockedNs, false, 0});
  }
  keepJournal(!lines.empty(), now, lines);
  return lines;
}

std::vector<tracedb::AlertRow> StallWatch::alerts() const {
  std::vector<tracedb::AlertRow> out;
  for (const Logged& l : log_) {
    const analysis::LiveStall& s = l.stall;
    tracedb::AlertRow a;
    // The rank to look at: the first that has not entered the collective (the culprit of a wait), else a blocked one.
    a.rank = !s.missing.empty() ? s.missing.front().rank : s.blocked.empty() ? 0 : s.blocked.front().rank;
    a.step = s.record.step;
    a.tsNs = l.firstNs;
    a.severity = l.resumed ? "info" : "critical";
    a.kind = "stall";
    a.layer = s.record.layer;
    a.message = analysis::stallLine(s) + (l.resumed ? " [resumed after " + std::to_string(l.resumedAfterS) + " s]" : "");
    nlohmann::json ev;
    ev["stall"] = analysis::stallKindName(s.kind);
    ev["group"] = s.group;
    ev["seq"] = s.seq;
    ev["blocked_s"] = static_cast<double>(s.blockedNs) * 1e-9;
    ev["resumed"] = l.resumed;
    auto& blocked = ev["blocked_ranks"] = nlohmann::json::array();
    auto& cites = ev["rows"] = nlohmann::json::array();
    for (const auto& b : s.blocked) {
      blocked.push_back(b.rank);
      cites.push_back({{"table", "collectives"}, {"rank", b.rank}, {"group_name", s.group}, {"seq", s.seq}});
    }
    auto& missing = ev["missing_ranks"] = nlohmann::json::array();
    auto& where = ev["missing"] = nlohmann::json::array();
    for (const auto& m : s.missing) {
      missing.push_back(m.rank);
      nlohmann::json w{{"rank", m.rank}, {"state", analysis::missingStateName(m.state)}, {"stuck", m.stuck}};
      if (m.inside && m.state != analysis::MissingState::Blocked)
        w.update({{"inside", m.inside->name},
                  {"layer", m.inside->layer},
                  {"inside_s", static_cast<double>(m.insideNs) * 1e-9},
                  {"median_step_s", static_cast<double>(m.medianStepNs) * 1e-9}});
      where.push_back(std::move(w));
      if (m.last)
        cites.push_back({{"table", "collectives"}, {"rank", m.rank}, {"group_name", s.group}, {"seq", m.last->seq}});
    }
    a.evidence = ev.dump();
    out.push_back(std::move(a));
  }
  return out;
}

}  // namespace tpscope::cli::capture
