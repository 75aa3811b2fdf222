// Fuzz target: `--inject` specs. Contract under test: any text either parses into specs that format back into text
// that parses to the same specs, or is refused with a message — never a crash.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "tpscope/rules/fault_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tpscope::rules;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::string error;
  auto list = parseFaultList(text, &error);
  if (!list) {
    if (error.empty()) std::abort();  // a refusal must say why
    return 0;
  }
  for (const FaultSpec& spec : *list) (void)checkFaultSpec(spec, 8, 4);
  const std::string again = formatFaultList(*list);
  std::string error2;
  auto reparsed = parseFaultList(again, &error2);
  if (!reparsed || reparsed->size() != list->size()) std::abort();
  for (size_t i = 0; i < list->size(); ++i)
    if (!((*reparsed)[i] == (*list)[i])) std::abort();
  return 0;
}
