#include "html/html_text.h"

#include "html/sections.h"

#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

namespace tpscope::report::html {

void appendEscaped(std::string& out, std::string_view text) {
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
}

std::string escapeHtml(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  appendEscaped(out, text);
  return out;
}

std::string scriptJsonString(std::string_view text) {
  const std::string json =
      nlohmann::json(std::string(text)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::string out;
  out.reserve(json.size());
  for (char c : json) {
    switch (c) {
      case '<': out += "\\u003c"; break;
      case '>': out += "\\u003e"; break;
      case '&': out += "\\u0026"; break;
      default: out += c;
    }
  }
  return out;
}

std::string coord(double v) {
  if (!std::isfinite(v)) return "0";
  const double r = std::round(v * 10) / 10;
  char buf[32];
  if (r == std::floor(r)) std::snprintf(buf, sizeof buf, "%.0f", r == 0 ? 0.0 : r);
  else std::snprintf(buf, sizeof buf, "%.1f", r);
  return buf;
}

std::string sectionStart(std::string_view id, std::string_view title) {
  std::string out = "<section id=\"";
  appendEscaped(out, id);
  out += "\"><h2>";
  appendEscaped(out, title);
  return out + "</h2>";
}

}  // namespace tpscope::report::html
