// What the end of a run and of each rank means to capture: the outcome behind each exit status, the reason written
// into a rank file (ranks.exit_reason), and the lines of a rank's log that say why it died.
#pragma once

#include <filesystem>
#include <string>

#include "capture/rank_process.h"

namespace tpscope::cli::capture {

// Why the run is being stopped, in the order of the exit statuses.
enum class Outcome { Success, BadArgs, Hang, Crash, NonFinite, Interrupted };

int exitCodeOf(Outcome o);  // kExit* of launcher.h
// The outcome behind an exit status (another node's stop carries the status).
Outcome outcomeOfStatus(int status);
const char* outcomeName(Outcome o);  // "success", "hang", "stopped on non-finite values", ...
// What a rank's own exit status means (tpscope-train: 2 config, 3 collective timeout/failure, 5 non-finite stop).
Outcome outcomeOfRankExit(const ExitStatus& s);

// A rank capture signaled (to dump and stop) that then ended by a signal (or a shell's 128 + signal).
bool endedByOurSignal(const ExitStatus& s, bool stoppedByCapture);

// ranks.exit_reason as the launcher saw it. The prefix matters: the crash analysis takes "crash..." as a crash and
// "stopped by ..." as not one, whatever signal the text names (analysis/crash.h).
// A rank capture signalled counts as stopped by capture only if a signal ended it (the recorder re-raises SIGTERM
// after its dump); one that exited with a status of its own ended on its own terms.
std::string rankExitReason(const ExitStatus& s, bool stoppedByCapture, const std::string& stopWhy);

// The line of a rank's log that says why it died: the last one naming an error or exception ("ModuleNotFoundError:
// No module named 'torch'", "terminate called after ..."), else the last non-empty line; "" for an empty log.
std::string lastErrorLine(const std::filesystem::path& log);

// The first line in a rank's log where its recorder says it could not start or a flush failed (a full disk, a file
// size limit), without the "tpscope recorder: " prefix; "" when there is none. The recorder logs each distinct
// flush failure once (recorder_flusher.cpp), a start failure from startFromEnvironment (environment.cpp).
std::string recorderWriteFailure(const std::filesystem::path& log);

}  // namespace tpscope::cli::capture
