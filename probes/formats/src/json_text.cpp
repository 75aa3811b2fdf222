#include "json_text.h"

#include <charconv>
#include <cmath>
#include <limits>

namespace tpscope::formats {

std::optional<int64_t> microsTokenToNs(std::string_view t) {
  while (!t.empty() && (t.back() == ' ' || t.back() == '\n' || t.back() == '\r' || t.back() == '\t')) t.remove_suffix(1);
  if (t.empty()) return std::nullopt;
  bool negative = false;
  size_t i = 0;
  if (t[0] == '-') {
    negative = true;
    i = 1;
  }
  const size_t intBegin = i;
  while (i < t.size() && t[i] >= '0' && t[i] <= '9') ++i;
  if (i == intBegin) return std::nullopt;
  const std::string_view intPart = t.substr(intBegin, i - intBegin);
  std::string_view frac;
  if (i < t.size() && t[i] == '.') {
    const size_t fracBegin = ++i;
    while (i < t.size() && t[i] >= '0' && t[i] <= '9') ++i;
    frac = t.substr(fracBegin, i - fracBegin);
    if (frac.empty()) return std::nullopt;
  }
  if (i < t.size()) {
    if (t[i] != 'e' && t[i] != 'E') return std::nullopt;
    // Exponent form: rare in traces; a double is exact enough for the magnitudes it is used for.
    double v = 0;
    auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    if (ec != std::errc() || p != t.data() + t.size() || !std::isfinite(v)) return std::nullopt;
    const double ns = v * 1000.0;
    if (std::fabs(ns) > 9.2e18) return std::nullopt;
    return static_cast<int64_t>(std::llround(ns));
  }
  constexpr int64_t kMaxMicros = std::numeric_limits<int64_t>::max() / 1000 - 1;
  if (intPart.size() > 18) return std::nullopt;
  int64_t micros = 0;
  for (char c : intPart) micros = micros * 10 + (c - '0');
  if (micros > kMaxMicros) return std::nullopt;
  int64_t sub = 0;  // ns below the µs
  for (size_t k = 0; k < 3; ++k) sub = sub * 10 + (k < frac.size() ? frac[k] - '0' : 0);
  if (frac.size() > 3 && frac[3] >= '5') ++sub;
  const int64_t ns = micros * 1000 + sub;
  return negative ? -ns : ns;
}

void appendJsonString(std::string& out, std::string_view v) {
  static constexpr char kHex[] = "0123456789abcdef";
  out.push_back('"');
  size_t i = 0;
  while (i < v.size()) {
    const unsigned char c = static_cast<unsigned char>(v[i]);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
      ++i;
    } else if (c < 0x20) {
      switch (c) {
        case '\n': out += "\\n"; break;
        case '\t': out += "\\t"; break;
        case '\r': out += "\\r"; break;
        default:
          out += "\\u00";
          out.push_back(kHex[c >> 4]);
          out.push_back(kHex[c & 15]);
      }
      ++i;
    } else if (c < 0x80) {
      out.push_back(static_cast<char>(c));
      ++i;
    } else {
      // Validate one UTF-8 sequence; copy it if valid, else emit U+FFFD for the lead byte.
      size_t len = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c <= 0xDF ? 2 : 0;
      bool ok = len > 0 && i + len <= v.size();
      for (size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(v[i + k]) & 0xC0) == 0x80;
      if (ok) {
        out.append(v.data() + i, len);
        i += len;
      } else {
        out += "\xEF\xBF\xBD";
        ++i;
      }
    }
  }
  out.push_back('"');
}

void appendInt(std::string& out, int64_t value) {
  char buf[24];
  auto [p, ec] = std::to_chars(buf, buf + sizeof buf, value);
  out.append(buf, p);
}

void appendMicros(std::string& out, int64_t ns) {
  if (ns < 0) {
    out.push_back('-');
    if (ns == std::numeric_limits<int64_t>::min()) ns = std::numeric_limits<int64_t>::max();
    else ns = -ns;
  }
  appendInt(out, ns / 1000);
  int64_t frac = ns % 1000;
  if (frac == 0) return;
  char digits[4] = {'.', static_cast<char>('0' + frac / 100), static_cast<char>('0' + frac / 10 % 10),
                    static_cast<char>('0' + frac % 10)};
  size_t n = 4;
  while (digits[n - 1] == '0') --n;
  out.append(digits, n);
}

void appendDouble(std::string& out, double value) {
  if (!std::isfinite(value)) {
    out += "null";
    return;
  }
  char buf[32];
  auto [p, ec] = std::to_chars(buf, buf + sizeof buf, value);
  out.append(buf, p);
}

}  // namespace tpscope::formats
