// tpscope: makes tensor-parallel training observable. Subcommands register themselves (command.h).
#include <exception>
#include <iostream>

#include "command.h"
#include "tpscope/tracedb/process.h"
#include "tpscope/version.h"

int main(int argc, char** argv) {
  using namespace tpscope::cli;
  tpscope::tracedb::configureProcess();  // before any trace is opened (process.h)
  CLI::App app{"tpscope " TPSCOPE_VERSION " — tensor-parallel training, made observable"};
  app.require_subcommand(1);
  app.footer(
      "Exit codes: 0 ok; 1 internal error; 2 bad arguments or input (missing, empty, not a tpscope trace, newer\n"
      "format version, damaged; refused SQL); 3 hang, 4 crash, 5 stopped on non-finite values (capture);\n"
      "6 output not written; 7 diagnose --fail-on: a finding at or above that severity; 130 capture interrupted.\n"
      "Capture's codes in full: tpscope capture --help. Details: docs/cli.md, docs/capture.md");
  app.set_version_flag("--version", "tpscope " TPSCOPE_VERSION "\nbuilt with " TPSCOPE_BUILT_WITH);
  Context ctx;
  addRegisteredCommands(app, ctx);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);  // prints the message (and a hint to --help)
    return kExitBadInput;
  } catch (const std::exception& e) {
    std::cerr << "tpscope: internal error: " << e.what() << "\n";
    return kExitInternal;
  }
  return ctx.exitCode;
}
