#include "kdflow/core/digest.hpp"

#include <fstream>
#include <vector>

#include <fmt/format.h>

namespace kdflow {

std::string file_digest(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::uint64_t h = kFnv1aOffset;
  std::size_t total = 0;
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const auto n = static_cast<std::size_t>(in.gcount());
    h = fnv1a(std::as_bytes(std::span(buf.data(), n)), h);
    total += n;
  }
  return fmt::format("{:016x}-{}", h, total);
}

} // namespace kdflow
