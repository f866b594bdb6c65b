// The machine as kdflow plans for it: cores (with their PUs, NUMA node, L3 and package), restricted
// to the CPUs this process may use (taskset, cgroup cpuset), read through hwloc once at start-up.
// A synthetic description gives the same view of another machine, for planning and tests.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kdflow::affinity {

using CpuList = std::vector<int>; // OS CPU (PU) indices, ascending

struct Core {
  int index;    // logical index among allowed cores
  CpuList pus;  // OS indices of its PUs; pus[0] is the one used first, the rest are SMT siblings
  int numa = 0; // logical NUMA node
  int l3 = 0;   // logical L3 (last-level cache) group
  int package = 0;
};

struct GpuLocality {
  std::string name;   // e.g. "cuda:0 0000:17:00.0"
  CpuList local_cpus; // allowed CPUs nearest the GPU (all allowed CPUs when hwloc reports none)
};

class Topology {
public:
  // This machine, restricted to the CPUs this process is allowed to run on.
  static Topology load();
  // A synthetic hwloc topology, e.g. "pack:2 numa:1 core:8 pu:2"; throws InputError naming DESC.
  static Topology synthetic(const std::string& description);

  Topology(Topology&&) noexcept;
  Topology& operator=(Topology&&) noexcept;
  ~Topology();

  [[nodiscard]] const std::vector<Core>& cores() const { return cores_; }
  [[nodiscard]] CpuList allowed_cpus() const;
  [[nodiscard]] int packages() const { return packages_; }
  [[nodiscard]] int numa_nodes() const { return numa_nodes_; }
  [[nodiscard]] const std::string& description() const { return description_; }

  // The CPUs of NUMA node `numa` (logical index) among the allowed ones.
  [[nodiscard]] CpuList numa_cpus(int numa) const;
  // Locality of the PCI device `bus_id` ("0000:17:00.0"), e.g. a GPU; nullopt when hwloc does not
  // know the device (synthetic topology, no I/O discovery).
  [[nodiscard]] std::optional<CpuList> pci_local_cpus(const std::string& bus_id) const;

  // hwloc's handle, for the pinning functions of this module.
  struct Handle;
  [[nodiscard]] Handle& handle() const { return *handle_; }

private:
  explicit Topology(std::unique_ptr<Handle> handle, std::string description);
  void read_cores();

  std::unique_ptr<Handle> handle_;
  std::string description_;
  std::vector<Core> cores_;
  int packages_ = 0;
  int numa_nodes_ = 0;
};

// "0-3,8,10-11"
std::string format_cpus(const CpuList& cpus);
// How many CPUs several lists hold in all (the teacher replicas', for instance).
std::size_t cpu_count(const std::vector<CpuList>& lists);

} // namespace kdflow::affinity
