// A test process's own folder under the temporary directory ($TMPDIR or /tmp, named <prefix><pid>):
// made on first use and removed when the process exits with every test passed (kept for a look
// when one failed or the process was killed). Every test runs as a process of its own under ctest,
// so without this each left a folder behind (a CI run left about 200, 250 MB). POSIX calls only:
// LibTorch carries its own std::filesystem, whose remove_all the dynamic linker may bind in a test
// linked with it.
#pragma once

#include <gtest/gtest.h>

#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>

namespace kdflow_test {

namespace scratch_detail {

inline int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  return ::remove(path);
}

inline std::set<std::string>& roots() {
  static std::set<std::string> made; // made before the exit handler is registered: outlives it
  return made;
}

inline void remove_roots() {
  if (!::testing::UnitTest::GetInstance()->Passed()) return;
  for (const std::string& root : roots())
    ::nftw(root.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

} // namespace scratch_detail

inline std::string process_scratch(const std::string& prefix) {
  static std::mutex mutex;
  const char* tmp = std::getenv("TMPDIR");
  const std::string root = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/" +
                           prefix + std::to_string(::getpid());
  const std::lock_guard lock(mutex);
  auto& roots = scratch_detail::roots();
  if (roots.insert(root).second) {
    if (roots.size() == 1) std::atexit(scratch_detail::remove_roots);
    ::mkdir(root.c_str(), 0755);
  }
  return root;
}

} // namespace kdflow_test
