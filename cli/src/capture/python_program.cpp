#include "capture/python_program.h"

#include <cstdlib>
#include <fstream>
#include <regex>
#include <system_error>

namespace tpscope::cli::capture {

namespace fs = std::filesystem;

namespace {

// Interpreter options that take the next argument as their value (python3 --help).
bool takesValue(const std::string& option) {
  return option == "-W" || option == "-X" || option == "--check-hash-based-pycs";
}

}  // namespace

bool isPythonInterpreter(const fs::path& program) {
  static const std::regex kName("python[0-9.]*");
  return std::regex_match(program.filename().string(), kName);
}

fs::path findPythonPackage(const fs::path& self) {
  if (self.empty()) return {};
  const fs::path dir = self.parent_path();
  for (const fs::path& p : {dir / ".." / "python", dir / ".." / "lib" / "tpscope" / "python"}) {
    std::error_code ec;
    if (fs::is_regular_file(p / "tpscope" / "__init__.py", ec)) return fs::weakly_canonical(p, ec);
  }
  return {};
}

bool instrumentPythonProgram(std::vector<std::string>& argv, const fs::path& self,
                             std::map<std::string, std::string>* env, std::string* note, std::string* error) {
  if (argv.empty() || !isPythonInterpreter(argv.front())) return true;
  size_t i = 1;
  bool alreadyRun = false;
  for (; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a == "-m") {
      alreadyRun = i + 1 < argv.size() && argv[i + 1] == "tpscope.run";
      if (!alreadyRun) {
        *note = "runs a module (-m); recorded only if it starts tpscope itself";
        return true;
      }
      break;
    }
    if (a == "-c" || a == "-" || a.starts_with("-c")) {
      *note = "runs code from -c or stdin; recorded only if it starts tpscope itself";
      return true;
    }
    if (a.empty() || a.front() != '-') break;  // the script
    if (takesValue(a)) ++i;
  }
  if (!alreadyRun && i >= argv.size()) {
    *note = "no script given; recorded only if it starts tpscope itself";
    return true;
  }
  const fs::path package = findPythonPackage(self);
  if (package.empty()) {
    if (alreadyRun) return true;  // the caller brought tpscope.run (and its PYTHONPATH) itself
    *error = "the program is a Python interpreter, but the tpscope Python package was not found beside tpscope ("
             "../python or ../lib/tpscope/python; build with -DTPSCOPE_WITH_PYTHON=ON), so it cannot be recorded";
    return false;
  }
  // A bare `python3` runs the interpreter the package was built for (its _native and _autograd are compiled for that
  // interpreter and its PyTorch): the python3 first on PATH may be another one (a pyenv or conda interpreter without
  // torch, where every rank would die with "No module named 'torch'"). An explicit path is run as given.
  if (argv.front().find('/') == std::string::npos) {
    std::string interpreter;
    if (const char* e = std::getenv("TPSCOPE_PYTHON"); e != nullptr && *e != '\0') {
      interpreter = e;
    } else if (std::ifstream in(package / "interpreter"); in) {
      std::getline(in, interpreter);
    }
    std::error_code ec;
    if (!interpreter.empty() && fs::exists(interpreter, ec) && interpreter != argv.front()) {
      *note = argv.front() + " runs as " + interpreter +
              " (the interpreter tpscope's Python package was built for; TPSCOPE_PYTHON or a path chooses another)";
      argv.front() = interpreter;
    }
  }
  if (!alreadyRun) argv.insert(argv.begin() + static_cast<std::ptrdiff_t>(i), {"-m", "tpscope.run"});
  const char* existing = std::getenv("PYTHONPATH");
  (*env)["PYTHONPATH"] =
      package.string() + (existing != nullptr && *existing != '\0' ? ":" + std::string(existing) : "");
  return true;
}

}  // namespace tpscope::cli::capture
