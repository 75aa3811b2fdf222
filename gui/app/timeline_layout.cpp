// TimelineLayout (timeline_view.h): the lanes' groups, heights and positions, and the lane at a height.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "timeline_view.h"

namespace tpscope::gui {

std::vector<LaneGroup> laneGroups(const RunData& run) {
  if (!run.timeline) return {};
  const auto& lanes = run.timeline->lanes();
  // A key per lane: its rank's TP group, or its rank's host.
  auto keysBy = [&](auto keyOfRank) {
    std::vector<std::string> keys;
    for (const Lane& lane : lanes) keys.push_back(keyOfRank(lane.rank));
    return keys;
  };
  std::map<int, std::string> tpOf, hostOf;
  for (const auto& g : run.groups)
    if (g.name.rfind("tp-", 0) == 0)
      for (int r : g.ranks) tpOf[r] = g.name;
  for (const auto& r : run.ranks)
    if (!r.host.empty()) hostOf[r.rank] = r.host;
  auto grouped = [&](const std::vector<std::string>& keys) -> std::vector<LaneGroup> {
    std::vector<LaneGroup> out;
    std::set<std::string> seen;
    for (size_t l = 0; l < keys.size(); ++l) {
      if (keys[l].empty()) return {};
      if (!out.empty() && keys[l] == keys[out.back().firstLane]) {
        out.back().lastLane = static_cast<int>(l) + 1;
        continue;
      }
      if (!seen.insert(keys[l]).second) return {};  // a group's lanes are not consecutive
      out.push_back({keys[l], static_cast<int>(l), static_cast<int>(l) + 1, false, 0});
    }
    if (out.size() < 2) return {};
    for (LaneGroup& g : out) {
      const int a = lanes[g.firstLane].rank, b = lanes[g.lastLane - 1].rank;
      g.label += a == b ? " · rank " + std::to_string(a) : " · ranks " + std::to_string(a) + "–" + std::to_string(b);
    }
    return out;
  };
  auto groups = grouped(keysBy([&](int rank) { return tpOf.count(rank) ? tpOf[rank] : std::string(); }));
  if (groups.empty()) groups = grouped(keysBy([&](int rank) { return hostOf.count(rank) ? hostOf[rank] : ""; }));
  return groups;
}

void TimelineLayout::build(const TimelineData& timeline, std::vector<LaneGroup> laneGroups) {
  laneTop.clear();
  laneHeight.clear();
  groups = std::move(laneGroups);
  int y = 0;
  size_t g = 0;
  for (size_t l = 0; l < timeline.lanes().size(); ++l) {
    bool hidden = false;
    if (g < groups.size() && static_cast<int>(l) == groups[g].firstLane) {
      groups[g].top = y;
      y += kGroupHeight;
    }
    if (g < groups.size() && static_cast<int>(l) >= groups[g].firstLane && static_cast<int>(l) < groups[g].lastLane) {
      hidden = groups[g].collapsed;
      if (static_cast<int>(l) + 1 == groups[g].lastLane) ++g;
    }
    const int h =
        hidden ? 0 : std::max<int>(1, static_cast<int>(timeline.lanes()[l].rows.size())) * kRowHeight + kLaneGap;
    laneTop.push_back(y);
    laneHeight.push_back(h);
    y += h;
  }
  totalHeight = y;
}

int TimelineLayout::groupAt(int contentY) const {
  for (size_t g = 0; g < groups.size(); ++g)
    if (contentY >= groups[g].top && contentY < groups[g].top + kGroupHeight) return static_cast<int>(g);
  return -1;
}

int TimelineLayout::laneAt(int contentY) const {
  auto it = std::upper_bound(laneTop.begin(), laneTop.end(), contentY);
  if (it == laneTop.begin()) return -1;
  const int lane = static_cast<int>(it - laneTop.begin()) - 1;
  return contentY < laneTop[lane] + laneHeight[lane] ? lane : -1;
}

int TimelineLayout::laneFrom(int contentY) const {
  auto it = std::upper_bound(laneTop.begin(), laneTop.end(), contentY);
  return std::max(0, static_cast<int>(it - laneTop.begin()) - 1);
}

}  // namespace tpscope::gui
