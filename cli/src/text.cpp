#include "text.h"

#include <algorithm>

namespace tpscope::cli {

namespace {
// Display width of UTF-8 text (code points; the dashes and arrows we print are single-width).
size_t width(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s)
    if ((c & 0xC0) != 0x80) ++n;
  return n;
}
}  // namespace

void Table::print(std::ostream& out, const std::string& indent) const {
  std::vector<size_t> w(header_.size(), 0);
  for (size_t i = 0; i < header_.size(); ++i) w[i] = width(header_[i]);
  for (const auto& r : rows_)
    for (size_t i = 0; i < r.size() && i < w.size(); ++i) w[i] = std::max(w[i], width(r[i]));
  auto line = [&](const std::vector<std::string>& r) {
    std::string s = indent;
    for (size_t i = 0; i < w.size(); ++i) {
      const std::string cell = i < r.size() ? r[i] : "";
      const std::string pad(w[i] - width(cell), ' ');
      if (i > 0) s += "  ";
      const bool left = i < align_.size() ? align_[i] == 'l' : i == 0;
      s += left ? cell + pad : pad + cell;
    }
    while (!s.empty() && s.back() == ' ') s.pop_back();
    out << s << "\n";
  };
  line(header_);
  for (const auto& r : rows_) line(r);
}

}  // namespace tpscope::cli
