// Student architectures. The ResNets and MobileNetV2 have two stems (student.stem): CIFAR-style
// (3x3, stride 1, no max-pool) so 28x28 and 32x32 inputs keep enough resolution, and ImageNet-style
// (torchvision's: 7x7 stride 2 and a 3x3 stride-2 max-pool for the ResNets, a stride-2 3x3 and
// stride-2 second stage for MobileNetV2), which at 224 pixels costs 1/16 of the CIFAR form's
// FLOPs. Their pooling is global, so either takes any size.
#include "models.hpp"

#include "kdflow/core/error.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace kdflow::student {
namespace {

namespace nn = torch::nn;

std::int64_t scaled(std::int64_t channels, double width) {
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(std::lround(channels * width)));
}

nn::Conv2d conv(std::int64_t in, std::int64_t out, std::int64_t k, std::int64_t stride = 1,
                std::int64_t groups = 1) {
  return nn::Conv2d(
      nn::Conv2dOptions(in, out, k).stride(stride).padding(k / 2).groups(groups).bias(false));
}

// conv -> batch norm -> (ReLU | ReLU6 | none)
enum class Act { none, relu, relu6 };
struct ConvBnImpl : nn::Module {
  ConvBnImpl(std::int64_t in, std::int64_t out, std::int64_t k, std::int64_t stride = 1,
             std::int64_t groups = 1, Act act = Act::relu)
      : c(register_module("conv", conv(in, out, k, stride, groups))),
        bn(register_module("bn", nn::BatchNorm2d(out))), act(act) {}
  torch::Tensor forward(torch::Tensor x) {
    x = bn->forward(c->forward(x));
    if (act == Act::relu) return torch::relu(x);
    if (act == Act::relu6) return torch::clamp(x, 0, 6);
    return x;
  }
  std::string export_onnx(GraphWriter& w, const std::string& x) const {
    const std::string y = w.conv(x, *c, bn.get());
    if (act == Act::relu) return w.relu(y);
    if (act == Act::relu6) return w.relu6(y);
    return y;
  }
  nn::Conv2d c;
  nn::BatchNorm2d bn;
  Act act;
};
TORCH_MODULE(ConvBn);

struct Mlp : Net {
  Mlp(std::int64_t in, std::int64_t hidden, std::int64_t classes)
      : fc1(register_module("fc1", nn::Linear(in, hidden))),
        fc2(register_module("fc2", nn::Linear(hidden, hidden))),
        fc3(register_module("fc3", nn::Linear(hidden, classes))) {}
  torch::Tensor forward(torch::Tensor x, Taps& taps) override {
    x = torch::relu(fc1->forward(x.flatten(1)));
    taps.stage(x);
    x = torch::relu(fc2->forward(x));
    taps.stage(x);
    taps.put("penultimate", x);
    return fc3->forward(x);
  }
  std::vector<std::string> tap_names() const override {
    return {"stage1", "stage2", "penultimate"};
  }
  std::string export_onnx(GraphWriter& w, const std::string& x) override {
    const std::string h = w.relu(w.linear(w.flatten(x), *fc1));
    return w.linear(w.relu(w.linear(h, *fc2)), *fc3);
  }
  nn::Linear fc1, fc2, fc3;
};

// Three conv stages with max-pooling between them, global pooling, one linear layer.
struct Cnn : Net {
  Cnn(std::int64_t in, double w, std::int64_t classes) {
    const std::int64_t c1 = scaled(32, w), c2 = scaled(64, w), c3 = scaled(128, w);
    body = register_module("body",
                           nn::Sequential(ConvBn(in, c1, 3), nn::MaxPool2d(2), ConvBn(c1, c2, 3),
                                          nn::MaxPool2d(2), ConvBn(c2, c3, 3)));
    fc = register_module("fc", nn::Linear(c3, classes));
  }
  torch::Tensor forward(torch::Tensor x, Taps& taps) override {
    for (const auto& layer : body->children()) {
      if (auto* cb = layer->as<ConvBnImpl>()) {
        x = cb->forward(x);
        taps.stage(x);
      } else {
        x = layer->as<nn::MaxPool2dImpl>()->forward(x);
      }
    }
    x = x.mean({2, 3});
    taps.put("penultimate", x);
    return fc->forward(x);
  }
  std::vector<std::string> tap_names() const override {
    return {"stage1", "stage2", "stage3", "penultimate"};
  }
  std::string export_onnx(GraphWriter& w, const std::string& x) override {
    std::string y = x;
    for (const auto& layer : body->children())
      if (const auto* cb = layer->as<ConvBnImpl>())
        y = cb->export_onnx(w, y);
      else if (const auto* pool = layer->as<nn::MaxPool2dImpl>())
        y = w.max_pool(y, (*pool->options.kernel_size())[0]);
    return w.linear(w.global_mean(y), *fc);
  }
  nn::Sequential body{nullptr};
  nn::Linear fc{nullptr};
};

struct BasicBlockImpl : nn::Module {
  BasicBlockImpl(std::int64_t in, std::int64_t out, std::int64_t stride)
      : a(register_module("a", ConvBn(in, out, 3, stride))),
        b(register_module("b", ConvBn(out, out, 3, 1, 1, Act::none))) {
    if (stride != 1 || in != out)
      shortcut = register_module("shortcut", ConvBn(in, out, 1, stride, 1, Act::none));
  }
  torch::Tensor forward(torch::Tensor x) {
    const torch::Tensor skip = shortcut ? shortcut->forward(x) : x;
    return torch::relu(b->forward(a->forward(x)) + skip);
  }
  std::string export_onnx(GraphWriter& w, const std::string& x) const {
    const std::string skip = shortcut ? shortcut->export_onnx(w, x) : x;
    return w.relu(w.add(b->export_onnx(w, a->export_onnx(w, x)), skip));
  }
  ConvBn a, b, shortcut{nullptr};
};
TORCH_MODULE(BasicBlock);

// CIFAR ResNets (He et al. 2016, sec. 4.2: 6n+2 layers, 16-32-64 channels) and resnet18 with a
// 3x3 stride-1 stem (64-128-256-512 channels, two blocks per stage).
struct ResNet : Net {
  ResNet(std::int64_t in, const std::vector<std::int64_t>& channels, const std::vector<int>& blocks,
         std::int64_t classes, bool imagenet)
      : imagenet_(imagenet) {
    stem = register_module("stem",
                           imagenet ? ConvBn(in, channels[0], 7, 2) : ConvBn(in, channels[0], 3));
    std::int64_t cin = channels[0];
    for (std::size_t s = 0; s < channels.size(); ++s)
      for (int b = 0; b < blocks[s]; ++b) {
        const std::int64_t stride = (s > 0 && b == 0) ? 2 : 1;
        stages->push_back(BasicBlock(cin, channels[s], stride));
        stage_ends_.push_back(b + 1 == blocks[s]);
        cin = channels[s];
      }
    stage_count_ = channels.size();
    register_module("stages", stages);
    fc = register_module("fc", nn::Linear(cin, classes));
  }
  // A stage: the blocks of one width; its output is its last block's.
  torch::Tensor forward(torch::Tensor x, Taps& taps) override {
    x = stem->forward(x);
    if (imagenet_) x = torch::max_pool2d(x, 3, 2, 1);
    const auto blocks = stages->children();
    for (std::size_t k = 0; k < blocks.size(); ++k) {
      x = blocks[k]->as<BasicBlockImpl>()->forward(x);
      if (k + 1 == blocks.size() || stage_ends_[k]) taps.stage(x);
    }
    x = x.mean({2, 3});
    taps.put("penultimate", x);
    return fc->forward(x);
  }
  std::vector<std::string> tap_names() const override {
    std::vector<std::string> names;
    for (std::size_t s = 1; s <= stage_count_; ++s) names.push_back("stage" + std::to_string(s));
    names.emplace_back("penultimate");
    return names;
  }
  std::string export_onnx(GraphWriter& w, const std::string& x) override {
    std::string y = stem->export_onnx(w, x);
    if (imagenet_) y = w.max_pool(y, 3, 2, 1);
    for (const auto& block : stages->children()) y = block->as<BasicBlockImpl>()->export_onnx(w, y);
    return w.linear(w.global_mean(y), *fc);
  }
  ConvBn stem{nullptr};
  nn::Sequential stages;
  nn::Linear fc{nullptr};
  std::vector<bool> stage_ends_; // per block: the last of its stage
  std::size_t stage_count_ = 0;
  bool imagenet_;
};

struct InvertedResidualImpl : nn::Module {
  InvertedResidualImpl(std::int64_t in, std::int64_t out, std::int64_t stride, std::int64_t expand)
      : residual(stride == 1 && in == out) {
    const std::int64_t hidden = in * expand;
    if (expand != 1) body->push_back(ConvBn(in, hidden, 1, 1, 1, Act::relu6));
    body->push_back(ConvBn(hidden, hidden, 3, stride, hidden, Act::relu6));
    body->push_back(ConvBn(hidden, out, 1, 1, 1, Act::none));
    register_module("body", body);
  }
  torch::Tensor forward(torch::Tensor x) {
    return residual ? x + body->forward(x) : body->forward(x);
  }
  std::string export_onnx(GraphWriter& w, const std::string& x) const {
    std::string y = x;
    for (const auto& layer : body->children()) y = layer->as<ConvBnImpl>()->export_onnx(w, y);
    return residual ? w.add(x, y) : y;
  }
  nn::Sequential body;
  bool residual;
};
TORCH_MODULE(InvertedResidual);

// MobileNetV2 (Sandler et al. 2018): torchvision's strides, or the CIFAR adaptation's stride-1
// stem and second stage.
struct MobileNetV2 : Net {
  MobileNetV2(std::int64_t in, double w, std::int64_t classes, bool imagenet) {
    struct Setting {
      std::int64_t expand, channels;
      int repeats;
      std::int64_t stride;
    };
    const std::int64_t second = imagenet ? 2 : 1;
    const Setting settings[] = {{1, 16, 1, 1}, {6, 24, 2, second}, {6, 32, 3, 2}, {6, 64, 4, 2},
                                {6, 96, 3, 1}, {6, 160, 3, 2},     {6, 320, 1, 1}};
    std::int64_t cin = scaled(32, w);
    features->push_back(ConvBn(in, cin, 3, imagenet ? 2 : 1, 1, Act::relu6));
    stage_ends_.push_back(false);
    for (const auto& s : settings)
      for (int r = 0; r < s.repeats; ++r) {
        const std::int64_t out = scaled(s.channels, w);
        features->push_back(InvertedResidual(cin, out, r == 0 ? s.stride : 1, s.expand));
        stage_ends_.push_back(r + 1 == s.repeats);
        cin = out;
      }
    const std::int64_t last = std::max<std::int64_t>(1280, scaled(1280, w));
    features->push_back(ConvBn(cin, last, 1, 1, 1, Act::relu6));
    stage_ends_.push_back(true);
    register_module("features", features);
    fc = register_module("fc", nn::Linear(last, classes));
  }
  // A stage: the blocks of one setting (width and stride), then the last 1x1 convolution.
  torch::Tensor forward(torch::Tensor x, Taps& taps) override {
    const auto layers = features->children();
    for (std::size_t k = 0; k < layers.size(); ++k) {
      auto* cb = layers[k]->as<ConvBnImpl>();
      x = cb != nullptr ? cb->forward(x) : layers[k]->as<InvertedResidualImpl>()->forward(x);
      if (stage_ends_[k]) taps.stage(x);
    }
    x = x.mean({2, 3});
    taps.put("penultimate", x);
    return fc->forward(x);
  }
  std::vector<std::string> tap_names() const override {
    std::vector<std::string> names;
    const auto n = std::count(stage_ends_.begin(), stage_ends_.end(), true);
    for (std::ptrdiff_t s = 1; s <= n; ++s) names.push_back("stage" + std::to_string(s));
    names.emplace_back("penultimate");
    return names;
  }
  std::string export_onnx(GraphWriter& w, const std::string& x) override {
    std::string y = x;
    for (const auto& layer : features->children())
      if (const auto* cb = layer->as<ConvBnImpl>())
        y = cb->export_onnx(w, y);
      else
        y = layer->as<InvertedResidualImpl>()->export_onnx(w, y);
    return w.linear(w.global_mean(y), *fc);
  }
  nn::Sequential features;
  nn::Linear fc{nullptr};
  std::vector<bool> stage_ends_; // per layer: the last of its stage
};

// The student registry: each architecture once, with how it is built. A new student is an entry
// here; the config schema takes its names from this list.
struct StudentEntry {
  const char* name;
  // Its least input side: the resolution it halves before the global pooling keeps a pixel.
  int cifar_min, imagenet_min; // 0: it has no such stem
  std::shared_ptr<Net> (*make)(const StudentSpec& spec);
};

bool imagenet_stem(const StudentSpec& s) { return resolve_stem(s) == "imagenet"; }

std::shared_ptr<Net> make_resnet(const StudentSpec& s, std::vector<std::int64_t> widths,
                                 std::vector<int> blocks) {
  for (auto& w : widths) w = scaled(w, s.width);
  return std::make_shared<ResNet>(s.channels, std::move(widths), std::move(blocks), s.classes,
                                  imagenet_stem(s));
}

const StudentEntry kStudents[] = {
    {"mlp", 1, 0,
     [](const StudentSpec& s) -> std::shared_ptr<Net> {
       return std::make_shared<Mlp>(s.channels * s.height * s.width_px, scaled(256, s.width),
                                    s.classes);
     }},
    {"cnn", 8, 0,
     [](const StudentSpec& s) -> std::shared_ptr<Net> {
       return std::make_shared<Cnn>(s.channels, s.width, s.classes);
     }},
    {"resnet20", 8, 32,
     [](const StudentSpec& s) {
       return make_resnet(s, {16, 32, 64}, {3, 3, 3});
     }},
    {"resnet56", 8, 32,
     [](const StudentSpec& s) {
       return make_resnet(s, {16, 32, 64}, {9, 9, 9});
     }},
    {"resnet18", 8, 32,
     [](const StudentSpec& s) {
       return make_resnet(s, {64, 128, 256, 512}, {2, 2, 2, 2});
     }},
    {"mobilenetv2", 8, 32,
     [](const StudentSpec& s) -> std::shared_ptr<Net> {
       return std::make_shared<MobileNetV2>(s.channels, s.width, s.classes, imagenet_stem(s));
     }},
    // The user's own module (student.path), checked with one dry batch of the data's shape.
    {"torchscript", 1, 0, make_script_net},
};

const StudentEntry& entry_of(const std::string& arch) {
  const auto entry = std::find_if(std::begin(kStudents), std::end(kStudents),
                                  [&](const StudentEntry& e) { return arch == e.name; });
  if (entry == std::end(kStudents))
    throw InputError(fmt::format("student.arch = {}: unknown (one of {})", arch,
                                 fmt::join(student_names(), ", ")));
  return *entry;
}

} // namespace

std::vector<std::string> student_names() {
  std::vector<std::string> names;
  for (const auto& e : kStudents) names.emplace_back(e.name);
  return names;
}

std::vector<std::string> stem_names() { return {"auto", "cifar", "imagenet"}; }

std::string resolve_stem(const StudentSpec& spec) {
  const StudentEntry& e = entry_of(spec.arch);
  if (spec.stem == "auto")
    return e.imagenet_min > 0 && std::min(spec.height, spec.width_px) >= kImagenetStemFrom
               ? "imagenet"
               : "cifar";
  if (spec.stem == "imagenet" && e.imagenet_min == 0)
    throw InputError(fmt::format("student.stem = imagenet: student.arch = {} has one form only "
                                 "(resnet20, resnet56, resnet18 and mobilenetv2 have both)",
                                 spec.arch));
  if (spec.stem != "cifar" && spec.stem != "imagenet")
    throw InputError(
        fmt::format("student.stem = {}: unknown (auto, cifar or imagenet)", spec.stem));
  return spec.stem;
}

std::shared_ptr<Net> make_student(const StudentSpec& spec) {
  const StudentEntry& entry = entry_of(spec.arch);
  const std::string stem = resolve_stem(spec);
  const int least = stem == "imagenet" ? entry.imagenet_min : entry.cifar_min;
  if (spec.height < least || spec.width_px < least)
    throw InputError(fmt::format("student.arch = {} ({} stem): the input ({}x{}) is smaller than "
                                 "{}x{}",
                                 spec.arch, stem, spec.height, spec.width_px, least, least));
  return entry.make(spec);
}

} // namespace kdflow::student
