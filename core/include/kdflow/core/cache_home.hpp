// Where kdflow keeps what it can compute again (tuned teacher plans, the teacher's outputs).
#pragma once

#include <filesystem>

namespace kdflow {

// $KDFLOW_CACHE_DIR, else $XDG_CACHE_HOME/kdflow, else $HOME/.cache/kdflow; empty when none of
// them is set.
std::filesystem::path cache_home();

} // namespace kdflow
