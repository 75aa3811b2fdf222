// tpscope diagnose RUN [--json] [--fail-on SEVERITY]: the root-cause chain, then every other finding, most severe
// first. RUN is a run file, or capture folders / rank files, diagnosed through a diagnosis file in the temporary
// folder (analysis::writeDiagnosisFile) without writing a merged run file.
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "command.h"
#include "tpscope/report/findings_text.h"
#include "tpscope/analysis/diagnose.h"
#include "tpscope/report/json_output.h"

namespace tpscope::cli {
namespace {

using analysis::Finding;
using analysis::Severity;

// The diagnosis file of rank files, in a private folder of the temporary folder (mkdtemp: no name another user can
// take first). Removed with the folder when the command ends, and on SIGINT or SIGTERM: the handler unlinks every name
// the file can have (merge's temporary name, SQLite's journal), all of them built beforehand, then
// dies of the signal as it would have.
class DiagnosisFile {
 public:
  DiagnosisFile() = default;
  DiagnosisFile(const DiagnosisFile&) = delete;
  DiagnosisFile& operator=(const DiagnosisFile&) = delete;
  ~DiagnosisFile() {
    if (folder_.empty()) return;
    std::signal(SIGINT, SIG_DFL);
    std::signal(SIGTERM, SIG_DFL);
    std::error_code ec;
    std::filesystem::remove_all(folder_, ec);
    names().clear();
  }

  // Creates the folder; the file's path, or an error message.
  tracedb::Result<std::filesystem::path> create() {
    std::error_code ec;
    std::string pattern = (std::filesystem::temp_directory_path(ec) / "tpscope-diagnose-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr)
      return tracedb::Status::error(pattern + ": cannot create a folder for the diagnosis file: " +
                                    std::strerror(errno));
    folder_ = pattern;
    const std::filesystem::path file = folder_ / "diagnosis.db";
    const std::string tmp = ".tmp-" + std::to_string(::getpid());  // merge's temporary name (tracedb/merge.cpp)
    for (const std::string& name : {file.string(), file.string() + tmp})
      for (const char* suffix : {"", "-journal", "-wal", "-shm"}) names().push_back(name + suffix);
    names().push_back(folder_.string());
    std::signal(SIGINT, removeOnSignal);
    std::signal(SIGTERM, removeOnSignal);
    return file;
  }

 private:
  static std::vector<std::string>& names() {
    static std::vector<std::string> n;  // complete before the handler is installed; read only by it
    return n;
  }
  static void removeOnSignal(int sig) {
    const auto& n = names();
    for (size_t i = 0; i + 1 < n.size(); ++i) ::unlink(n[i].c_str());
    if (!n.empty()) ::rmdir(n.back().c_str());
    std::signal(sig, SIG_DFL);
    std::raise(sig);
  }

  std::filesystem::path folder_;
};

struct DiagnoseArgs {
  std::vector<std::filesystem::path> runs;
  bool json = false;
  std::string failOn;
};

void addDiagnose(CLI::App& app, Context& ctx) {
  auto args = std::make_shared<DiagnoseArgs>();
  auto* cmd = app.add_subcommand("diagnose", "The root-cause chain (cause → consequences, each sized by what it "
                                             "cost), then every other finding (NaN origin, hang, desync, crash, "
                                             "stragglers, spikes, overhead), most severe first");
  cmd->add_option("run", args->runs,
                  "Run file (merged, a rank's file, or imported), or capture folders (one per node) and rank files: "
                  "diagnosed straight from the rank files, read in parallel, without a merged file")
      ->required();
  cmd->add_flag("--json", args->json, "Print the chain and the findings as JSON (the stable contract of "
                                      "docs/diagnosis.md)");
  cmd->add_option("--fail-on", args->failOn, "Exit with status 7 when a finding is at or above this severity")
      ->check(CLI::IsMember({"critical", "error", "warning", "info"}));
  cmd->callback([args, &ctx]() {
    std::error_code ec;
    const bool runFile = args->runs.size() == 1 && !std::filesystem::is_directory(args->runs.front(), ec);
    DiagnosisFile scratch;
    std::filesystem::path diagnosisFile;
    if (!runFile) {
      auto files = rankFilesOf(args->runs, "diagnose");
      if (!files) {
        ctx.exitCode = kExitBadInput;
        return;
      }
      auto path = scratch.create();
      if (!path) {
        printError("diagnose", path.error());
        ctx.exitCode = kExitOutput;
        return;
      }
      diagnosisFile = *path;
      if (tracedb::Status s = analysis::writeDiagnosisFile(*files, diagnosisFile); !s) {
        printError("diagnose", s.message());
        ctx.exitCode = kExitBadInput;
        return;
      }
    }
    auto reader = openRun(runFile ? args->runs.front() : diagnosisFile);
    if (!reader) {
      ctx.exitCode = kExitBadInput;
      return;
    }
    const auto result = analysis::diagnose(*reader);
    std::string name;
    for (const auto& r : args->runs) name += (name.empty() ? "" : " ") + r.string();
    if (args->json) std::cout << report::diagnosisToJson(result, name);
    else report::printDiagnosis(result, std::cout);
    if (!result.errors.empty()) {
      for (const auto& e : result.errors) printError("diagnose", e);
      ctx.exitCode = kExitBadInput;
      return;
    }
    if (!args->failOn.empty()) {
      const Severity limit = *analysis::parseSeverity(args->failOn);
      for (const Finding& f : result.findings)
        if (f.severity <= limit) ctx.exitCode = kExitFindings;
    }
  });
}

TPS_REGISTER_COMMAND(20, addDiagnose);

}  // namespace
}  // namespace tpscope::cli
