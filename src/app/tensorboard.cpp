// TensorBoard's event files (tensorboard.hpp).
#include "tensorboard.hpp"

#include "kdflow/core/error.hpp"

#include "tensorboard/compat/proto/event.pb.h"

#include <unistd.h>

#include <array>
#include <charconv>
#include <chrono>
#include <limits>
#include <stdexcept>
#include <system_error>

#include <fmt/format.h>

namespace kdflow::app {
namespace fs = std::filesystem;
namespace {

constexpr std::array<std::uint32_t, 256> crc32c_table() {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1U) != 0 ? 0x82F63B78U ^ (c >> 1) : c >> 1;
    table[i] = c;
  }
  return table;
}

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  std::array<char, 256> name{};
  if (::gethostname(name.data(), name.size() - 1) != 0) return "localhost";
  return name.data();
}

void put_le(std::string& out, std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFFU));
}

std::span<const std::byte> bytes_of(const std::string& s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

} // namespace

std::uint32_t crc32c(std::span<const std::byte> data) {
  static constexpr auto table = crc32c_table();
  std::uint32_t c = 0xFFFFFFFFU;
  for (const std::byte b : data) c = table[(c ^ static_cast<std::uint32_t>(b)) & 0xFFU] ^ (c >> 8);
  return c ^ 0xFFFFFFFFU;
}

std::uint32_t masked_crc32c(std::span<const std::byte> data) {
  const std::uint32_t c = crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xa282ead8U;
}

EventWriter::EventWriter(const fs::path& folder) {
  // TensorBoard reads a folder's event files in name order, and a resumed run's START event
  // purges the steps after it from what it read before: a run's file must sort after every file
  // already there. Within one second the names would sort by host and pid (as text: pid 99999
  // after 100000), so the second in the name is at least one past the newest file's.
  auto seconds = static_cast<std::int64_t>(unix_seconds());
  std::error_code ec;
  constexpr std::string_view kPrefix = "events.out.tfevents.";
  for (const auto& entry : fs::directory_iterator(folder, ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(kPrefix)) continue;
    std::int64_t earlier = 0;
    const char* first = name.data() + kPrefix.size();
    const auto [end, err] = std::from_chars(first, name.data() + name.size(), earlier);
    if (err == std::errc() && end != first && earlier >= seconds &&
        earlier < std::numeric_limits<std::int64_t>::max())
      seconds = earlier + 1;
  }
  const std::string stem =
      fmt::format("events.out.tfevents.{}.{}.{}", seconds, host_name(), ::getpid());
  for (int n = 0;; ++n) {
    path_ = folder / fmt::format("{}.{}", stem, n);
    if (!fs::exists(path_, ec)) break;
  }
  out_.open(path_, std::ios::binary | std::ios::trunc);
  if (!out_) throw InputError(fmt::format("cannot write {}", path_.string()));
  tensorboard::Event version;
  version.set_wall_time(unix_seconds());
  version.set_file_version("brain.Event:2");
  write(version.SerializeAsString());
  flush();
}

void EventWriter::write(const std::string& event) {
  std::string header;
  put_le(header, event.size(), 8);
  std::string record = header;
  put_le(record, masked_crc32c(bytes_of(header)), 4);
  record += event;
  put_le(record, masked_crc32c(bytes_of(event)), 4);
  out_.write(record.data(), static_cast<std::streamsize>(record.size()));
}

void EventWriter::session_start(std::int64_t step) {
  tensorboard::Event event;
  event.set_wall_time(unix_seconds());
  event.set_step(step);
  event.mutable_session_log()->set_status(tensorboard::SessionLog::START);
  write(event.SerializeAsString());
}

void EventWriter::scalar(const std::string& tag, std::int64_t step, double value) {
  tensorboard::Event event;
  event.set_wall_time(unix_seconds());
  event.set_step(step);
  tensorboard::Summary::Value* v = event.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(static_cast<float>(value));
  write(event.SerializeAsString());
}

void EventWriter::text(const std::string& tag, std::int64_t step, const std::string& text) {
  tensorboard::Event event;
  event.set_wall_time(unix_seconds());
  event.set_step(step);
  tensorboard::Summary::Value* v = event.mutable_summary()->add_value();
  v->set_tag(tag);
  v->mutable_metadata()->mutable_plugin_data()->set_plugin_name("text");
  tensorboard::TensorProto* t = v->mutable_tensor();
  t->set_dtype(tensorboard::DT_STRING);
  t->mutable_tensor_shape()->add_dim()->set_size(1);
  t->add_string_val(text);
  write(event.SerializeAsString());
}

void EventWriter::flush() {
  out_.flush();
  if (!out_) throw std::runtime_error(fmt::format("writing {} failed", path_.string()));
}

} // namespace kdflow::app
