// One trace file, one or several ranks. A Kineto trace is one rank's; a Chrome trace may hold several (tpscope's
// export: one process per rank; Megatron-style traces: processes or threads named "PP rank 2, TP rank 0"). The
// lanes are grouped by the rank coordinates their thread's name carries, else their process's (coordsFromName);
// with two or more distinct coordinates in a file it is split into one part per rank, else it is one part whose
// coordinates are the one found (if any) completed by distributedInfo's.
#pragma once

#include <string>
#include <vector>

#include "kineto_parse.h"

namespace tpscope::formats::kineto {

struct RankPart {
  RankCoords coords;
  std::string source;  // where the coordinates came from: "process name", "thread name", "distributedInfo", ""
  // The part's events; the file's buffer, metas and spanArgs stay with the input file (views and indexes point
  // there), so a part is used only while its file is alive. Empty (unused) when the part is the whole file.
  KinetoFile events;
  bool wholeFile = true;
};

// The parts of `file`. Events on lanes that carry no rank in a file of several ranks are left out and counted in
// the first part's `events.skipped` ("events of a process or thread without a rank in its name").
std::vector<RankPart> splitByRank(const KinetoFile& file);

}  // namespace tpscope::formats::kineto
