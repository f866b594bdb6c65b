// The loader stage alone: images/s of kdflow's loaders (the same stage graph, pinned arena and ring
// as `kdflow train`) on 1..N cores, for Fashion-MNIST with augmentation and for a folder of JPEGs
// (decode, random crop, flip, normalize into float32 slots); plus the bare decoder on one core.
// With --recipe-folder, the ImageNet training recipe on a folder of photographs' sizes:
// RandomResizedCrop(size), flip, and again with ColorJitter(0.4, 0.4, 0.4), normalized into
// float32 slots. scripts/bench_loader.sh runs it beside a PIL peer (and torchvision's transforms
// for the recipe) on the same files and writes the ratios.
//
//   kdflow_loader_bench [--fmnist DIR] [--folder ROOT] [--recipe-folder ROOT] [--size 224]
//                       [--resize 256] [--batch 64] [--seconds 2] [--reps 3] [--json F]
#include "bench_util.hpp"

#include "kdflow/affinity/pinning.hpp"
#include "kdflow/affinity/topology.hpp"
#include "kdflow/core/host_memory.hpp"
#include "kdflow/core/loader.hpp"

#include <oneapi/tbb/global_control.h>

#include <chrono>
#include <cstdlib>
#include <map>

namespace kdflow::bench {
namespace {

struct Args {
  std::string fmnist = "/usr/share/datasets/fashion-mnist";
  std::string folder;        // empty: no JPEG case
  std::string recipe_folder; // empty: no ImageNet recipe case
  ImageGeometry geometry{224, 256};
  std::size_t batch = 64;
  double seconds = 2;
  int reps = 3;
  std::string json;
};

Args parse(int argc, char** argv) {
  Args a;
  std::map<std::string, std::string> kv;
  for (int i = 1; i < argc; ++i) {
    const std::string key = argv[i];
    if (!key.starts_with("--") || i + 1 >= argc)
      throw std::invalid_argument("usage: see the comment at the top of bench/loader_bench.cpp");
    kv[key.substr(2)] = argv[++i];
  }
  for (const auto& [k, v] : kv) {
    if (k == "fmnist")
      a.fmnist = v;
    else if (k == "folder")
      a.folder = v;
    else if (k == "recipe-folder")
      a.recipe_folder = v;
    else if (k == "size")
      a.geometry.size = std::stoi(v);
    else if (k == "resize")
      a.geometry.resize = std::stoi(v);
    else if (k == "batch")
      a.batch = std::stoul(v);
    else if (k == "seconds")
      a.seconds = std::stod(v);
    else if (k == "reps")
      a.reps = std::stoi(v);
    else if (k == "json")
      a.json = v;
    else
      throw std::invalid_argument("unknown option --" + k);
  }
  return a;
}

// Images/s of the loader stage on `cpus`: it fills a ring of float32 slots that this thread drains
// (acquire, release: nearly free) for `seconds` after a warm-up of a ring lap per loader.
double loader_rate(const affinity::Topology& topology, const affinity::CpuList& cpus,
                   const Dataset& d, const AugmentConfig& aug, std::size_t batch, double seconds) {
  SamplerConfig sc;
  sc.batch_size = batch;
  sc.seed = 7;
  const Sampler sampler(d.size(), sc);
  const SlotLayout layout = loader_layout(d, batch, true);
  const auto slots = static_cast<std::uint32_t>(2 * cpus.size() + 2); // every loader a batch ahead
  SlotRing ring(layout, slots, allocate_locked(slots * layout.slot_bytes()));
  // oneTBB starts hardware_concurrency - 1 workers unless told otherwise; the arena's threads are
  // all workers (no caller joins it), as in the training pipeline.
  oneapi::tbb::global_control parallelism(oneapi::tbb::global_control::max_allowed_parallelism,
                                          cpus.size() + 1);
  affinity::PinnedArena arena(topology, cpus, "loader");
  auto stage = start_loaders(arena.arena(), static_cast<int>(cpus.size()), ring, d, sampler, aug,
                             {0, 1, 2}, 0, std::uint64_t{1} << 40, SlotState::ready);
  std::uint64_t b = 0;
  const auto drain = [&](std::uint64_t until) {
    for (; b < until; ++b) ring.release(*ring.acquire_ready(b));
  };
  drain(slots);
  std::uint64_t images = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (seconds_since(t0) < seconds) {
    drain(b + 1);
    images += batch;
  }
  const double elapsed = seconds_since(t0);
  ring.close();
  stage->wait();
  return static_cast<double>(images) / elapsed;
}

double decode_loop(const ImageFolder& folder, const ImageGeometry& g, double seconds) {
  ImageDecoder decoder;
  std::vector<std::uint8_t> out(static_cast<std::size_t>(3 * g.size * g.size));
  for (std::size_t i = 0; i < std::min<std::size_t>(folder.files.size(), 32); ++i)
    decoder.decode(folder.files[i], g, {}, out.data()); // warm-up: buffers grown, files cached
  std::size_t images = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (seconds_since(t0) < seconds) {
    decoder.decode(folder.files[images % folder.files.size()], g, {}, out.data());
    ++images;
  }
  return static_cast<double>(images) / seconds_since(t0);
}

// Images/s of ImageDecoder alone on one pinned core: read, decode, centre crop to uint8 CHW. On
// a thread of its own, so that the caller's affinity is left as it was.
double decode_rate(const affinity::Topology& topology, const affinity::CpuList& cpus,
                   const ImageFolder& folder, const ImageGeometry& g, double seconds) {
  double rate = 0;
  std::exception_ptr error;
  std::thread([&] {
    try {
      affinity::pin_this_thread(topology, {cpus[0]}, "kd-decode");
      rate = decode_loop(folder, g, seconds);
    } catch (...) {
      error = std::current_exception();
    }
  }).join();
  if (error) std::rethrow_exception(error);
  return rate;
}

double median_of(int reps, const std::function<double()>& rate) {
  std::vector<double> r;
  for (int i = 0; i < reps; ++i) r.push_back(rate());
  std::sort(r.begin(), r.end());
  return r[r.size() / 2];
}

} // namespace
} // namespace kdflow::bench

int main(int argc, char** argv) {
  using namespace kdflow;
  using namespace kdflow::bench;
  try {
    const Args args = parse(argc, argv);
    const auto topology = affinity::Topology::load();
    const affinity::CpuList allowed = topology.allowed_cpus();
    nlohmann::json result = {{"benchmark", "loader"},
                             {"cpus", allowed.size()},
                             {"batch", args.batch},
                             {"seconds_per_window", args.seconds},
                             {"repetitions", args.reps}};

    const auto sweep = [&](const Dataset& d, const AugmentConfig& aug) {
      nlohmann::json rows = nlohmann::json::array();
      for (std::size_t n = 1; n <= allowed.size(); ++n) {
        const affinity::CpuList cpus(allowed.begin(), allowed.begin() + static_cast<long>(n));
        const double rate = median_of(args.reps, [&] {
          return loader_rate(topology, cpus, d, aug, args.batch, args.seconds);
        });
        rows.push_back({{"cores", n}, {"images_per_s", rate}, {"images_per_s_per_core", rate / n}});
        std::fprintf(stderr, "%s: %zu core(s): %.0f images/s\n", d.source().c_str(), n, rate);
      }
      return rows;
    };

    const Dataset fmnist = Dataset::load("fashion-mnist", args.fmnist, Split::train);
    AugmentConfig fa;
    fa.pad_crop = 4;
    fa.hflip = true;
    fa.mean = {0.2860f};
    fa.std = {0.3530f};
    result["fashion_mnist"] = {{"augment", "pad_crop 4, hflip, normalize to float32"},
                               {"image", "1x28x28"},
                               {"loader", sweep(fmnist, fa)}};

    if (!args.folder.empty()) {
      const Dataset folder = Dataset::load("folder", args.folder, Split::train, args.geometry);
      AugmentConfig ja;
      ja.hflip = true;
      ja.mean = {0.485f, 0.456f, 0.406f};
      ja.std = {0.229f, 0.224f, 0.225f};
      const ImageFolder listing = list_image_folder(args.folder + "/train");
      const double decode = median_of(args.reps, [&] {
        return decode_rate(topology, allowed, listing, args.geometry, args.seconds);
      });
      result["jpeg_folder"] = {
          {"root", args.folder},
          {"images", folder.size()},
          {"size", args.geometry.size},
          {"resize", args.geometry.resize},
          {"augment", "resize shorter side, random crop, hflip, normalize to float32"},
          {"decode_only_1_core",
           {{"images_per_s", decode}, {"what", "read, decode, centre crop, uint8 CHW"}}},
          {"loader", sweep(folder, ja)}};
    }
    if (!args.recipe_folder.empty()) {
      ImageGeometry g = args.geometry;
      g.random_resized = true;
      const Dataset folder = Dataset::load("folder", args.recipe_folder, Split::train, g);
      AugmentConfig ra;
      ra.hflip = true;
      ra.mean = {0.485f, 0.456f, 0.406f};
      ra.std = {0.229f, 0.224f, 0.225f};
      nlohmann::json recipes = nlohmann::json::array();
      for (const bool jitter : {false, true}) {
        ra.jitter = jitter ? JitterRanges{0.4f, 0.4f, 0.4f, 0.f} : JitterRanges{};
        recipes.push_back(
            {{"augment", jitter ? "RandomResizedCrop, hflip, ColorJitter(0.4, 0.4, 0.4), normalize"
                                : "RandomResizedCrop, hflip, normalize"},
             {"color_jitter", jitter},
             {"loader", sweep(folder, ra)}});
      }
      // The same recipe (no jitter) with each JPEG decoded whole, as before the region decode:
      // what decoding only the crop's rows and columns gains, in the same run.
      ImageGeometry whole = g;
      whole.region_decode = false;
      ra.jitter = JitterRanges{};
      nlohmann::json& rows = recipes.front()["loader"];
      const nlohmann::json whole_rows =
          sweep(Dataset::load("folder", args.recipe_folder, Split::train, whole), ra);
      for (std::size_t i = 0; i < rows.size(); ++i) {
        const double w = whole_rows[i]["images_per_s"].get<double>();
        rows[i]["whole_decode_images_per_s"] = w;
        rows[i]["region_vs_whole_decode"] = rows[i]["images_per_s"].get<double>() / w;
      }
      result["imagenet_recipe"] = {{"root", args.recipe_folder},
                                   {"images", folder.size()},
                                   {"size", g.size},
                                   {"dct_scaling", g.dct_scaling},
                                   {"recipes", recipes}};
    }
    emit(result, args.json);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kdflow_loader_bench: %s\n", e.what());
    return 2;
  }
}
