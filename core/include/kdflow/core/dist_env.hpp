// Which process of a job this is, as torchrun says in the environment (RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT): read once at start-up and
// passed down. No variable set: a plain single-process run.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace kdflow {

struct DistEnv {
  int rank = 0, world = 1;             // this process among all of the job's
  int local_rank = 0, local_world = 1; // among those on this node (LOCAL_RANK picks the GPU)
  int node = 0;                        // GROUP_RANK: the node's index
  int restart = 0;                     // TORCHELASTIC_RESTART_COUNT: keys of a restart are fresh
  std::string master_addr;             // where c10d's TCPStore listens
  int master_port = 0;
  // torchrun's agent serves the store (TORCHELASTIC_USE_AGENT_STORE): every rank is a client.
  // Otherwise rank 0 serves it.
  bool agent_store = false;
};

// nullopt when neither RANK nor WORLD_SIZE is set. InputError naming the variable when one is
// missing beside the others, not a number, or out of range (rank beyond the world, a port
// outside 1-65535).
std::optional<DistEnv> dist_env_from(const std::function<const char*(const char*)>& get);
// The same from this process's environment.
std::optional<DistEnv> dist_env();

} // namespace kdflow
