// Files that are either wholly there or not at all: written to a temporary beside the target,
// fsynced, renamed over it, and the folder fsynced, so a crash (even SIGKILL mid-write) leaves the
// previous version intact. Checked files add a header (magic, length, CRC-32) so a damaged or
// foreign file is recognised on reading instead of being half-loaded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kdflow {

// Atomically replaces `path` with `bytes` (a temporary "<name>.tmp.<pid>" beside it until the
// rename). Throws std::system_error naming the file on failure; the target is untouched then.
void write_file_atomic(const std::filesystem::path& path, std::span<const std::byte> bytes);
void write_file_atomic(const std::filesystem::path& path, std::string_view text);

// write_file_atomic with the header in front of `payload`.
void write_checked_file(const std::filesystem::path& path, std::span<const std::byte> payload);
// The payload of a checked file. InputError naming the file (and `what` it should be, e.g.
// "checkpoint") when it is missing, truncated, not a kdflow file, or fails its checksum; or, before
// anything is read, when its payload would be over `max_payload` bytes.
std::vector<std::byte> read_checked_file(const std::filesystem::path& path, std::string_view what,
                                         std::uint64_t max_payload = UINT64_MAX);

// Whether `name` is one of write_file_atomic's temporaries (left behind by a killed writer).
bool is_atomic_temporary(const std::filesystem::path& name);
// Removes the temporaries in `folder` (not below it) whose writer process is gone; returns how
// many. Those of a live process are its writes in progress and stay.
std::size_t sweep_atomic_temporaries(const std::filesystem::path& folder);

} // namespace kdflow
