#include "capture/run_poller.h"

#include <sys/stat.h>

#include <algorithm>
#include <limits>
#include <system_error>
#include <tuple>

#include "tpscope/report/findings_text.h"
#include "tpscope/analysis/live_stall.h"
#include "tpscope/tracedb/reader.h"

namespace tpscope::cli::capture {

RunPoller::RunPoller(std::filesystem::path dir, int ranks, int firstRank)
    : dir_(std::move(dir)),
      firstRank_(firstRank),
      fileIds_(static_cast<size_t>(ranks)),
      progress_(static_cast<size_t>(ranks)),
      readers_(static_cast<size_t>(ranks)) {}

RunPoller::~RunPoller() = default;

void RunPoller::close() {
  for (auto& r : readers_) r.reset();
}

int RunPoller::completedStep() const {
  int step = -1;
  for (const auto& p : progress_) step = step < 0 ? p.lastStep : std::min(step, p.lastStep);
  return std::max(step, 0);
}

bool RunPoller::poll(std::vector<LiveAlert>* alerts) {
  bool progressed = false;
  const size_t before = alerts != nullptr ? alerts->size() : 0;
  for (int r = 0; r < ranks(); ++r) progressed |= pollRank(r, alerts);
  // One poll can bring several ranks' alerts: print them in step order (then rank), as they happened.
  if (alerts != nullptr)
    std::stable_sort(alerts->begin() + static_cast<std::ptrdiff_t>(before), alerts->end(),
                     [](const LiveAlert& a, const LiveAlert& b) {
                       return std::tie(a.row.step, a.row.rank) < std::tie(b.row.step, b.row.rank);
                     });
  return progressed;
}

double RunPoller::watchdogLimitS(double hangTimeoutS, double startupTimeoutS) const {
  return completedStep() >= 1 ? hangTimeoutS : std::max(hangTimeoutS, startupTimeoutS);
}

bool RunPoller::openRank(int r) {
  auto& reader = readers_[static_cast<size_t>(r)];
  RankProgress& p = progress_[static_cast<size_t>(r)];
  const auto file = dir_ / ("rank-" + std::to_string(firstRank_ + r) + ".db");
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) return reader != nullptr && !p.earlier;  // removed: keep reading what is open
  // While a reader holds its file open, no new file can get that inode: another one means a new job's file.
  const FileId id{st.st_dev, st.st_ino};
  if (reader) {
    if (id == fileIds_[static_cast<size_t>(r)]) return !p.earlier;
    reader.reset();
    p = RankProgress{};
  }
  auto opened = tracedb::Reader::open(file);
  if (!opened) return false;  // still being created: retry at the next poll
  reader = std::move(opened.value());
  reader->setBusyTimeout(50);
  fileIds_[static_cast<size_t>(r)] = id;
  p.lastGrowth = std::chrono::steady_clock::now();
  if (auto epoch = reader->metaValue(tracedb::meta_keys::kEpochUnixNs)) {
    try {
      p.epochUnixNs = std::stoll(*epoch);
    } catch (const std::exception&) {
      p.epochUnixNs = 0;
    }
  }
  readRankRow(r);
  p.earlier = notBeforeUnixNs_ > 0 && p.ended && p.endUnixNs < notBeforeUnixNs_;
  return !p.earlier;
}

std::string RunPoller::exitReasonNow(int r) {
  if (!openRank(r)) return {};
  readRankRow(r);
  return progress_[static_cast<size_t>(r)].exitReason;
}

void RunPoller::readRankRow(int r) {
  RankProgress& p = progress_[static_cast<size_t>(r)];
  auto rows = readers_[static_cast<size_t>(r)]->ranks();
  if (!rows) return;  // busy now: the next poll
  for (const tracedb::RankInfo& row : *rows) {
    if (row.rank != firstRank_ + r) continue;
    if (!row.host.empty()) p.host = row.host;
    p.pid = row.pid;
    p.worldSize = row.worldSize;
    p.localRank = row.localRank;
    p.ended = row.endNs.has_value();
    p.exitReason = row.exitReason;
    p.endUnixNs = row.endNs ? p.epochUnixNs + *row.endNs : 0;
  }
}

bool RunPoller::pollRank(int r, std::vector<LiveAlert>* alerts) {
  if (!openRank(r)) return false;
  auto& reader = readers_[static_cast<size_t>(r)];
  RankProgress& p = progress_[static_cast<size_t>(r)];
  if (p.seen) readRankRow(r);  // (just read when the file was opened)
  bool progressed = false;
  p.seen = true;
  if (auto ids = reader->latestIds()) {
    const bool grew = ids->span > p.maxSpanId || ids->collective > p.maxCollectiveId;
    if (grew) p.lastGrowth = std::chrono::steady_clock::now();
    progressed |= grew;
    p.maxSpanId = std::max(p.maxSpanId, ids->span);
    p.maxCollectiveId = std::max(p.maxCollectiveId, ids->collective);
  }
  if (auto steps = reader->latestStepStats(9); steps && !steps->empty()) {
    const tracedb::StepStatRow& newest = steps->front();
    const tracedb::StepStatRow& oldest = steps->back();
    progressed |= newest.step > p.lastStep;
    p.lastStep = std::max(p.lastStep, newest.step);
    // SQLite stores a NaN as NULL: a step with stats but no loss had a non-finite one.
    p.lastLoss = newest.loss.value_or(std::numeric_limits<double>::quiet_NaN());
    p.tokens = newest.tokens.value_or(0);
    p.lastStepEndNs = newest.endNs.value_or(0);
    if (newest.beginNs && newest.endNs) p.meanStepNs = static_cast<double>(*newest.endNs - *newest.beginNs);
    std::vector<int64_t> durations;  // the median of these steps' durations (live_stall.h: stuck in compute)
    for (const auto& s : *steps)
      if (s.beginNs && s.endNs && *s.endNs > *s.beginNs) durations.push_back(*s.endNs - *s.beginNs);
    if (!durations.empty()) {
      std::nth_element(durations.begin(), durations.begin() + static_cast<long>(durations.size() / 2), durations.end());
      p.medianStepNs = durations[durations.size() / 2];
    }
    // Mean step period from the ends of up to 9 consecutive steps (includes everything between steps).
    const int64_t newestEnd = newest.endNs.value_or(0), oldestEnd = oldest.endNs.value_or(0);
    if (steps->size() >= 2 && newest.step > oldest.step && newestEnd > oldestEnd)
      p.meanStepNs = static_cast<double>(newestEnd - oldestEnd) / (newest.step - oldest.step);
  }
  if (alerts != nullptr) {
    if (auto rows = reader->alertsSince(p.lastAlertId)) {
      for (tracedb::AlertRow& row : *rows) {
        p.lastAlertId = std::max(p.lastAlertId, row.id);
        LiveAlert a{std::move(row), p.host};
        a.row.rank = firstRank_ + r;
        alerts->push_back(std::move(a));
      }
    }
  }
  return progressed;
}

std::chrono::nanoseconds RunPoller::longestQuiet() const {
  const auto now = std::chrono::steady_clock::now();
  std::chrono::nanoseconds longest{0};
  for (const auto& p : progress_)
    if (p.seen) longest = std::max(longest, std::chrono::duration_cast<std::chrono::nanoseconds>(now - p.lastGrowth));
  return longest;
}

int64_t RunPoller::epochUnixNs() const {
  for (const auto& p : progress_)
    if (p.seen && p.epochUnixNs > 0) return p.epochUnixNs;
  return 0;
}

int64_t RunPoller::nowFileNs() const {
  const auto unixNow = std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
  return unixNow - epochUnixNs();
}

void RunPoller::liveState(const std::vector<bool>& exited, std::vector<analysis::LiveGroup>* groups,
                          std::vector<analysis::LiveRankState>* ranks) {
  groups->clear();
  ranks->clear();
  const auto now = std::chrono::steady_clock::now();
  for (int i = 0; i < this->ranks(); ++i) {
    analysis::LiveRankState st;
    st.rank = firstRank_ + i;
    st.exited = static_cast<size_t>(i) < exited.size() && exited[static_cast<size_t>(i)];
    auto& reader = readers_[static_cast<size_t>(i)];
    const RankProgress& p = progress_[static_cast<size_t>(i)];
    if (reader && p.seen) {
      // A read that fails now (a writer holds the lock past the busy timeout) leaves the rank unread this time.
      auto newest = reader->newestCollectives(st.rank);
      auto span = reader->newestSpan(st.rank);
      if (newest && span) {
        st.seen = true;
        st.newest = std::move(*newest);
        st.lastSpan = std::move(*span);
        st.quietNs = std::chrono::duration_cast<std::chrono::nanoseconds>(now - p.lastGrowth).count();
        // Where it is now (its recorder's open spans) and how long its steps take.
        if (auto open = reader->metaValue(tracedb::meta_keys::kOpenSpans)) {
          st.open = analysis::parseOpenSpans(*open);
          st.openKnown = true;
        }
        st.medianStepNs = p.medianStepNs;
        if (auto gs = reader->groups())
          for (tracedb::GroupInfo& g : *gs)
            if (std::none_of(groups->begin(), groups->end(), [&](const auto& x) { return x.name == g.name; }))
              groups->push_back({std::move(g.name), std::move(g.ranks)});
      }
    }
    ranks->push_back(std::move(st));
  }
}

std::string liveAlertText(const LiveAlert& a) { return report::alertText(a.row, a.host); }

}  // namespace tpscope::cli::capture
