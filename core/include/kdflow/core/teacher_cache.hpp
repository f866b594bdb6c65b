// The teacher's outputs per training sample, kept from the first time each sample is taught
// (kd.cache = memory). When the teacher's input for a sample is the same every epoch (no random
// augmentation), later epochs read a sample's logits here instead of running the teacher for it.
//
// Either every class's logit is kept, or (top_k > 0, fewer than the classes) only the K largest
// with their classes, and one logit for every other class: the one that makes the others share the
// residual probability mass equally at the run's temperature (FKD's stored soft labels, written
// back as logits). softmax(loaded / T) is then exact on the K classes and uniform on the rest.
//
// Each sample may also keep `features` floats as they are (the teachers' intermediate values a
// run distils from, teacher.features / kd.features): top-K applies to the logits only.
//
// Samples are stored and read concurrently by every teacher replica: a sample's state word says
// empty, being written or stored; the first writer wins, and a reader sees a stored entry whole.
// The pipeline keep()s every row it computes, so a sample's target is the kept one every time.
//
// kd.cache = disk keeps the stored entries in a checked file between runs (save(), load()),
// under a key that says what the outputs were computed from (the teacher file's digest, the data's,
// the teacher's input): a file of another key is refused, never read as this run's.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace kdflow {

class TeacherOutputCache {
public:
  // Throws std::invalid_argument for no samples, no classes or a non-positive temperature.
  TeacherOutputCache(std::size_t samples, std::size_t classes, std::size_t top_k,
                     double temperature, std::size_t features = 0);

  [[nodiscard]] std::size_t samples() const { return samples_; }
  [[nodiscard]] std::size_t classes() const { return classes_; }
  // The logits kept per sample as they were (top_k, or every class when it is 0 or >= classes).
  [[nodiscard]] std::size_t kept() const { return kept_; }
  [[nodiscard]] bool full() const { return kept_ == classes_; }
  // The feature floats kept per sample beside its logits.
  [[nodiscard]] std::size_t features() const { return features_; }
  [[nodiscard]] std::size_t bytes() const;

  // Keeps sample `id`'s logits (`classes` values) and `features` (features() values) unless it is
  // kept already or being kept by another thread; true when this call kept them. Throws
  // std::out_of_range for an id past the samples and std::invalid_argument for `features` of
  // another size, before anything is kept.
  bool store(std::uint64_t id, std::span<const float> logits, std::span<const float> features = {});
  // What a batch's target for sample `id` is: keeps `logits` and `features` unless the sample is
  // kept already (or being kept: it waits for that writer), then they hold what load() serves for
  // it (the K largest and the rest's logit under top-K). So a sample's target is the one kept,
  // every time, whichever batch computed it first. Throws std::out_of_range as store() does.
  void keep(std::uint64_t id, std::span<float> logits, std::span<float> features = {});
  // Whether sample `id` is kept (a true answer makes its entry readable on this thread).
  [[nodiscard]] bool has(std::uint64_t id) const;
  // Sample `id`'s logits into `out` (`classes` values) and its features into `features`
  // (features() values, else std::invalid_argument; may be empty to skip them). Requires
  // has(id).
  void load(std::uint64_t id, std::span<float> out, std::span<float> features = {}) const;
  // Samples kept so far.
  [[nodiscard]] std::size_t stored() const { return stored_.load(std::memory_order_relaxed); }

  // Writes the entries kept so far to `path` as a checked file (atomically: the previous file stays
  // whole until the rename), with `key`: what the outputs were computed from, one "name=value" per
  // line. Safe beside store(): an entry being written is left out. Throws std::system_error
  // naming the file when it cannot be written.
  void save(const std::filesystem::path& path, const std::string& key) const;
  // Keeps every entry of a file save() wrote with the same key and sizes; returns how many samples
  // it added. InputError naming the file when it is damaged or not a teacher cache, is larger than
  // a file of this cache can be (checked before reading), or was written for another key (the
  // first differing line quoted) or other sizes. Call before the cache is shared.
  std::size_t load(const std::filesystem::path& path, const std::string& key);

private:
  enum : std::uint8_t { kEmpty = 0, kWriting = 1, kStored = 2 };
  // A saved file's payload with a key of `key_bytes`.
  [[nodiscard]] std::size_t file_bytes(std::size_t key_bytes) const;

  std::size_t samples_, classes_, kept_;
  double temperature_;
  std::size_t features_;
  std::size_t logit_floats_;           // kept_, and the rest logit under top-K
  std::size_t stride_;                 // floats per sample: logit_floats_, then features_
  std::vector<float> values_;          // samples x stride_
  std::vector<std::uint32_t> indices_; // samples x kept_ under top-K: the kept logits' classes
  std::unique_ptr<std::atomic<std::uint8_t>[]> state_;
  std::atomic<std::size_t> stored_{0};
};

} // namespace kdflow
