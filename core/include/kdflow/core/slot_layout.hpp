// The fixed layout of one ring slot, declared at start-up from the data and teacher shapes: a
// header (batch number, valid samples), then named regions (inputs, labels, sample ids, one per
// teacher output), each aligned so that loaders, teacher and DMA never share a cache line across
// regions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kdflow {

enum class DType : std::uint8_t { u8, i32, i64, f32 };

std::size_t dtype_size(DType dtype);

struct RegionSpec {
  std::string name;
  DType dtype;
  std::vector<std::int64_t> shape; // per slot, batch dimension included
};

struct Region {
  RegionSpec spec;
  std::size_t offset; // from the slot's start, a multiple of the layout's alignment
  std::size_t bytes;
};

// Written by whoever fills the slot; read by every later stage.
struct SlotHeader {
  std::uint64_t batch;   // global batch number (monotonic across epochs)
  std::uint32_t samples; // valid samples (the last batch of an epoch may be short)
  std::uint32_t epoch;
};

class SlotLayout {
public:
  static constexpr std::size_t kMinAlignment = 64;    // one cache line
  static constexpr std::size_t kSlotAlignment = 4096; // slots start on pages: DMA-friendly

  // Throws InputError on a duplicate or empty name, a non-positive dimension, or a bad alignment.
  explicit SlotLayout(std::vector<RegionSpec> regions, std::size_t alignment = kMinAlignment);

  [[nodiscard]] std::size_t slot_bytes() const { return slot_bytes_; }
  [[nodiscard]] const std::vector<Region>& regions() const { return regions_; }
  // Index of a region by name; throws std::out_of_range naming it when absent.
  [[nodiscard]] std::size_t index_of(std::string_view name) const;
  [[nodiscard]] const Region& region(std::string_view name) const {
    return regions_[index_of(name)];
  }

private:
  std::vector<Region> regions_;
  std::size_t slot_bytes_ = 0;
};

} // namespace kdflow
