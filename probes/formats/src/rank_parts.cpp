#include "rank_parts.h"

#include <algorithm>
#include <unordered_map>

#include "pipeline_names.h"

namespace tpscope::formats::kineto {

namespace {

void fillMissing(RankCoords& c, const RankCoords& from) {
  for (std::optional<int> RankCoords::*f : {&RankCoords::rank, &RankCoords::pp, &RankCoords::tp, &RankCoords::dp,
                                            &RankCoords::ppSize, &RankCoords::tpSize, &RankCoords::dpSize})
    if (!(c.*f)) c.*f = from.*f;
}

// A copy of `file`'s description without its events (the buffer stays with `file`).
KinetoFile emptyLike(const KinetoFile& file) {
  KinetoFile out;
  out.path = file.path;
  out.objectForm = file.objectForm;
  out.worldSize = file.worldSize;
  out.backend = file.backend;
  out.pgConfig = file.pgConfig;
  out.baseTimeNs = file.baseTimeNs;
  out.metas = file.metas;
  out.spanArgs = file.spanArgs;
  out.threadNames = file.threadNames;
  out.processLabels = file.processLabels;
  out.processNames = file.processNames;
  out.laneStrings = file.laneStrings;
  return out;
}

}  // namespace

namespace {

// Whether the names of the file's processes and threads carry two or more distinct rank coordinates (cheap: the
// names, not the events, are looked at).
bool namesSeveralRanks(const KinetoFile& file) {
  std::vector<RankCoords> seen;
  auto note = [&](const std::string& name) {
    const RankCoords c = coordsFromName(name);
    if (c.any() && std::find(seen.begin(), seen.end(), c) == seen.end()) seen.push_back(c);
  };
  for (const auto& [lane, name] : file.threadNames) note(name);
  for (const auto& [pid, name] : file.processNames) note(name);
  return seen.size() >= 2;
}

// The one part of a file of one rank, from the coordinates its names carry (`named`, at most one distinct value),
// completed by distributedInfo's.
std::vector<RankPart> wholeFile(const KinetoFile& file, RankPart named) {
  named.wholeFile = true;
  named.events = {};
  if (file.coords.any() || file.coords.ppSize || file.coords.tpSize || file.coords.dpSize) {
    if (!named.coords.any()) named.source = "distributedInfo";
    fillMissing(named.coords, file.coords);
  }
  std::vector<RankPart> out;
  out.push_back(std::move(named));
  return out;
}

// The coordinates a file of one rank names, the thread's before the process's.
RankPart namedCoords(const KinetoFile& file) {
  RankPart named;
  for (const auto& [lane, name] : file.threadNames)
    if (RankCoords c = coordsFromName(name); c.any()) return RankPart{c, "thread name", {}, true};
  for (const auto& [pid, name] : file.processNames)
    if (RankCoords c = coordsFromName(name); c.any()) return RankPart{c, "process name", {}, true};
  return named;
}

}  // namespace

std::vector<RankPart> splitByRank(const KinetoFile& file) {
  if (!namesSeveralRanks(file)) return wholeFile(file, namedCoords(file));
  struct Lane {
    RankCoords coords;
    const char* source = "";
  };
  std::unordered_map<LaneKey, int, LaneKeyHash> laneOf;  // lane -> index into parts, -1 without a rank
  std::vector<RankPart> parts;
  auto partFor = [&](const LaneKey& lane) {
    auto [it, fresh] = laneOf.emplace(lane, -1);
    if (!fresh) return it->second;
    Lane found;
    if (auto t = file.threadNames.find(lane); t != file.threadNames.end()) {
      found.coords = coordsFromName(t->second);
      found.source = "thread name";
    }
    if (!found.coords.any())
      if (auto p = file.processNames.find(lane.pid); p != file.processNames.end()) {
        found.coords = coordsFromName(p->second);
        found.source = "process name";
      }
    if (!found.coords.any()) return it->second;
    auto same = std::find_if(parts.begin(), parts.end(), [&](const RankPart& p) { return p.coords == found.coords; });
    if (same == parts.end()) {
      parts.push_back(RankPart{found.coords, found.source, {}, true});
      same = parts.end() - 1;
    }
    return it->second = static_cast<int>(same - parts.begin());
  };
  for (const RawSpan& s : file.spans) partFor(s.lane);
  for (const RawCounter& c : file.counters) partFor(c.lane);
  if (parts.size() < 2)  // the names of several ranks, but the events of one (or none)
    return wholeFile(file, parts.empty() ? RankPart{} : std::move(parts.front()));
  for (RankPart& p : parts) {
    p.wholeFile = false;
    p.events = emptyLike(file);
  }
  parts.front().events.skipped = file.skipped;
  parts.front().events.events = file.events;
  int64_t unassigned = 0;
  for (const RawSpan& s : file.spans) {
    const int p = laneOf.at(s.lane);
    if (p >= 0) parts[static_cast<size_t>(p)].events.spans.push_back(s);
    else ++unassigned;
  }
  for (const RawCounter& c : file.counters) {
    const int p = laneOf.at(c.lane);
    if (p >= 0) parts[static_cast<size_t>(p)].events.counters.push_back(c);
    else ++unassigned;
  }
  for (const RawFlow& f : file.flows) {
    auto it = laneOf.find(f.lane);
    if (it != laneOf.end() && it->second >= 0) parts[static_cast<size_t>(it->second)].events.flows.push_back(f);
  }
  if (unassigned > 0)
    parts.front().events.skipped["events of a process or thread without a rank in its name (file of several ranks)"] +=
        unassigned;
  return parts;
}

}  // namespace tpscope::formats::kineto
