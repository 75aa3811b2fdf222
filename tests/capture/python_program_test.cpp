// capture's rewrite of a Python program's command line (cli/src/capture/python_program.h).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "capture/python_program.h"

namespace fs = std::filesystem;
using tpscope::cli::capture::findPythonPackage;
using tpscope::cli::capture::instrumentPythonProgram;
using tpscope::cli::capture::isPythonInterpreter;

namespace {

// A fake install: <root>/bin/tpscope and <root>/python/tpscope/__init__.py.
class PythonProgram : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("tpscope-python-program-" + std::to_string(::getpid()));
    fs::create_directories(root_ / "bin");
    fs::create_directories(root_ / "python" / "tpscope");
    std::ofstream(root_ / "python" / "tpscope" / "__init__.py") << "\n";
    self_ = root_ / "bin" / "tpscope";
    unsetenv("PYTHONPATH");
  }
  void TearDown() override { fs::remove_all(root_); }

  fs::path root_, self_;
};

TEST(PythonInterpreter, IsToldByName) {
  EXPECT_TRUE(isPythonInterpreter("/usr/bin/python3"));
  EXPECT_TRUE(isPythonInterpreter("python3.11"));
  EXPECT_TRUE(isPythonInterpreter("/venv/bin/python"));
  EXPECT_FALSE(isPythonInterpreter("/usr/bin/python3-config"));
  EXPECT_FALSE(isPythonInterpreter("./tpscope-train"));
}

TEST_F(PythonProgram, ScriptRunsThroughTpscopeRunWithThePackageOnPythonPath) {
  std::vector<std::string> argv{"/usr/bin/python3", "-u", "-W", "ignore", "train.py", "--steps", "3"};
  std::map<std::string, std::string> env;
  std::string note, error;
  ASSERT_TRUE(instrumentPythonProgram(argv, self_, &env, &note, &error)) << error;
  EXPECT_EQ(argv, (std::vector<std::string>{"/usr/bin/python3", "-u", "-W", "ignore", "-m", "tpscope.run", "train.py",
                                            "--steps", "3"}));
  EXPECT_EQ(fs::path(env.at("PYTHONPATH")), fs::weakly_canonical(root_ / "python"));
  EXPECT_TRUE(note.empty());
}

TEST_F(PythonProgram, KeepsTheCallersPythonPathAndAnExplicitTpscopeRun) {
  setenv("PYTHONPATH", "/mine", 1);
  std::vector<std::string> argv{"python3", "-m", "tpscope.run", "train.py"};
  const auto before = argv;
  std::map<std::string, std::string> env;
  std::string note, error;
  ASSERT_TRUE(instrumentPythonProgram(argv, self_, &env, &note, &error));
  EXPECT_EQ(argv, before);
  EXPECT_EQ(env.at("PYTHONPATH"), fs::weakly_canonical(root_ / "python").string() + ":/mine");
  unsetenv("PYTHONPATH");
}

TEST_F(PythonProgram, LeavesOtherProgramsModulesAndCodeAlone) {
  for (std::vector<std::string> argv : {std::vector<std::string>{"./tpscope-train", "--config", "x.json"},
                                        std::vector<std::string>{"python3", "-m", "http.server"},
                                        std::vector<std::string>{"python3", "-c", "print(1)"},
                                        std::vector<std::string>{"python3"}}) {
    const auto before = argv;
    std::map<std::string, std::string> env;
    std::string note, error;
    EXPECT_TRUE(instrumentPythonProgram(argv, self_, &env, &note, &error));
    EXPECT_EQ(argv, before);
    EXPECT_TRUE(env.empty());
    EXPECT_EQ(note.empty(), before.front() == "./tpscope-train");
  }
}

TEST_F(PythonProgram, MissingPackageIsAnError) {
  fs::remove_all(root_ / "python");
  EXPECT_TRUE(findPythonPackage(self_).empty());
  std::vector<std::string> argv{"python3", "train.py"};
  std::map<std::string, std::string> env;
  std::string note, error;
  EXPECT_FALSE(instrumentPythonProgram(argv, self_, &env, &note, &error));
  EXPECT_NE(error.find("tpscope Python package was not found"), std::string::npos) << error;
}

}  // namespace
