// The fault hook's one instance (fault_hooks.hpp): null unless a test installs one.
#include "kdflow/core/fault_hooks.hpp"

namespace kdflow::fault::detail {

std::atomic<Hook> hook{nullptr};

} // namespace kdflow::fault::detail
