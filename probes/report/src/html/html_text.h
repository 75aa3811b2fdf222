// Text that goes into the HTML report. Every string that comes from a trace file (span, group, parameter, host and
// thread names, finding messages that quote them) reaches the page through one of these two doors:
//   escapeHtml   element text and attribute values (quoted with "): & < > " ' become entities;
//   scriptJson   a JSON value inside <script type="application/json">: JSON-escaped, and < > & as \u003c \u003e
//                \u0026, so no "</script>" or "<!--" can end the block early. Invalid UTF-8 becomes U+FFFD.
#pragma once

#include <string>
#include <string_view>

namespace tpscope::report::html {

std::string escapeHtml(std::string_view text);
void appendEscaped(std::string& out, std::string_view text);

// A JSON string literal, quotes included, safe inside a <script> element.
std::string scriptJsonString(std::string_view text);

// A number for SVG coordinates: at most one decimal, no exponent, "-0" avoided.
std::string coord(double v);

}  // namespace tpscope::report::html
