#include "html/svg.h"

#include "html/html_text.h"

namespace tpscope::report::html {

Svg::Svg(double width, double height, std::string_view cssClass, std::string_view label)
    : width_(width), height_(height) {
  open_ = "<svg role=\"img\" class=\"";  // inline SVG in HTML needs no xmlns
  appendEscaped(open_, cssClass);
  open_ += "\" viewBox=\"0 0 " + coord(width_) + " " + coord(height_) + "\" width=\"" + coord(width_) +
           "\" height=\"" + coord(height_) + "\" aria-label=\"";
  appendEscaped(open_, label);
  open_ += "\">";
}

void Svg::rect(double x, double y, double w, double h, std::string_view fill, std::string_view title,
               std::string_view cssClass) {
  body_ += "<rect x=\"" + coord(x) + "\" y=\"" + coord(y) + "\" width=\"" + coord(w) + "\" height=\"" + coord(h) +
           "\" fill=\"";
  appendEscaped(body_, fill);
  body_ += '"';
  if (!cssClass.empty()) {
    body_ += " class=\"";
    appendEscaped(body_, cssClass);
    body_ += '"';
  }
  if (title.empty()) {
    body_ += "/>";
    return;
  }
  body_ += "><title>";
  appendEscaped(body_, title);
  body_ += "</title></rect>";
}

void Svg::line(double x1, double y1, double x2, double y2, std::string_view stroke, double width) {
  body_ += "<line x1=\"" + coord(x1) + "\" y1=\"" + coord(y1) + "\" x2=\"" + coord(x2) + "\" y2=\"" + coord(y2) +
           "\" stroke=\"";
  appendEscaped(body_, stroke);
  body_ += "\" stroke-width=\"" + coord(width) + "\"/>";
}

void Svg::text(double x, double y, std::string_view text, std::string_view anchor, std::string_view cssClass) {
  body_ += "<text x=\"" + coord(x) + "\" y=\"" + coord(y) + "\" text-anchor=\"";
  appendEscaped(body_, anchor);
  body_ += '"';
  if (!cssClass.empty()) {
    body_ += " class=\"";
    appendEscaped(body_, cssClass);
    body_ += '"';
  }
  body_ += '>';
  appendEscaped(body_, text);
  body_ += "</text>";
}

std::string Svg::str() const { return open_ + body_ + "</svg>"; }

}  // namespace tpscope::report::html
