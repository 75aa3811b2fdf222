// The HTML report in a real browser: headless Chromium loads each report of the test runs (the analysis fixtures with
// their faults, hostile names, Kineto imports) from disk and must log nothing to the console (a script error, a CSP
// violation — an attempt to fetch anything — or any console output fails), reach body[data-report-state=ready]
// with timeline rectangles drawn, and never run a payload hidden in a name. A screenshot of the NaN report, decoded
// here (PNG through zlib), must show the charts' colours: the breakdown's compute blue, the heatmap's magenta NaN
// cells and the timeline's step grey (drawn by the page's script). Skipped, with the reason, without Chromium
// (scripts/setup installs Debian's `chromium`); TPSCOPE_CHROMIUM names another binary.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <zlib.h>

#include <array>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>

#include "hostile_names.h"
#include "test_runs.h"

namespace tpscope::cli {
namespace {

namespace fs = std::filesystem;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int run(const std::string& command) {
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string findChromium() {
  if (const char* env = std::getenv("TPSCOPE_CHROMIUM"); env && *env) return env;
  for (const char* name : {"chromium", "chromium-browser", "google-chrome"})
    if (run(std::string("command -v ") + name + " >/dev/null 2>&1") == 0) return name;
  return {};
}

// An 8-bit RGB or RGBA PNG, decoded to RGB (enough for Chromium's screenshots).
struct Image {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;
  std::array<uint8_t, 3> at(int x, int y) const {
    const size_t i = (static_cast<size_t>(y) * width + x) * 3;
    return {rgb[i], rgb[i + 1], rgb[i + 2]};
  }
};

uint32_t be32(const std::string& s, size_t at) {
  return (uint32_t(uint8_t(s[at])) << 24) | (uint32_t(uint8_t(s[at + 1])) << 16) | (uint32_t(uint8_t(s[at + 2])) << 8) |
         uint32_t(uint8_t(s[at + 3]));
}

std::optional<Image> decodePng(const std::string& file) {
  if (file.size() < 33 || file.compare(1, 3, "PNG") != 0) return std::nullopt;
  Image img;
  int channels = 0;
  std::string idat;
  for (size_t at = 8; at + 8 <= file.size();) {
    const uint32_t len = be32(file, at);
    const std::string type = file.substr(at + 4, 4);
    if (type == "IHDR") {
      img.width = static_cast<int>(be32(file, at + 8));
      img.height = static_cast<int>(be32(file, at + 12));
      const int depth = uint8_t(file[at + 16]), colour = uint8_t(file[at + 17]), interlace = uint8_t(file[at + 20]);
      if (depth != 8 || interlace != 0 || (colour != 2 && colour != 6)) return std::nullopt;
      channels = colour == 2 ? 3 : 4;
    } else if (type == "IDAT") {
      idat += file.substr(at + 8, len);
    }
    at += 12 + len;
  }
  const size_t stride = static_cast<size_t>(img.width) * channels;
  std::vector<uint8_t> raw((stride + 1) * img.height);
  uLongf rawLen = raw.size();
  if (channels == 0 ||
      uncompress(raw.data(), &rawLen, reinterpret_cast<const Bytef*>(idat.data()), idat.size()) != Z_OK ||
      rawLen != raw.size())
    return std::nullopt;
  std::vector<uint8_t> prev(stride, 0), cur(stride);
  img.rgb.resize(static_cast<size_t>(img.width) * img.height * 3);
  for (int y = 0; y < img.height; ++y) {
    const uint8_t filter = raw[y * (stride + 1)];
    const uint8_t* in = &raw[y * (stride + 1) + 1];
    for (size_t i = 0; i < stride; ++i) {
      const int a = i >= static_cast<size_t>(channels) ? cur[i - channels] : 0, b = prev[i],
                c = i >= static_cast<size_t>(channels) ? prev[i - channels] : 0;
      int p = 0;
      switch (filter) {
        case 0: p = 0; break;
        case 1: p = a; break;
        case 2: p = b; break;
        case 3: p = (a + b) / 2; break;
        case 4: {
          const int e = a + b - c, pa = std::abs(e - a), pb = std::abs(e - b), pc = std::abs(e - c);
          p = pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
          break;
        }
        default: return std::nullopt;
      }
      cur[i] = static_cast<uint8_t>(in[i] + p);
    }
    for (int x = 0; x < img.width; ++x)
      for (int k = 0; k < 3; ++k) img.rgb[(static_cast<size_t>(y) * img.width + x) * 3 + k] = cur[x * channels + k];
    std::swap(prev, cur);
  }
  return img;
}

int64_t countColour(const Image& img, std::array<int, 3> want, int tolerance = 6) {
  int64_t n = 0;
  for (int y = 0; y < img.height; ++y)
    for (int x = 0; x < img.width; ++x) {
      const auto c = img.at(x, y);
      if (std::abs(c[0] - want[0]) <= tolerance && std::abs(c[1] - want[1]) <= tolerance &&
          std::abs(c[2] - want[2]) <= tolerance)
        ++n;
    }
  return n;
}

struct Loaded {
  int rc = -1;
  std::string dom;
  std::vector<std::string> console;  // lines the page logged (errors, CSP violations, anything)
};

class HtmlBrowser : public ::testing::Test {
 protected:
  void SetUp() override {
    chromium_ = findChromium();
    if (chromium_.empty())
      GTEST_SKIP() << "Chromium not found (install Debian's chromium, as scripts/setup does, or set TPSCOPE_CHROMIUM)";
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / "tpscope-html-browser-test" / info->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }

  std::string browser(const std::string& args, const fs::path& page, const std::string& out) {
    return "timeout 120 '" + chromium_ + "' --headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage " +
           "--no-first-run --user-data-dir='" + (dir_ / "profile").string() + "' --enable-logging=stderr --v=0 " + args +
           " 'file://" + fs::absolute(page).string() + "' " + out;
  }

  Loaded load(const fs::path& page) {
    Loaded l;
    l.rc = run(browser("--dump-dom", page, ">'" + (dir_ / "dom.html").string() + "' 2>'" +
                                               (dir_ / "browser.log").string() + "'"));
    l.dom = slurp(dir_ / "dom.html");
    std::istringstream log(slurp(dir_ / "browser.log"));
    for (std::string line; std::getline(log, line);)
      if (line.find(":CONSOLE") != std::string::npos) l.console.push_back(line);
    return l;
  }

  fs::path report(const fs::path& run, const std::string& name) {
    const fs::path out = dir_ / (name + ".html");
    const std::string cmd = "'" TPSCOPE_CLI "' report '" + run.string() + "' --html '" + out.string() + "' >/dev/null";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return out;
  }

  fs::path fixture(const std::string& name, const testing::RunSpec& spec, bool hostile = false) {
    const fs::path db = dir_ / (name + ".db");
    EXPECT_TRUE(testing::writeRun(db, spec));
    if (hostile) {
      EXPECT_TRUE(testing::makeNamesHostile(db));
    }
    return report(db, name);
  }

  // Loads without a console line, reaches "ready" and draws the timeline.
  void expectLoadsClean(const fs::path& page) {
    SCOPED_TRACE(page.string());
    const Loaded l = load(page);
    ASSERT_EQ(l.rc, 0) << "chromium failed; see " << (dir_ / "browser.log");
    for (const auto& line : l.console) ADD_FAILURE() << "console: " << line;
    EXPECT_NE(l.dom.find("data-report-state=\"ready\""), std::string::npos) << l.dom.substr(0, 400);
    EXPECT_EQ(l.dom.find("data-pwned"), std::string::npos);
    std::smatch m;
    ASSERT_TRUE(std::regex_search(l.dom, m, std::regex("data-timeline-rects=\"([0-9]+)\"")));
    EXPECT_GT(std::stoi(m[1]), 0);
  }

  std::string chromium_;
  fs::path dir_;
};

TEST_F(HtmlBrowser, ConsoleErrorsAreDetected) {  // the check itself: a broken page must fail it
  std::ofstream(dir_ / "broken.html") << "<!DOCTYPE html><html><body><script>notDefined();</script></body></html>";
  const Loaded l = load(dir_ / "broken.html");
  EXPECT_EQ(l.rc, 0);
  ASSERT_FALSE(l.console.empty());
  EXPECT_NE(l.console.front().find("notDefined"), std::string::npos);
}

TEST_F(HtmlBrowser, FixtureRunsLoadCleanly) {
  testing::RunSpec nan, hang, straggler, demo;
  nan.nanRank = 2, nan.nanStep = 5, nan.nanLayer = 1;
  hang.hangGroup = "tp-0", hang.hangRank = 1, hang.hangSeq = 7;
  straggler.stragglerRank = 3;
  demo = nan;
  demo.steps = 30, demo.layers = 4, demo.nanStep = 12;
  expectLoadsClean(fixture("nan", nan));
  expectLoadsClean(fixture("hang", hang));
  const fs::path stragglerPage = fixture("straggler", straggler);
  expectLoadsClean(stragglerPage);
  // The what-if critical path is outlined over the lanes: the script drew a rectangle per stretch in the window.
  const Loaded withPath = load(stragglerPage);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(withPath.dom, m, std::regex("data-critical=\"([0-9]+)\"")));
  EXPECT_GT(std::stoi(m[1]), 0);
  EXPECT_NE(withPath.dom.find("class=\"critical"), std::string::npos);
  expectLoadsClean(fixture("clean", {}));
  expectLoadsClean(fixture("demo", demo));
}

TEST_F(HtmlBrowser, HostileNamesDoNotRun) {
  testing::RunSpec hang;
  hang.hangGroup = "tp-0", hang.hangRank = 1, hang.hangSeq = 7;
  const fs::path page = fixture("hostile", hang, /*hostile=*/true);
  expectLoadsClean(page);
  // The names are shown as text: the timeline's labels were set from the JSON.
  EXPECT_NE(load(page).dom.find("onerror=\"document.body.dataset.pwned=2\"&gt;pwn"), std::string::npos);
}

#if TPSCOPE_HAVE_FORMATS
TEST_F(HtmlBrowser, KinetoImportsLoadCleanly) {
  auto importAndCheck = [this](const std::vector<fs::path>& traces, const std::string& name) {
    std::string cmd = "'" TPSCOPE_CLI "' import kineto";
    for (const auto& p : traces) cmd += " '" + p.string() + "'";
    const fs::path db = dir_ / (name + ".db");
    cmd += " -o '" + db.string() + "' >/dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    expectLoadsClean(report(db, name));
  };
  const fs::path fixtures = TPSCOPE_FORMATS_FIXTURES;
  importAndCheck({fixtures / "nccl_meta_rank-0.json", fixtures / "nccl_meta_rank-1.json"}, "nccl");
  importAndCheck({fixtures / "gloo_array_rank3.json"}, "gloo");
  const fs::path shared = fs::path(TPSCOPE_SHARED_TESTDATA) / "kineto";
  if (!fs::is_directory(shared)) GTEST_SKIP() << "shared Kineto traces not found at " << shared;
  int n = 0;
  for (const auto& e : fs::directory_iterator(shared))
    if (e.path().extension() == ".gz") importAndCheck({e.path()}, "shared" + std::to_string(n++));
  EXPECT_GT(n, 0);
}
#endif

TEST_F(HtmlBrowser, ScreenshotShowsTheCharts) {
  testing::RunSpec nan;
  nan.nanRank = 2, nan.nanStep = 5, nan.nanLayer = 1;
  const fs::path page = fixture("nan", nan);
  const fs::path png = dir_ / "nan.png";
  ASSERT_EQ(run(browser("--hide-scrollbars --window-size=1400,2600 --screenshot='" + png.string() + "'", page,
                        ">/dev/null 2>&1")),
            0);
  const auto img = decodePng(slurp(png));
  ASSERT_TRUE(img) << "cannot decode " << png;
  EXPECT_EQ(img->width, 1400);
  const int64_t compute = countColour(*img, {0x42, 0x85, 0xf4});   // breakdown bars and timeline spans
  const int64_t nanCells = countColour(*img, {0xe6, 0x00, 0x7e});  // the heatmap's non-finite cells
  const int64_t steps = countColour(*img, {0x5a, 0x60, 0x6e});     // the timeline's step row, drawn by script
  EXPECT_GT(compute, 20000) << "breakdown bars missing";
  EXPECT_GT(nanCells, 19 * 200) << "non-finite heatmap cells missing";
  EXPECT_GT(steps, 4 * 800 * 8) << "timeline not drawn";
}

}  // namespace
}  // namespace tpscope::cli
