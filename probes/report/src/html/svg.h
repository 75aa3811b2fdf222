// A minimal SVG writer for the HTML report's charts: rectangles, lines and text with optional hover titles. Every
// string argument is HTML-escaped here (names from trace files); colours and classes are the report's own.
// Coordinates are user units of the viewBox (one unit ≈ one CSS pixel at the chart's natural width).
#pragma once

#include <string>
#include <string_view>

namespace tpscope::report::html {

class Svg {
 public:
  // `label`: the chart's accessible name (aria-label); `cssClass`: the element's class.
  Svg(double width, double height, std::string_view cssClass, std::string_view label);

  void rect(double x, double y, double w, double h, std::string_view fill, std::string_view title = {},
            std::string_view cssClass = {});
  void line(double x1, double y1, double x2, double y2, std::string_view stroke, double width = 1);
  // anchor: "start", "middle", "end".
  void text(double x, double y, std::string_view text, std::string_view anchor = "start",
            std::string_view cssClass = {});
  void raw(std::string_view markup) { body_ += markup; }

  std::string str() const;

 private:
  double width_, height_;
  std::string open_;
  std::string body_;
};

}  // namespace tpscope::report::html
