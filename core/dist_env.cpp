// torchrun's environment variables, checked (dist_env.hpp).
#include "kdflow/core/dist_env.hpp"

#include "kdflow/core/error.hpp"

#include <charconv>
#include <cstdlib>

#include <fmt/format.h>

namespace kdflow {
namespace {

int number(const std::function<const char*(const char*)>& get, const char* name, int min, int max,
           std::optional<int> fallback) {
  const char* text = get(name);
  if (text == nullptr || *text == '\0') {
    if (fallback) return *fallback;
    throw InputError(fmt::format("environment: {} is not set, while RANK or WORLD_SIZE is (run the "
                                 "ranks with torchrun, which sets them all)",
                                 name));
  }
  const std::string_view s(text);
  int value = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size() || value < min || value > max)
    throw InputError(fmt::format("environment: {} = '{}' is not a whole number from {} to {}", name,
                                 s, min, max));
  return value;
}

} // namespace

std::optional<DistEnv> dist_env_from(const std::function<const char*(const char*)>& get) {
  const auto set = [&](const char* name) {
    const char* v = get(name);
    return v != nullptr && *v != '\0';
  };
  if (!set("RANK") && !set("WORLD_SIZE")) return std::nullopt;
  constexpr int kMaxRanks = 1 << 20;
  DistEnv env;
  env.world = number(get, "WORLD_SIZE", 1, kMaxRanks, {});
  env.rank = number(get, "RANK", 0, env.world - 1, {});
  env.local_world = number(get, "LOCAL_WORLD_SIZE", 1, env.world, 1);
  env.local_rank = number(get, "LOCAL_RANK", 0, env.local_world - 1, 0);
  env.node = number(get, "GROUP_RANK", 0, kMaxRanks, 0);
  env.restart = number(get, "TORCHELASTIC_RESTART_COUNT", 0, kMaxRanks, 0);
  // One rank needs the store only to join a group of its own (a named dist.backend): read where
  // torchrun gives both (a plain run that has MASTER_ADDR alone is still a plain run).
  if (env.world > 1 || (set("MASTER_ADDR") && set("MASTER_PORT"))) {
    if (!set("MASTER_ADDR"))
      throw InputError("environment: MASTER_ADDR is not set (torchrun sets it: the address of the "
                       "job's rendezvous store)");
    env.master_addr = get("MASTER_ADDR");
    env.master_port = number(get, "MASTER_PORT", 1, 65535, {});
  }
  const char* agent = get("TORCHELASTIC_USE_AGENT_STORE");
  env.agent_store = agent != nullptr && std::string_view(agent) == "True";
  return env;
}

std::optional<DistEnv> dist_env() {
  return dist_env_from([](const char* name) { return std::getenv(name); });
}

} // namespace kdflow
