// The one severity scale of tpscope: what a probe alert, a stored alert (alerts.severity, by name) and an analysis
// finding (analysis::Severity is this enum) are graded on. Ordered most severe first, so that sorting by the value
// puts critical on top and "at or above S" is `value <= S`. Names are the stored and printed form; severityName
// and parseSeverity are the only conversions. Header-only, no dependencies.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

namespace tpscope::vocabulary {

enum class Severity : uint8_t { Critical = 0, Error = 1, Warning = 2, Info = 3 };

inline constexpr std::array<std::string_view, 4> kSeverityNames = {"critical", "error", "warning", "info"};

// "critical", "error", "warning", "info".
constexpr std::string_view severityName(Severity severity) {
  const auto i = static_cast<size_t>(severity);
  return i < kSeverityNames.size() ? kSeverityNames[i] : std::string_view("warning");
}

constexpr std::optional<Severity> parseSeverity(std::string_view name) {
  for (size_t i = 0; i < kSeverityNames.size(); ++i)
    if (kSeverityNames[i] == name) return static_cast<Severity>(i);
  return std::nullopt;
}

// The severity of a stored alert: its name, and a name this version does not know grades as a warning.
constexpr Severity storedSeverity(std::string_view name) { return parseSeverity(name).value_or(Severity::Warning); }

}  // namespace tpscope::vocabulary
