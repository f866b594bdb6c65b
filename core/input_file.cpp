// Paths to read, resolved and checked before reading (input_file.hpp).
#include "kdflow/core/input_file.hpp"

#include "kdflow/core/error.hpp"

#include <cerrno>
#include <fstream>
#include <limits>
#include <system_error>

#include <fmt/format.h>

namespace kdflow {
namespace fs = std::filesystem;
namespace {

[[noreturn]] void refuse(const fs::path& path, std::string_view what, std::string_view reason) {
  throw InputError(fmt::format("{} {}: {}", what, path.string(), reason));
}

// What `path` is after its links; refuses what cannot be resolved (no such path, a loop, a
// dangling link, no permission). `noun`: what a missing one is called.
fs::file_status resolved_status(const fs::path& path, std::string_view what,
                                std::string_view noun = "file") {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!ec) return st;
  if (ec == std::errc::too_many_symbolic_link_levels)
    refuse(path, what, "a loop of symbolic links");
  if (ec == std::errc::no_such_file_or_directory) {
    std::error_code link_ec;
    if (fs::is_symlink(fs::symlink_status(path, link_ec)))
      refuse(path, what, "a symbolic link to nothing");
    refuse(path, what, fmt::format("no such {}", noun));
  }
  if (ec == std::errc::not_a_directory) refuse(path, what, "a part of the path is not a folder");
  refuse(path, what, ec.message());
}

std::string_view kind_of(const fs::file_status& st) {
  switch (st.type()) {
  case fs::file_type::directory: return "a folder";
  case fs::file_type::fifo: return "a pipe";
  case fs::file_type::socket: return "a socket";
  case fs::file_type::block:
  case fs::file_type::character: return "a device";
  default: return "not a regular file";
  }
}

} // namespace

std::uint64_t check_input_file(const fs::path& path, std::string_view what,
                               std::uint64_t max_bytes) {
  const fs::file_status st = resolved_status(path, what);
  if (!fs::is_regular_file(st)) refuse(path, what, fmt::format("{}, not a file", kind_of(st)));
  std::error_code ec;
  const std::uint64_t size = fs::file_size(path, ec);
  if (ec) refuse(path, what, ec.message());
  if (size > max_bytes)
    refuse(path, what, fmt::format("{} bytes, more than the {} it may hold", size, max_bytes));
  return size;
}

void check_input_folder(const fs::path& path, std::string_view what) {
  const fs::file_status st = resolved_status(path, what, "folder");
  if (!fs::is_directory(st)) refuse(path, what, "not a folder");
}

std::string read_input_file(const fs::path& path, std::string_view what, std::uint64_t max_bytes) {
  const std::uint64_t size = check_input_file(path, what, max_bytes);
  std::ifstream in(path, std::ios::binary);
  if (!in) refuse(path, what, "cannot be opened for reading");
  // One block of the size checked (a model of hundreds of MiB is read at the disk's rate).
  std::string bytes(static_cast<std::size_t>(size), '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(size));
  if (static_cast<std::uint64_t>(in.gcount()) != size)
    refuse(path, what,
           fmt::format("{} bytes read of {} (it changed while being read)", in.gcount(), size));
  return bytes;
}

fs::path confined_file(const fs::path& folder, const fs::path& relative, std::string_view what) {
  const fs::path joined = folder / relative;
  bool escapes = relative.empty() || relative.is_absolute();
  for (const auto& part : relative.lexically_normal()) escapes = escapes || part == "..";
  if (escapes) refuse(joined, what, "not a file inside the model's folder");
  check_input_file(joined, what);
  std::error_code ec;
  const fs::path root = fs::canonical(folder.empty() ? fs::path(".") : folder, ec);
  if (ec) refuse(folder, what, ec.message());
  const fs::path real = fs::canonical(joined, ec);
  if (ec) refuse(joined, what, ec.message());
  const fs::path inside = real.lexically_relative(root);
  if (inside.empty() || *inside.begin() == ".." || inside == ".")
    refuse(joined, what, fmt::format("leads out of the model's folder (to {})", real.string()));
  return real;
}

void check_output_path(const fs::path& path, std::string_view what) {
  for (fs::path p = path; !p.empty(); p = p.parent_path()) {
    std::error_code ec;
    const fs::file_status st = fs::status(p, ec);
    if (ec == std::errc::too_many_symbolic_link_levels)
      refuse(path, what, fmt::format("{} is a loop of symbolic links", p.string()));
    std::error_code link_ec;
    if (ec == std::errc::no_such_file_or_directory &&
        fs::is_symlink(fs::symlink_status(p, link_ec)))
      refuse(path, what, fmt::format("{} is a symbolic link to nothing", p.string()));
    if (!ec && p != path && !fs::is_directory(st))
      refuse(path, what, fmt::format("{} is not a folder", p.string()));
    if (p == p.parent_path()) break;
  }
}

} // namespace kdflow
