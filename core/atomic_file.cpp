// Files written so that a reader never sees half of one: a temporary beside the target, fsync,
// rename; and checked files (a header with a CRC-32 of the payload) for checkpoints.
#include "kdflow/core/atomic_file.hpp"

#include "kdflow/core/error.hpp"
#include "kdflow/core/input_file.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>
#include <zlib.h>

#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <utility>

#include <fmt/format.h>

namespace kdflow {
namespace {

constexpr char kMagic[8] = {'K', 'D', 'F', 'L', 'O', 'W', 'C', '1'};
constexpr std::size_t kHeaderBytes = sizeof(kMagic) + sizeof(std::uint64_t) + sizeof(std::uint32_t);
constexpr std::string_view kTempMarker = ".tmp.";

std::uint32_t crc32_of(std::span<const std::byte> bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  const auto* p = reinterpret_cast<const Bytef*>(bytes.data());
  for (std::size_t left = bytes.size(); left > 0;) {
    const auto n = static_cast<uInt>(std::min<std::size_t>(left, 1u << 30));
    crc = crc32(crc, p, n);
    p += n;
    left -= n;
  }
  return static_cast<std::uint32_t>(crc);
}

class Fd {
public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  [[nodiscard]] int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

private:
  int fd_;
};

void write_all(int fd, std::span<const std::byte> bytes, const std::filesystem::path& path) {
  for (std::size_t done = 0; done < bytes.size();) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_errno(errno, fmt::format("writing {}", path.string()));
    done += static_cast<std::size_t>(n);
  }
}

void write_atomic(const std::filesystem::path& path,
                  std::initializer_list<std::span<const std::byte>> parts) {
  const std::filesystem::path folder =
      path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  const std::filesystem::path temp =
      folder / fmt::format("{}{}{}", path.filename().string(), kTempMarker, ::getpid());
  {
    Fd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (fd.get() < 0) throw_errno(errno, fmt::format("creating {}", temp.string()));
    try {
      for (auto part : parts) write_all(fd.get(), part, temp);
      if (::fsync(fd.get()) != 0) throw_errno(errno, fmt::format("fsync of {}", temp.string()));
      if (::close(fd.release()) != 0) throw_errno(errno, fmt::format("closing {}", temp.string()));
    } catch (...) {
      ::unlink(temp.c_str());
      throw;
    }
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    throw_errno(err, fmt::format("renaming {} to {}", temp.string(), path.string()));
  }
  // The rename is durable only once the folder's entry is on disk.
  Fd dir(::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.get() < 0 || ::fsync(dir.get()) != 0)
    throw_errno(errno, fmt::format("fsync of folder {}", folder.string()));
}

} // namespace

void write_file_atomic(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  write_atomic(path, {bytes});
}

void write_file_atomic(const std::filesystem::path& path, std::string_view text) {
  write_atomic(path, {std::as_bytes(std::span(text.data(), text.size()))});
}

void write_checked_file(const std::filesystem::path& path, std::span<const std::byte> payload) {
  std::array<std::byte, kHeaderBytes> header{};
  const std::uint64_t length = payload.size();
  const std::uint32_t crc = crc32_of(payload);
  std::memcpy(header.data(), kMagic, sizeof(kMagic));
  std::memcpy(header.data() + sizeof(kMagic), &length, sizeof(length));
  std::memcpy(header.data() + sizeof(kMagic) + sizeof(length), &crc, sizeof(crc));
  write_atomic(path, {std::span<const std::byte>(header), payload});
}

std::vector<std::byte> read_checked_file(const std::filesystem::path& path, std::string_view what,
                                         std::uint64_t max_payload) {
  check_input_file(path, what);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("{} {}: cannot be opened", what, path.string()));
  in.seekg(0, std::ios::end);
  const auto size = static_cast<std::size_t>(in.tellg());
  in.seekg(0);
  if (size > kHeaderBytes && size - kHeaderBytes > max_payload)
    throw InputError(fmt::format("{} {}: {} bytes, more than a {} here can be ({})", what,
                                 path.string(), size, what, max_payload + kHeaderBytes));
  std::vector<std::byte> data(size);
  in.read(reinterpret_cast<char*>(data.data()), static_cast<std::streamsize>(size));
  if (!in) throw InputError(fmt::format("{} {}: read failed", what, path.string()));
  if (size < kHeaderBytes || std::memcmp(data.data(), kMagic, sizeof(kMagic)) != 0)
    throw InputError(fmt::format("{} {}: not a kdflow {} (bad header)", what, path.string(), what));
  std::uint64_t length = 0;
  std::uint32_t crc = 0;
  std::memcpy(&length, data.data() + sizeof(kMagic), sizeof(length));
  std::memcpy(&crc, data.data() + sizeof(kMagic) + sizeof(length), sizeof(crc));
  if (length != size - kHeaderBytes)
    throw InputError(fmt::format("{} {}: truncated or padded ({} payload bytes, header says {})",
                                 what, path.string(), size - kHeaderBytes, length));
  // The payload in place (no second copy of a large file).
  data.erase(data.begin(), data.begin() + kHeaderBytes);
  if (crc32_of(data) != crc)
    throw InputError(fmt::format("{} {}: corrupt (checksum mismatch)", what, path.string()));
  return data;
}

bool is_atomic_temporary(const std::filesystem::path& name) {
  return name.filename().string().find(kTempMarker) != std::string::npos;
}

std::size_t sweep_atomic_temporaries(const std::filesystem::path& folder) {
  std::error_code ec;
  std::size_t removed = 0;
  for (const auto& entry : std::filesystem::directory_iterator(folder, ec)) {
    const std::string name = entry.path().filename().string();
    const auto marker = name.rfind(kTempMarker);
    if (marker == std::string::npos) continue;
    // "<file>.tmp.<pid>": its writer's pid; a process that still runs is writing it now.
    const std::string pid_text = name.substr(marker + kTempMarker.size());
    long pid = 0;
    const auto [end, err] =
        std::from_chars(pid_text.data(), pid_text.data() + pid_text.size(), pid);
    if (err != std::errc() || end != pid_text.data() + pid_text.size() || pid <= 0) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    if (std::filesystem::remove(entry.path(), ec)) ++removed;
  }
  return removed;
}

} // namespace kdflow
