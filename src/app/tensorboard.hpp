// TensorBoard's event files, written the way TensorBoard reads them: `tensorboard.Event` messages
// (compiled from the tensorboard wheel's event.proto, scripts/tensorboard_protos.py) in TFRecord
// framing: the record's length (uint64, little-endian), the masked CRC32C of those 8 bytes, the
// serialized event, the masked CRC32C of the event. A file begins with the `brain.Event:2` version
// record. The run folder (run_folder.hpp) keeps one per run, rank 0's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>

namespace kdflow::app {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) of `data`, and TFRecord's mask of a CRC
// (rotated right by 15 bits, plus 0xa282ead8).
std::uint32_t crc32c(std::span<const std::byte> data);
std::uint32_t masked_crc32c(std::span<const std::byte> data);

class EventWriter {
public:
  // A new file in `folder`, events.out.tfevents.<unix seconds>.<host>.<pid>.<n>: never an existing
  // one (a resumed run writes its own beside the first's, and TensorBoard reads them in order as
  // one run). InputError when it cannot be made.
  explicit EventWriter(const std::filesystem::path& folder);
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  // A session's start at `step` (TensorBoard's SessionLog START): a run resumed from its checkpoint
  // at `step` starts so, and TensorBoard drops what earlier files hold from `step` on (steps a
  // killed start logged after its last checkpoint), so the curves go on without doubled points.
  void session_start(std::int64_t step);
  // A scalar at `step` (TensorBoard keeps it as a float32).
  void scalar(const std::string& tag, std::int64_t step, double value);
  // A text summary (TensorBoard's text plugin: a string tensor), e.g. the configuration.
  void text(const std::string& tag, std::int64_t step, const std::string& text);
  // What was written reaches the file. std::runtime_error naming the file when a write failed
  // (a full disk): the run stops rather than lose its record quietly.
  void flush();

  [[nodiscard]] const std::filesystem::path& path() const { return path_; }

private:
  void write(const std::string& event);

  std::filesystem::path path_;
  std::ofstream out_;
};

} // namespace kdflow::app
