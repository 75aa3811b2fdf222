// `tpscope capture -- python3 train.py ARGS`: a Python program is recorded without a change to it by running each
// rank as `python3 [OPTIONS] -m tpscope.run train.py ARGS` with the tpscope package on PYTHONPATH (docs/capture.md,
// "Python programs", says why this and not sitecustomize). This is capture's only knowledge of Python.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace tpscope::cli::capture {

// True when `program` (a path or a name) is a Python interpreter: python, python3, python3.11, ...
bool isPythonInterpreter(const std::filesystem::path& program);

// The folder that holds the tpscope package (<folder>/tpscope/__init__.py): <dir of self>/../python (the build
// tree), then <dir of self>/../lib/tpscope/python (an install). Empty when neither has it.
std::filesystem::path findPythonPackage(const std::filesystem::path& self);

// When argv runs a script with a Python interpreter, rewrites it to run through tpscope.run and adds PYTHONPATH
// (the package folder, then the caller's PYTHONPATH) to `env`. argv is left as it is when argv[0] is not a
// Python interpreter, or when it runs `-c CODE`, `-m MODULE` other than tpscope.run, or stdin (a note says so in
// `note`). False with `error` when it is Python but the package cannot be found.
bool instrumentPythonProgram(std::vector<std::string>& argv, const std::filesystem::path& self,
                             std::map<std::string, std::string>* env, std::string* note, std::string* error);

}  // namespace tpscope::cli::capture
