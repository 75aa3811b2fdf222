// Golden-file comparison for tests: compares `actual` with <golden dir>/<name>. On a mismatch it writes
// <actual dir>/<name>.actual, prints `diff -u` and fails. TPSCOPE_UPDATE_GOLDEN=1 in the environment rewrites the
// golden file instead (review the change with git diff).
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

namespace tpscope::testing {

::testing::AssertionResult matchesGolden(const std::filesystem::path& goldenDir, const std::filesystem::path& actualDir,
                                         const std::string& name, const std::string& actual);

}  // namespace tpscope::testing
