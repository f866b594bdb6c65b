// Fuzz target: a TOML configuration, then --set overrides (the input after its first NUL byte,
// one per line); a configuration that is accepted must read back from its own resolved TOML.
#include "kdflow/core/config.hpp"
#include "kdflow/core/error.hpp"

#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const auto nul = input.find('\0');
  const std::string_view toml = input.substr(0, nul);
  std::string_view sets =
      nul == std::string_view::npos ? std::string_view() : input.substr(nul + 1);
  kdflow::Config config;
  try {
    config.merge_toml(toml, "fuzz.toml");
    while (!sets.empty()) {
      const auto eol = sets.find('\n');
      config.set(sets.substr(0, eol));
      sets = eol == std::string_view::npos ? std::string_view() : sets.substr(eol + 1);
    }
  } catch (const kdflow::InputError&) {
    return 0;
  }
  kdflow::Config again;
  again.merge_toml(config.to_toml(), "resolved.toml"); // throws (a finding) if it cannot
  if (again.to_toml() != config.to_toml()) std::abort();
  return 0;
}
