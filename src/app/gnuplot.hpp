// gnuplot (Debian's gnuplot-nox), as bench-overlap --plot and kdflow report draw with it: a script
// and its data files in a scratch folder of their own, the PNGs the script names as the output.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace kdflow::app {

// Whether a gnuplot is on PATH.
bool gnuplot_installed();

// Writes `files` (name, contents) and `script` into a fresh scratch folder, runs gnuplot there
// (the script names its data files by their bare names, its outputs by absolute paths) and
// removes the scratch. std::runtime_error starting with `what` and carrying gnuplot's own message
// when it fails.
void run_gnuplot(const std::string& script,
                 const std::vector<std::pair<std::string, std::string>>& files,
                 const std::string& what);

// `text` quoted for a gnuplot string in single quotes.
std::string gnuplot_quoted(const std::string& text);

} // namespace kdflow::app
