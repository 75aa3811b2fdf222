// Small JSON text helpers shared by the importer (number tokens) and the exporter (streamed output).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tpscope::formats {

// Kineto's times are µs as JSON numbers ("1682725898236567", "4458676423209.322", "1.5e3"). Converts the number's
// text to integer ns exactly (decimal arithmetic, rounding the 4th fractional digit), without the precision loss of
// a double at unix-epoch magnitudes. nullopt if `token` is not a JSON number or out of range.
std::optional<int64_t> microsTokenToNs(std::string_view token);

// Appends `value` as a JSON string literal (quotes included), escaping ", \ and control characters; invalid UTF-8
// bytes are replaced by U+FFFD so the output stays valid JSON.
void appendJsonString(std::string& out, std::string_view value);

// Appends ns as µs with exactly the ns precision: 1234567 -> "1234.567", -5 -> "-0.005", 3000 -> "3".
void appendMicros(std::string& out, int64_t ns);

void appendInt(std::string& out, int64_t value);
// Shortest representation that round-trips; non-finite values become null (JSON has no NaN).
void appendDouble(std::string& out, double value);

}  // namespace tpscope::formats
