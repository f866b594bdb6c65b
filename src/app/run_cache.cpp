// kd.cache during a training run (run_cache.hpp).
#include "run_cache.hpp"

#include "kdflow/affinity/pinning.hpp"
#include "kdflow/core/log.hpp"

#include <algorithm>
#include <exception>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace kdflow::app {
using nlohmann::json;

RunCache::RunCache(const RunInputs& run, CpuPipeline& pipeline, std::uint64_t per_epoch)
    : run_(run), pipeline_(pipeline), per_epoch_(per_epoch) {
  if (run.cache) saved_ = read_ = run.cache->stored(); // read from kd.cache's file
}

RunCache::~RunCache() {
  if (!sharing_.joinable()) return;
  pipeline_.ring().close();
  sharing_.join();
}

bool RunCache::holds_an_epoch() const {
  const TeacherOutputCache* cache = run_.cache.get();
  if (cache == nullptr) return false;
  const std::size_t dealt =
      std::min<std::size_t>(per_epoch_ * run_.sampler.batch_size,
                            run_.train.size() / static_cast<std::size_t>(run_.dist.world));
  return cache->stored() >= dealt;
}

void RunCache::shared_at_start(std::uint64_t batch) {
  shared_from_ = batch;
  log_info(fmt::format("kd.cache holds every sample: the loaders run on the teacher's CPUs too "
                       "(loaders {}; the teacher copies what is kept)",
                       affinity::format_cpus(pipeline_.assignment().loader)));
}

void RunCache::share_when_full(std::uint64_t batch, bool kd_ctl) {
  if (sharing_.joinable() || pipeline_.shared() || !holds_an_epoch()) return;
  sharing_ = std::thread([this, batch, kd_ctl] {
    try {
      affinity::pin_this_thread(run_.topology, run_.plan.student, "kd-share");
      if (!pipeline_.share_teacher_cpus()) return;
    } catch (...) {
      // The loaders may be gone: the run ends with the failure, which the student then reports.
      pipeline_.ring().fail("loader", std::current_exception());
      return;
    }
    shared_from_ = batch;
    log_info(fmt::format("kd.cache holds every sample: the loaders run on the teacher's CPUs too "
                         "from about batch {} (loaders {}; the teacher copies what is kept){}",
                         batch, affinity::format_cpus(pipeline_.assignment().loader),
                         kd_ctl ? "; kd-ctl moves no more" : ""));
  });
}

void RunCache::join() {
  if (sharing_.joinable()) sharing_.join();
}

void RunCache::save() {
  // Every rank keeps its own file (its shard's outputs; prepare_teacher_cache names it).
  if (run_.cache_file.empty()) return;
  const TeacherOutputCache& cache = *run_.cache;
  const std::size_t kept = cache.stored();
  if (kept == saved_) return;
  try {
    cache.save(run_.cache_file, run_.cache_key);
    saved_ = kept;
    log_info(
        fmt::format("kd.cache = disk: the teacher's outputs for {} of {} samples written to {}",
                    kept, cache.samples(), run_.cache_file.string()));
  } catch (const std::exception& e) {
    log_warn(fmt::format("kd.cache = disk: {}: the run goes on, the outputs not kept for later "
                         "runs",
                         e.what()));
  }
}

json RunCache::summary() const {
  const TeacherOutputCache* cache = run_.teacher_runs() ? pipeline_.targets().cache() : nullptr;
  if (!cache) return nullptr;
  return {
      {"mode", run_.config.get_string("kd.cache")},
      {"file", run_.cache_file.empty() ? json(nullptr) : json(run_.cache_file.string())},
      {"samples_read_from_file", read_},
      {"top_k", cache->full() ? 0 : cache->kept()},
      {"samples", cache->samples()},
      {"samples_kept", cache->stored()},
      {"bytes", cache->bytes()},
      {"batches_from_cache", pipeline_.targets().cached_batches()},
      {"loaders_on_teacher_cpus_from_batch", shared_from_ ? json(*shared_from_) : json(nullptr)},
      {"loader_cpus", pipeline_.assignment().loader}};
}

} // namespace kdflow::app
