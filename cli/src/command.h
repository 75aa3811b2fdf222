// Subcommand registration. Each src/cmd_<name>.cpp defines a function that adds its subcommand to the CLI11 app
// and registers it with TPS_REGISTER_COMMAND(order, function); main.cpp adds them all in `order` (the order of the
// --help listing). The subcommand's callback stores its exit code in `Context::exitCode`.
//
// Exit codes (documented in --help and docs/cli.md):
#pragma once

#include <CLI/CLI.hpp>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tpscope/tracedb/reader.h"

namespace tpscope::cli {

inline constexpr int kExitOk = 0;           // success (diagnose: no finding at or above --fail-on)
inline constexpr int kExitInternal = 1;     // unexpected internal error (a bug: please report it)
inline constexpr int kExitBadInput = 2;     // bad arguments, or an input file that is missing, empty, not a
                                            // tpscope trace, of a newer format version, or damaged; refused SQL
// 3, 4, 5 are `tpscope capture`'s: hang, crash, non-finite stop (docs/capture.md).
inline constexpr int kExitOutput = 6;       // an output file could not be written (nothing half-written is left)
inline constexpr int kExitFindings = 7;     // diagnose --fail-on SEVERITY: a finding at or above it

struct Context {
  int exitCode = kExitOk;
};

using AddCommand = void (*)(CLI::App& app, Context& ctx);

// Returns true (for a static initialiser). `order` sorts the commands in --help.
bool registerCommand(int order, AddCommand add);
void addRegisteredCommands(CLI::App& app, Context& ctx);

#define TPS_CONCAT_CMD_INNER(a, b) a##b
#define TPS_CONCAT_CMD(a, b) TPS_CONCAT_CMD_INNER(a, b)
#define TPS_REGISTER_COMMAND(order, fn) \
  static const bool TPS_CONCAT_CMD(tps_registered_, __LINE__) = ::tpscope::cli::registerCommand(order, fn)

// Opens a trace for reading; on failure prints "tpscope: <message naming the file>" to stderr and returns null.
std::unique_ptr<tracedb::Reader> openRun(const std::filesystem::path& path);

// The rank files of capture folders (their rank-*.db files) and of files named as they are, in rank order (folders in
// any order: one per node of a multi-node job). On a folder without rank files prints the error for `command` and
// returns nullopt.
std::optional<std::vector<std::filesystem::path>> rankFilesOf(const std::vector<std::filesystem::path>& inputs,
                                                             const std::string& command);

// This executable's path (capture finds tpscope-train beside it); empty if /proc/self/exe cannot be read.
std::filesystem::path selfPath();

// Prints "tpscope <command>: <message>" to stderr.
void printError(const std::string& command, const std::string& message);

}  // namespace tpscope::cli
