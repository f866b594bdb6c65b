// c10d from LibTorch: TCPStore (torchrun's agent store, or served by rank 0), ProcessGroupGloo or
// ProcessGroupNCCL, and a heartbeat thread (kd-dist) whose beats name a lost rank.
#include "process_group_impl.hpp"

#include "kdflow/core/error.hpp"
#include "kdflow/core/log.hpp"
#include "kdflow/gpu_student/settings.hpp"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef KD_HAVE_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace kdflow::student {
namespace {

using namespace std::chrono_literals;
constexpr auto kBeat = 1s; // a rank silent for 2.5 beats is named lost

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

std::string alive_key(int rank) { return fmt::format("alive/{}", rank); }

// Every rank's heartbeat ("<beat> <step>"), "" where it has none.
std::vector<std::string> read_beats(c10d::Store& store, int world) {
  std::vector<std::string> out(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r)
    if (store.check({alive_key(r)})) {
      const std::vector<std::uint8_t> v = store.get(alive_key(r));
      out[static_cast<std::size_t>(r)].assign(v.begin(), v.end());
    }
  return out;
}

void write_beat(c10d::Store& store, int rank, std::int64_t beat, std::int64_t step) {
  const std::string text = fmt::format("{} {}", beat, step);
  store.set(alive_key(rank), std::vector<std::uint8_t>(text.begin(), text.end()));
}

} // namespace

void ProcessGroup::Impl::wait(const c10::intrusive_ptr<c10d::Work>& work,
                              const std::string& what) const {
  try {
    work->wait();
  } catch (const std::exception& e) {
    lost(what, e.what());
  }
}

ProcessGroup::ProcessGroup(const DistEnv& env, const DistOptions& options, const Device& device)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.env = env;
  m.options = options;
  check_name("dist.backend", options.backend, backend_names());
  m.backend_name =
      options.backend == "auto" ? (device.is_cuda() ? "nccl" : "gloo") : options.backend;
  if (m.backend_name == "nccl" && !device.is_cuda())
    throw InputError("dist.backend = nccl: the student is on the CPU (NCCL reduces CUDA tensors); "
                     "use gloo or auto");
#ifndef KD_HAVE_NCCL
  if (m.backend_name == "nccl")
    throw InputError("dist.backend = nccl: this kdflow was built without NCCL (no nccl.h beside "
                     "LibTorch); use gloo");
#endif
  const auto timeout =
      std::chrono::milliseconds(static_cast<std::int64_t>(options.timeout_s * 1e3));

  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(env.master_port);
  store_options.isServer = env.rank == 0 && !env.agent_store;
  if (store_options.isServer) store_options.numWorkers = env.world;
  store_options.timeout = timeout;
  try {
    auto tcp = c10::make_intrusive<c10d::TCPStore>(env.master_addr, store_options);
    // A restart of the job (torchrun --max-restarts) keys its rendezvous afresh.
    m.store = c10::make_intrusive<c10d::PrefixStore>(fmt::format("kdflow/{}", env.restart), tcp);
    write_beat(*m.store, env.rank, 0, 0);
  } catch (const std::exception& e) {
    throw RankLost(fmt::format("rank {}: cannot reach the job's store at {}:{} within {} s ({})",
                               env.rank, env.master_addr, env.master_port, options.timeout_s,
                               first_line(e.what())));
  }
  m.heartbeat = std::thread([&m] {
    pthread_setname_np(pthread_self(), "kd-dist");
    std::int64_t beat = 0;
    std::unique_lock lock(m.mutex);
    while (!m.wake.wait_for(lock, kBeat, [&m] { return m.stopping; })) {
      try {
        write_beat(*m.store, m.env.rank, ++beat, m.step.load());
      } catch (const std::exception&) {
        return; // the store is gone: the job is ending, and the collectives say so
      }
    }
  });
  try {
    if (m.backend_name == "gloo") {
      auto gloo = c10d::ProcessGroupGloo::Options::create_default(timeout);
      m.backend = c10::make_intrusive<c10d::ProcessGroupGloo>(m.store, env.rank, env.world, gloo);
    } else {
#ifdef KD_HAVE_NCCL
      c10::cuda::set_device(static_cast<c10::DeviceIndex>(device.index));
      m.device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(device.index));
      auto nccl = c10d::ProcessGroupNCCL::Options::create();
      nccl->timeout = timeout;
      m.backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(m.store, env.rank, env.world, nccl);
#endif
    }
  } catch (const std::exception& e) {
    m.lost(fmt::format("joining the {} process group", m.backend_name), e.what());
  }
}

ProcessGroup::Impl::~Impl() {
  {
    std::lock_guard lock(mutex);
    stopping = true;
  }
  wake.notify_all();
  if (heartbeat.joinable()) heartbeat.join();
}

ProcessGroup::~ProcessGroup() = default;

int ProcessGroup::rank() const { return impl_->env.rank; }
int ProcessGroup::world() const { return impl_->env.world; }
const std::string& ProcessGroup::backend() const { return impl_->backend_name; }
const DistOptions& ProcessGroup::options() const { return impl_->options; }

void ProcessGroup::Impl::lost(const std::string& what, const std::string& cause) const {
  const Impl& m = *this;
  const int world = m.env.world, me = m.env.rank;
  std::string who;
  try {
    // Two readings of every heartbeat, 2.5 beats apart: a rank whose beat did not move is gone
    // (exited, killed or stopped); one whose beat moves but whose step lags is stuck.
    const auto before = read_beats(*m.store, world);
    std::this_thread::sleep_for(kBeat * 5 / 2);
    const auto after = read_beats(*m.store, world);
    std::vector<std::string> gone;
    for (int r = 0; r < world; ++r) {
      if (r == me) continue;
      const auto& b = before[static_cast<std::size_t>(r)];
      const auto& a = after[static_cast<std::size_t>(r)];
      if (a.empty())
        gone.push_back(fmt::format("rank {} (never joined)", r));
      else if (a == b)
        gone.push_back(
            fmt::format("rank {} (no heartbeat since step {})", r, a.substr(a.find(' ') + 1)));
    }
    if (!gone.empty())
      who = fmt::format("lost {} of {}", fmt::join(gone, ", "), world);
    else
      who = fmt::format("every rank's heartbeat is alive: one is stuck outside the collective "
                        "(this rank is at step {})",
                        m.step.load());
  } catch (const std::exception&) {
    who = fmt::format("the job's store at {}:{} is gone (its node's torchrun, or rank 0, ended)",
                      m.env.master_addr, m.env.master_port);
  }
  throw RankLost(fmt::format("rank {}: {} failed: {}; {}", me, what, who, first_line(cause)));
}

void ProcessGroup::sum(std::span<double> values, const std::string& what) {
  Impl& m = *impl_;
  std::vector<at::Tensor> t{
      torch::from_blob(values.data(), {static_cast<std::int64_t>(values.size())}, torch::kDouble)
          .to(m.device, /*non_blocking=*/false, /*copy=*/true)};
  m.wait(m.backend->allreduce(t), what);
  const torch::Tensor host = t[0].to(torch::kCPU).contiguous();
  std::copy_n(host.data_ptr<double>(), values.size(), values.begin());
}

std::vector<std::byte> ProcessGroup::broadcast(std::vector<std::byte> bytes,
                                               const std::string& what) {
  Impl& m = *impl_;
  // The size first (the other ranks' buffers take it), then the bytes.
  double size = static_cast<double>(bytes.size());
  {
    std::vector<at::Tensor> t{torch::full({1}, m.env.rank == 0 ? size : 0.0,
                                          torch::TensorOptions(torch::kDouble).device(m.device))};
    m.wait(m.backend->broadcast(t), what);
    size = t[0].item<double>();
  }
  const auto n = static_cast<std::int64_t>(size);
  std::vector<at::Tensor> t{
      m.env.rank == 0 ? torch::from_blob(bytes.data(), {n}, torch::kUInt8).to(m.device, false, true)
                      : torch::empty({n}, torch::TensorOptions(torch::kUInt8).device(m.device))};
  if (n > 0) m.wait(m.backend->broadcast(t), what);
  const torch::Tensor host = t[0].to(torch::kCPU).contiguous();
  bytes.resize(static_cast<std::size_t>(n));
  std::memcpy(bytes.data(), host.data_ptr<std::uint8_t>(), bytes.size());
  return bytes;
}

std::vector<std::string> ProcessGroup::all_gather(const std::string& text,
                                                  const std::string& what) {
  Impl& m = *impl_;
  const auto world = static_cast<std::size_t>(m.env.world);
  // Every rank's length, then every rank's text padded to the longest.
  std::vector<double> lengths(world, 0.0);
  lengths[static_cast<std::size_t>(m.env.rank)] = static_cast<double>(text.size());
  sum(lengths, what);
  const auto longest = static_cast<std::int64_t>(*std::max_element(lengths.begin(), lengths.end()));
  torch::Tensor mine = torch::zeros({std::max<std::int64_t>(1, longest)}, torch::kUInt8);
  std::memcpy(mine.data_ptr<std::uint8_t>(), text.data(), text.size());
  std::vector<at::Tensor> in{mine.to(m.device)};
  std::vector<std::vector<at::Tensor>> out(1);
  for (std::size_t r = 0; r < world; ++r) out[0].push_back(torch::empty_like(in[0]));
  m.wait(m.backend->allgather(out, in), what);
  std::vector<std::string> texts(world);
  for (std::size_t r = 0; r < world; ++r) {
    const torch::Tensor host = out[0][r].to(torch::kCPU).contiguous();
    texts[r].assign(reinterpret_cast<const char*>(host.data_ptr<std::uint8_t>()),
                    static_cast<std::size_t>(lengths[r]));
  }
  return texts;
}

void ProcessGroup::agree(const std::exception_ptr& error) {
  // "<kind><message>": kind 3 an interrupt, 2 an InputError, 1 any other failure; "" none.
  std::string mine;
  if (error) try {
      std::rethrow_exception(error);
    } catch (const Interrupted& e) {
      mine = std::string("3") + e.what();
    } catch (const InputError& e) {
      mine = std::string("2") + e.what();
    } catch (const std::exception& e) {
      mine = std::string("1") + e.what();
    }
  const auto all = all_gather(mine, "agreeing on the start-up");
  if (error) std::rethrow_exception(error);
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (all[r].empty()) continue;
    const std::string message = fmt::format("rank {} failed: {}", r, all[r].substr(1));
    if (all[r][0] == '3')
      throw Interrupted(fmt::format("rank {} was interrupted: {}", r, all[r].substr(1)));
    if (all[r][0] == '2') throw InputError(message);
    throw std::runtime_error(message);
  }
}

} // namespace kdflow::student
