#include "large_trace.h"

#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>

#include "tpscope/formats/kineto_import.h"

namespace tpscope::formats::bench {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string readAll(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  if (s.size() > 2 && static_cast<unsigned char>(s[0]) == 0x1f) {
    gzFile gz = gzopen(p.c_str(), "rb");
    std::string out;
    char buf[1 << 16];
    for (int n; (n = gzread(gz, buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
    gzclose(gz);
    return out;
  }
  return s;
}

void shiftId(json& args, const char* key, int64_t offset) {
  if (args.contains(key) && args[key].is_number_integer()) args[key] = args[key].get<int64_t>() + offset;
}

// Writes `events` repeated (shifted by `period` µs, ids offset) until at least minBytes; returns the event count.
int64_t writeTrace(const fs::path& path, const json& doc, const json& events, double period, int64_t minBytes,
                   int rank) {
  std::ofstream out(path, std::ios::binary);
  json head = doc;
  head.erase("traceEvents");
  if (head.contains("distributedInfo")) head["distributedInfo"]["rank"] = rank;
  std::string text = head.dump();
  text.pop_back();  // '}'
  text += ", \"traceEvents\": [\n";
  out << text;
  int64_t written = static_cast<int64_t>(text.size()), count = 0;
  bool first = true;
  for (int copy = 0; written < minBytes; ++copy) {
    const int64_t idOffset = static_cast<int64_t>(copy) * 100'000'000;
    std::string chunk;
    for (json e : events) {
      if (!e.is_object()) continue;
      if (copy > 0 && e.value("ph", "") == "M") continue;
      if (e.contains("ts") && e["ts"].is_number()) e["ts"] = e["ts"].get<double>() + copy * period;
      if (e.contains("id") && e["id"].is_number_integer()) e["id"] = e["id"].get<int64_t>() + idOffset;
      if (e.contains("args") && e["args"].is_object()) {
        shiftId(e["args"], "correlation", idOffset);
        shiftId(e["args"], "External id", idOffset);
      }
      chunk += first ? "" : ",\n";
      first = false;
      chunk += e.dump();
      ++count;
    }
    out << chunk;
    written += static_cast<int64_t>(chunk.size());
  }
  out << "\n]}\n";
  return count;
}

LargeTrace build(int64_t minBytes) {
  fs::path source = sharedTrace("nccl_parser_config_nccl_data.json.gz");
  if (source.empty()) source = fs::path(TPSCOPE_FORMATS_FIXTURES) / "nccl_meta_rank-0.json";
  json doc = json::parse(readAll(source));
  const json events = doc["traceEvents"];
  double lo = 1e300, hi = -1e300;
  for (const auto& e : events)
    if (e.is_object() && e.contains("ts") && e["ts"].is_number()) {
      lo = std::min(lo, e["ts"].get<double>());
      hi = std::max(hi, e["ts"].get<double>() + e.value("dur", 0.0));
    }
  const double period = hi - lo + 1000.0;  // µs between copies

  LargeTrace t;
  const fs::path dir = fs::temp_directory_path() / ("tpscope-formats-bench-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  t.json = dir / "large_rank-0.json";
  t.gzip = dir / "large_rank-0.json.gz";
  t.run = dir / "large.db";
  t.events = writeTrace(t.json, doc, events, period, minBytes, 0);
  t.jsonBytes = static_cast<int64_t>(fs::file_size(t.json));
  for (int r = 0; r < 4; ++r) {
    t.ranks.push_back(dir / ("quarter_rank-" + std::to_string(r) + ".json"));
    writeTrace(t.ranks.back(), doc, events, period, minBytes / 4, r);
  }

  const std::string plain = readAll(t.json);
  gzFile gz = gzopen(t.gzip.c_str(), "wb1");
  gzwrite(gz, plain.data(), static_cast<unsigned>(plain.size()));
  gzclose(gz);

  std::vector<fs::path> inputs{t.json};
  auto imported = importKineto(inputs, t.run);
  if (!imported) throw std::runtime_error(imported.error());
  std::fprintf(stderr, "large trace: %s, %.1f MB of JSON, %lld events (from %s)\n", t.json.c_str(),
               t.jsonBytes / 1e6, static_cast<long long>(t.events), source.filename().c_str());
  static const fs::path cleanup = dir;
  std::atexit([] {
    std::error_code ec;
    fs::remove_all(cleanup, ec);
  });
  return t;
}

}  // namespace

const LargeTrace& largeTrace(int64_t minBytes) {
  static const LargeTrace trace = build(minBytes);
  return trace;
}

fs::path sharedTrace(const char* name) {
  const fs::path p = fs::path(TPSCOPE_SHARED_TESTDATA) / "kineto" / name;
  return fs::exists(p) ? p : fs::path();
}

}  // namespace tpscope::formats::bench
