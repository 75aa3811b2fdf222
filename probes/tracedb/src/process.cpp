#include "tpscope/tracedb/process.h"

#include <sqlite3.h>

namespace tpscope::tracedb {

void configureProcess() { sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0); }

}  // namespace tpscope::tracedb
