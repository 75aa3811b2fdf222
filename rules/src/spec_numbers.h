// Internal to tpscope_rules: the number syntax shared by --inject specs and --health rules.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace tpscope::rules::detail {

// The whole of `v` as a decimal integer; nullopt for empty text, trailing characters or overflow.
std::optional<int64_t> parseSpecInt(std::string_view v);
// The whole of `v` as a finite real (strtod syntax); nullopt for empty text, trailing characters, NaN or Inf.
std::optional<double> parseSpecReal(std::string_view v);

}  // namespace tpscope::rules::detail
