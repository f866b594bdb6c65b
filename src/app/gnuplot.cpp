// gnuplot runs (gnuplot.hpp).
#include "gnuplot.hpp"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include <fmt/format.h>

namespace kdflow::app {
namespace fs = std::filesystem;

bool gnuplot_installed() { return std::system("command -v gnuplot >/dev/null 2>&1") == 0; }

std::string gnuplot_quoted(const std::string& text) {
  std::string out = "'";
  for (const char c : text) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

void run_gnuplot(const std::string& script,
                 const std::vector<std::pair<std::string, std::string>>& files,
                 const std::string& what) {
  std::string scratch = (fs::temp_directory_path() / "kdflow-gnuplot.XXXXXX").string();
  if (::mkdtemp(scratch.data()) == nullptr)
    throw std::runtime_error(fmt::format("{}: cannot make a scratch folder in {}", what,
                                         fs::temp_directory_path().string()));
  const fs::path dir = scratch;
  std::vector<std::string> names = {"plot.gp", "gnuplot.err"};
  std::ofstream(dir / "plot.gp") << script;
  for (const auto& [name, contents] : files) {
    std::ofstream(dir / name) << contents;
    names.push_back(name);
  }
  const std::string command = fmt::format("cd '{}' && gnuplot plot.gp 2>gnuplot.err", dir.string());
  const int status = std::system(command.c_str());
  std::string err;
  if (std::ifstream in(dir / "gnuplot.err"); in) std::getline(in, err, '\0');
  err.erase(0, err.find_first_not_of(" \n"));
  // File by file: libtorch.so exports its own, older copy of std::filesystem, and its remove_all
  // (which the dynamic linker picks for this binary too) crashes.
  for (const std::string& name : names) fs::remove(dir / name);
  fs::remove(dir);
  if (status != 0)
    throw std::runtime_error(
        fmt::format("{}: gnuplot failed ({}); scripts/setup.sh installs gnuplot-nox", what,
                    err.empty() ? "is it installed?" : err.substr(0, err.find('\n'))));
}

} // namespace kdflow::app
