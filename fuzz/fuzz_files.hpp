// What the fuzz targets share: a private temporary folder per process (the readers take paths)
// and the one rule they check: a reader may refuse its input only with kdflow::InputError.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

namespace kdflow::fuzz {

// A folder of this process's own, made once (mkdtemp), removed at exit.
inline const std::string& folder() {
  // Never destroyed: the exit handler that removes the folder runs after static destructors.
  static const std::string& path = *new std::string([] {
    std::string pattern = "/tmp/kdflow-fuzz.XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) std::abort();
    return pattern;
  }());
  static const bool removed_at_exit = [] {
    std::atexit(
        [] { [[maybe_unused]] const int rc = std::system(("rm -rf '" + folder() + "'").c_str()); });
    return true;
  }();
  (void)removed_at_exit;
  return path;
}

// Writes `size` bytes at `name` in the folder; returns its path.
inline std::string write(const std::string& name, const std::uint8_t* data, std::size_t size) {
  const std::string path = folder() + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) std::abort();
  return path;
}

} // namespace kdflow::fuzz
