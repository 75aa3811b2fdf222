// Fuzz target: the training config (core/config.h), as tpscope-train reads it — a JSON file, then `--set KEY=VALUE`
// overrides, then validate(). Input: the file's text, optionally followed by a NUL byte and override lines
// "KEY=VALUE" separated by '\n'. Contract under test: every problem is a ConfigError with a message (any other
// exception escapes and is a crash here, as it would end tpscope-train without the one clear line); a config that is
// accepted writes toJson() text that reads back as the same config.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>

#include "tpscope/rules/config.h"

namespace {

using tpscope::rules::ConfigError;
using tpscope::rules::TrainConfig;

// One scratch file per process: fromFile reads a path.
const std::string& scratchPath() {
  static const std::string path = "/tmp/fuzz_config-" + std::to_string(::getpid()) + ".json";
  return path;
}

void writeScratch(std::string_view text) {
  std::ofstream out(scratchPath(), std::ios::binary | std::ios::trunc);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
}

void refusedWithMessage(const ConfigError& e) {
  if (std::string_view(e.what()).empty()) std::abort();  // a refusal must say why
}

// toJson() of an accepted config must read back as the same config.
void roundTrip(const TrainConfig& c) {
  const std::string json = c.toJson();
  writeScratch(json);
  const TrainConfig again = TrainConfig::fromFile(scratchPath());  // a ConfigError here escapes: a crash
  if (again.toJson() != json) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  writeScratch(input.substr(0, nul));
  TrainConfig c;
  try {
    c = TrainConfig::fromFile(scratchPath());
  } catch (const ConfigError& e) {
    refusedWithMessage(e);
    return 0;
  }
  roundTrip(c);
  if (nul != std::string_view::npos) {
    std::string_view rest = input.substr(nul + 1);
    while (!rest.empty()) {
      const size_t nl = rest.find('\n');
      const std::string_view line = rest.substr(0, nl);
      rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
      const size_t eq = line.find('=');
      if (eq == std::string_view::npos) continue;
      try {
        c.set(std::string(line.substr(0, eq)), std::string(line.substr(eq + 1)));
      } catch (const ConfigError& e) {
        refusedWithMessage(e);
        return 0;
      }
    }
    roundTrip(c);
  }
  try {
    c.validate(2, 1);
  } catch (const ConfigError& e) {
    refusedWithMessage(e);
  }
  return 0;
}
