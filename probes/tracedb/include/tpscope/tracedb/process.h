// Process-wide settings of the trace format's SQLite, for programs that open many trace files at once.
#pragma once

namespace tpscope::tracedb {

// Turns off SQLite's process-wide count of its memory (SQLITE_CONFIG_MEMSTATUS): with it on, each of SQLite's
// allocations takes a global mutex, which the threads of merge and diagnose (several connections at once) contend
// for. Call it first thing in main(), before any trace is opened: SQLite accepts it only before its initialisation
// (later calls do nothing). The recorder's ranks do not need it (one connection each).
void configureProcess();

}  // namespace tpscope::tracedb
