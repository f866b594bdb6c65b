// Colour jitter as torchvision's ColorJitter(brightness, contrast, saturation, hue) computes it on
// a uint8 image tensor (torchvision.transforms.functional's tensor path): the four adjustments in a
// random order, each factor drawn uniformly from its range, each adjustment computed in float32 in
// torchvision's own order of operations and truncated back to uint8 as `.to(torch.uint8)` does.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace kdflow {

// The jitter's strengths, as ColorJitter's arguments: brightness b draws its factor from
// [max(0, 1 - b), 1 + b] (so do contrast and saturation), hue h from [-h, h] with h <= 0.5. Zero
// turns one off (torchvision's None).
struct JitterRanges {
  float brightness = 0, contrast = 0, saturation = 0, hue = 0;
  [[nodiscard]] bool any() const {
    return brightness > 0 || contrast > 0 || saturation > 0 || hue > 0;
  }
};

// One image's jitter: the order of the four adjustments (0 brightness, 1 contrast, 2 saturation,
// 3 hue: torch.randperm(4)'s role), which apply (their range is on) and their factors.
struct JitterDraw {
  bool on = false;
  std::array<int, 4> order{0, 1, 2, 3};
  std::array<bool, 4> applies{};
  float brightness = 1, contrast = 1, saturation = 1, hue = 0;
};

// The draw from `key` alone (the same key, the same draw, on any thread).
JitterDraw draw_jitter(const JitterRanges& ranges, std::uint64_t key);

// Applies `draw` in place to a planar uint8 image (channels x h x w, channels 1 or 3). A
// one-channel image takes brightness and contrast only, as torchvision's tensor functions leave a
// grey image's saturation and hue alone. The contrast's mean is exact where the image's sum of
// grey levels stays below 2^24 (up to 256 x 256 pixels; PyTorch sums in float32 too).
void color_jitter(std::uint8_t* image, int channels, int h, int w, const JitterDraw& draw);

} // namespace kdflow
