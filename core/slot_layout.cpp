// Slot layout: offsets and sizes of the header and each named region.
#include "kdflow/core/slot_layout.hpp"

#include "kdflow/core/error.hpp"

#include <stdexcept>

#include <fmt/format.h>

namespace kdflow {
namespace {

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

} // namespace

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
  case DType::u8: return 1;
  case DType::i32: return 4;
  case DType::f32: return 4;
  case DType::i64: return 8;
  }
  return 0;
}

SlotLayout::SlotLayout(std::vector<RegionSpec> regions, std::size_t alignment) {
  if (alignment < kMinAlignment || (alignment & (alignment - 1)) != 0)
    throw InputError(fmt::format("slot layout: alignment {} must be a power of two >= {}",
                                 alignment, kMinAlignment));
  std::size_t offset = round_up(sizeof(SlotHeader), alignment);
  for (auto& spec : regions) {
    if (spec.name.empty()) throw InputError("slot layout: a region has no name");
    for (const auto& r : regions_)
      if (r.spec.name == spec.name)
        throw InputError(fmt::format("slot layout: region '{}' declared twice", spec.name));
    std::size_t elements = 1;
    for (const auto d : spec.shape) {
      if (d <= 0)
        throw InputError(fmt::format("slot layout: region '{}' has dimension {}", spec.name, d));
      elements *= static_cast<std::size_t>(d);
    }
    const std::size_t bytes = elements * dtype_size(spec.dtype);
    regions_.push_back({std::move(spec), offset, bytes});
    offset = round_up(offset + bytes, alignment);
  }
  slot_bytes_ = round_up(offset, kSlotAlignment);
}

std::size_t SlotLayout::index_of(std::string_view name) const {
  for (std::size_t i = 0; i < regions_.size(); ++i)
    if (regions_[i].spec.name == name) return i;
  throw std::out_of_range(fmt::format("slot layout has no region '{}'", name));
}

} // namespace kdflow
