// Paths kdflow is given to read, resolved once before anything is read: links followed to what
// they name (a loop, a dangling link, a folder where a file belongs, a device or a pipe refused),
// sizes checked before any byte is read, and files that must stay inside a folder confined after
// every link is resolved. Each refusal is an InputError of one line: "<what> <path>: <reason>".
#pragma once

#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <string_view>

namespace kdflow {

// A regular file (after its links) of at most `max_bytes`; its size. `what` names what it is
// (a key such as "teacher.model", or "the checkpoint").
std::uint64_t check_input_file(const std::filesystem::path& path, std::string_view what,
                               std::uint64_t max_bytes = std::numeric_limits<std::uint64_t>::max());
// A folder (after its links).
void check_input_folder(const std::filesystem::path& path, std::string_view what);
// The whole file, checked as check_input_file does.
std::string read_input_file(const std::filesystem::path& path, std::string_view what,
                            std::uint64_t max_bytes = std::numeric_limits<std::uint64_t>::max());
// `relative` under `folder`, checked as a file that resolves (every link followed) to a place
// inside `folder` (resolved too): the resolved path. A location that is absolute, climbs out with
// '..', names the folder itself, or a link out of the folder is refused naming `what`.
std::filesystem::path confined_file(const std::filesystem::path& folder,
                                    const std::filesystem::path& relative, std::string_view what);
// An output path and its parent folders, checked: a link loop, a link to nothing or a file where
// a folder belongs is refused naming `what` (a missing folder is fine: it is made later).
void check_output_path(const std::filesystem::path& path, std::string_view what);

} // namespace kdflow
