#include "golden.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace tpscope::testing {

namespace {
std::string readFile(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
void writeFile(const std::filesystem::path& p, const std::string& text) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}
}  // namespace

::testing::AssertionResult matchesGolden(const std::filesystem::path& goldenDir, const std::filesystem::path& actualDir,
                                         const std::string& name, const std::string& actual) {
  const auto golden = goldenDir / name;
  if (const char* update = std::getenv("TPSCOPE_UPDATE_GOLDEN"); update && std::string(update) == "1") {
    writeFile(golden, actual);
    return ::testing::AssertionSuccess() << "updated " << golden;
  }
  if (!std::filesystem::exists(golden))
    return ::testing::AssertionFailure() << "no golden file " << golden
                                         << " (run with TPSCOPE_UPDATE_GOLDEN=1 to create it)";
  const std::string expected = readFile(golden);
  if (expected == actual) return ::testing::AssertionSuccess();
  const auto out = actualDir / (name + ".actual");
  writeFile(out, actual);
  std::string diff;
  const std::string cmd = "diff -u '" + golden.string() + "' '" + out.string() + "' 2>&1";
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) diff.append(buf, n);
    pclose(p);
  }
  return ::testing::AssertionFailure() << name << " differs from its golden file; actual output in " << out << "\n"
                                       << diff;
}

}  // namespace tpscope::testing
