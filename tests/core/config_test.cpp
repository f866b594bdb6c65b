// Config: defaults, TOML files, --set overrides, and every kind of bad input naming its key; and
// torchrun's environment (dist_env), read the same way.
#include "kdflow/core/config.hpp"
#include "kdflow/core/dataset.hpp"
#include "kdflow/core/dist_env.hpp"
#include "kdflow/core/error.hpp"

#include "input_error.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

namespace kdflow {
namespace {

// Expects an InputError whose message contains every `needle`.
template <typename F>
void expect_input_error(F&& f, std::initializer_list<std::string> needles) {
  try {
    f();
    ADD_FAILURE() << "no InputError";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "error must be one line: " << msg;
  }
}

TEST(Config, EveryKeyHasADefaultOfItsType) {
  Config c;
  for (const auto& key : config_schema()) {
    ASSERT_EQ(key.name.find('.'), key.name.rfind('.')) << key.name;
    switch (key.type) {
    case ConfigType::boolean: (void)c.get_bool(key.name); break;
    case ConfigType::integer: (void)c.get_int(key.name); break;
    case ConfigType::real: (void)c.get_double(key.name); break;
    case ConfigType::string: (void)c.get_string(key.name); break;
    case ConfigType::strings: (void)c.get_strings(key.name); break;
    case ConfigType::tables: (void)c.get_tables(key.name); break;
    }
  }
  EXPECT_EQ(c.get_string("data.dataset"), "fashion-mnist");
  EXPECT_EQ(c.get_string("student.device"), "auto");
}

// data.dataset's choices are the dataset registry's names; a Config checks against the schema it
// was given (the app's adds the student registry's names to student.arch).
TEST(Config, ChoicesComeFromTheRegistryAndTheGivenSchema) {
  const auto key = [](auto& schema, const std::string& name) {
    return std::find_if(schema.begin(), schema.end(),
                        [&](const ConfigKey& k) { return k.name == name; });
  };
  EXPECT_EQ(key(config_schema(), "data.dataset")->choices, dataset_names());
  std::vector<ConfigKey> narrowed = config_schema();
  key(narrowed, "student.arch")->choices = {"mlp"};
  Config c(narrowed);
  EXPECT_EQ(&c.schema(), &narrowed);
  c.set("student.arch=mlp");
  expect_input_error([&] { c.set("student.arch=resnet18"); }, {"student.arch", "resnet18", "mlp"});
}

TEST(Config, FileThenSetOverride) {
  Config c;
  c.merge_toml("[kd]\nalpha = 0.5\ntemperature = 2\n[train]\nepochs = 3\n", "test.toml");
  EXPECT_DOUBLE_EQ(c.get_double("kd.alpha"), 0.5);
  EXPECT_DOUBLE_EQ(c.get_double("kd.temperature"), 2.0); // an integer is accepted for a number
  EXPECT_EQ(c.get_int("train.epochs"), 3);
  c.set("train.epochs=7");
  c.set("student.arch=\"mlp\"");
  c.set("data.path=/tmp/some where");
  EXPECT_EQ(c.get_int("train.epochs"), 7);
  EXPECT_EQ(c.get_string("student.arch"), "mlp");
  EXPECT_EQ(c.get_string("data.path"), "/tmp/some where");
}

TEST(Config, ResolvedTomlRoundTrips) {
  Config a;
  a.set("kd.alpha=0.25");
  a.set("data.path=/odd \"quoted\\path\"");
  a.set("train.lr=1e-7");
  Config b;
  b.merge_toml(a.to_toml(), "resolved");
  EXPECT_EQ(a.to_toml(), b.to_toml());
  EXPECT_EQ(b.get_string("data.path"), "/odd \"quoted\\path\"");
  EXPECT_DOUBLE_EQ(b.get_double("train.lr"), 1e-7);
  EXPECT_NE(a.to_toml().find("temperature = 4.0"), std::string::npos) << a.to_toml();
}

// teacher.features is an array of strings: from a file, from --set (an inline array, one name,
// or nothing), written out and read back.
TEST(Config, AnArrayOfStringsFromAFileAndFromSet) {
  Config c;
  EXPECT_TRUE(c.get_strings("teacher.features").empty());
  c.merge_toml("[teacher]\nfeatures = [\"/layer1/Relu_output_0\", \"x \\\"y\\\"\"]\n", "f.toml");
  EXPECT_EQ(c.get_strings("teacher.features"),
            (std::vector<std::string>{"/layer1/Relu_output_0", "x \"y\""}));
  Config b;
  b.merge_toml(c.to_toml(), "resolved");
  EXPECT_EQ(b.get_strings("teacher.features"), c.get_strings("teacher.features"));
  EXPECT_EQ(c.to_toml(), b.to_toml());
  c.set("teacher.features=[\"a\", 'b']");
  EXPECT_EQ(c.get_strings("teacher.features"), (std::vector<std::string>{"a", "b"}));
  const std::string two = c.text("teacher.features");
  c.set("teacher.features=[\"a, b\"]");
  EXPECT_NE(c.text("teacher.features"), two) << "the record tells one name from two";
  c.set("teacher.features=/stage2/Add_output_0");
  EXPECT_EQ(c.get_strings("teacher.features"), (std::vector<std::string>{"/stage2/Add_output_0"}));
  c.set("teacher.features=");
  EXPECT_TRUE(c.get_strings("teacher.features").empty());
  expect_input_error([&] { c.merge_toml("[teacher]\nfeatures = \"a\"\n", "f.toml"); },
                     {"f.toml", "teacher.features", "array of strings"});
  expect_input_error([&] { c.merge_toml("[teacher]\nfeatures = [\"a\", 1]\n", "f.toml"); },
                     {"teacher.features", "array of strings"});
  expect_input_error([&] { c.set("teacher.features=[\"a\""); }, {"teacher.features"});
  expect_input_error([&] { c.set("teacher.features=[\"a\"]\nx = 1"); }, {"teacher.features"});
  EXPECT_TRUE(c.get_strings("teacher.features").empty());
}

// kd.features is an array of tables: [[kd.features]] blocks or an inline array, from a file or
// --set, each row's fields checked as keys are and the missing ones at their defaults; the
// resolved file reads back.
TEST(Config, AnArrayOfTablesFromBlocksInlineAndSet) {
  Config c;
  EXPECT_TRUE(c.get_tables("kd.features").empty());
  c.merge_toml("[kd]\nalpha = 0.5\n[[kd.features]]\nteacher = \"/a/Relu_output_0\"\n"
               "student = \"stage2\"\n[[kd.features]]\nteacher = \"b\"\nstudent = "
               "\"penultimate\"\nloss = \"sp\"\nweight = 3\n",
               "f.toml");
  const auto& rows = c.get_tables("kd.features");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(std::get<std::string>(rows[0].at("teacher")), "/a/Relu_output_0");
  EXPECT_EQ(std::get<std::string>(rows[0].at("loss")), "hint") << "the default";
  EXPECT_DOUBLE_EQ(std::get<double>(rows[0].at("weight")), 1.0);
  EXPECT_EQ(std::get<std::string>(rows[1].at("loss")), "sp");
  EXPECT_DOUBLE_EQ(std::get<double>(rows[1].at("weight")), 3.0);
  Config b;
  b.merge_toml(c.to_toml(), "resolved");
  EXPECT_EQ(b.to_toml(), c.to_toml());
  EXPECT_EQ(b.get_tables("kd.features"), rows);
  EXPECT_NE(c.text("kd.features").find("student = \"stage2\""), std::string::npos)
      << c.text("kd.features");
  c.set("kd.features=[{teacher = \"x\", student = \"stage1\", loss = \"at\", weight = 0.5}]");
  ASSERT_EQ(c.get_tables("kd.features").size(), 1u);
  EXPECT_EQ(std::get<std::string>(c.get_tables("kd.features")[0].at("loss")), "at");
  c.set("kd.features=");
  EXPECT_TRUE(c.get_tables("kd.features").empty());
  // (A loss no table row names is refused by the app's schema, which takes the choices from the
  // student's loss table: RunSchema.LossChoicesAndParameterKeysComeFromTheLossTables.)
  expect_input_error(
      [&] {
        c.merge_toml("[[kd.features]]\nteacher = \"a\"\nstudent = \"b\"\n[[kd.features]]\n"
                     "wieght = 1.0\n",
                     "f.toml");
      },
      {"kd.features[2].wieght", "unknown"});
  // A row names its teacher's value and its student's tap (the rest have defaults).
  expect_input_error([&] { c.merge_toml("[[kd.features]]\nteacher = \"a\"\n", "f.toml"); },
                     {"f.toml", "kd.features[1].student is missing"});
  expect_input_error([&] { c.merge_toml("[[kd.features]]\nweight = -1.0\n", "f.toml"); },
                     {"kd.features[1].weight", "outside"});
  expect_input_error([&] { c.merge_toml("[[kd.features]]\nweight = \"big\"\n", "f.toml"); },
                     {"kd.features[1].weight", "a number"});
  expect_input_error([&] { c.merge_toml("[kd]\nfeatures = \"a\"\n", "f.toml"); },
                     {"kd.features", "array of tables"});
  expect_input_error([&] { c.set("kd.features=[{teacher = 1}]"); },
                     {"--set", "kd.features[1].teacher"});
  expect_input_error([&] { c.set("kd.features={teacher = \"a\"}"); }, {"--set", "kd.features"});
  expect_input_error([&] { c.set("kd.features=[{"); }, {"--set", "kd.features"});
  EXPECT_TRUE(c.get_tables("kd.features").empty());
}

// Several teachers: [[teacher]] blocks are [teacher] (the first) and its teacher.others rows, the
// same as writing those; the resolved file reads back the same.
TEST(Config, TeacherBlocksAreTheTeacherAndItsOthers) {
  Config blocks;
  blocks.merge_toml("[[teacher]]\nmodel = \"a.onnx\"\nweight = 2\nfeatures = [\"v\"]\n"
                    "[[teacher]]\nmodel = \"b.onnx\"\nprecision = \"bf16\"\nweight = 0.5\n"
                    "features = [\"w\", \"x y\"]\n"
                    "[[teacher]]\nmodel = \"c.onnx\"\ninput_size = \"32\"\n",
                    "f.toml");
  EXPECT_EQ(blocks.get_string("teacher.model"), "a.onnx");
  EXPECT_DOUBLE_EQ(blocks.get_double("teacher.weight"), 2.0);
  EXPECT_EQ(blocks.get_strings("teacher.features"), std::vector<std::string>{"v"});
  const auto& rows = blocks.get_tables("teacher.others");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(std::get<std::string>(rows[0].at("model")), "b.onnx");
  EXPECT_EQ(std::get<std::string>(rows[0].at("precision")), "bf16");
  EXPECT_DOUBLE_EQ(std::get<double>(rows[0].at("weight")), 0.5);
  EXPECT_EQ(std::get<std::string>(rows[1].at("input_size")), "32");
  EXPECT_EQ(std::get<std::vector<std::string>>(rows[0].at("features")),
            (std::vector<std::string>{"w", "x y"}));
  EXPECT_DOUBLE_EQ(std::get<double>(rows[1].at("weight")), 1.0) << "the default";
  EXPECT_TRUE(std::get<std::vector<std::string>>(rows[1].at("features")).empty());
  Config sections;
  sections.merge_toml("[teacher]\nmodel = \"a.onnx\"\nweight = 2\nfeatures = [\"v\"]\n"
                      "[[teacher.others]]\nmodel = \"b.onnx\"\nprecision = \"bf16\"\n"
                      "weight = 0.5\nfeatures = [\"w\", \"x y\"]\n"
                      "[[teacher.others]]\nmodel = \"c.onnx\"\n"
                      "input_size = \"32\"\n",
                      "g.toml");
  EXPECT_EQ(sections.to_toml(), blocks.to_toml());
  Config resolved;
  resolved.merge_toml(blocks.to_toml(), "resolved");
  EXPECT_EQ(resolved.to_toml(), blocks.to_toml());
  Config one;
  one.merge_toml("[[teacher]]\nmodel = \"a.onnx\"\n", "f.toml"); // one block: one teacher
  EXPECT_TRUE(one.get_tables("teacher.others").empty());
  one.set("teacher.others=[{model = \"b.onnx\", weight = 3, features = [\"v\"]}]");
  ASSERT_EQ(one.get_tables("teacher.others").size(), 1u);
  EXPECT_EQ(std::get<std::vector<std::string>>(one.get_tables("teacher.others")[0].at("features")),
            std::vector<std::string>{"v"});

  expect_input_error(
      [&] {
        Config c;
        c.merge_toml("[[teacher]]\nmodel = \"a\"\n[[teacher]]\nfeatures = [1]\n", "f.toml");
      },
      {"f.toml", "teacher.others[1].features", "array of strings"});
  expect_input_error(
      [&] {
        Config c;
        c.merge_toml("[[teacher]]\nmodel = \"a\"\n[[teacher]]\nfeature = [\"v\"]\n", "f.toml");
      },
      {"f.toml", "teacher.others[1].feature", "unknown"});
  expect_input_error(
      [&] {
        Config c;
        c.merge_toml("[[teacher]]\nmodel = \"a\"\n[[teacher]]\nweight = 0\n", "f.toml");
      },
      {"teacher.others[1].weight", "outside"});
  expect_input_error(
      [&] {
        Config c;
        c.merge_toml("[[teacher]]\nmodel = \"a\"\n[[teacher.others]]\nmodel = \"b\"\n", "f.toml");
      },
      {"teacher[1].others"});
  expect_input_error([&] { Config().set("teacher.weight=-1"); }, {"teacher.weight"});
}

TEST(Config, BadInputNamesTheKey) {
  Config c;
  expect_input_error([&] { c.merge_toml("[train]\nepoch = 3\n", "f.toml"); },
                     {"f.toml", "train.epoch", "unknown"});
  expect_input_error([&] { c.merge_toml("seed = 3\n", "f.toml"); }, {"f.toml", "seed"});
  expect_input_error([&] { c.merge_toml("[train]\nepochs = \"three\"\n", "f.toml"); },
                     {"train.epochs", "integer"});
  expect_input_error([&] { c.merge_toml("[kd]\nalpha = 1.5\n", "f.toml"); },
                     {"kd.alpha", "outside"});
  // TOML spells NaN and infinity as floats: no range admits them.
  expect_input_error([&] { c.merge_toml("[train]\nlr = nan\n", "f.toml"); },
                     {"f.toml", "train.lr", "outside"});
  expect_input_error([&] { c.merge_toml("[kd]\ntemperature = -nan\n", "f.toml"); },
                     {"kd.temperature"});
  expect_input_error([&] { c.merge_toml("[train]\nlr = inf\n", "f.toml"); }, {"train.lr"});
  expect_input_error([&] { c.merge_toml("[data]\nslot_dtype = \"float16\"\n", "f.toml"); },
                     {"data.slot_dtype", "float16", "float32"});
  expect_input_error([&] { c.merge_toml("[train\nepochs=1", "broken.toml"); }, {"broken.toml:1"});
  expect_input_error([&] { c.set("nope.key=1"); }, {"nope.key"});
  expect_input_error([&] { c.set("train.epochs=1.5"); }, {"train.epochs", "1.5"});
  expect_input_error([&] { c.set("kd.alpha=nan"); }, {"kd.alpha"});
  expect_input_error([&] { c.set("ring.slots=-1"); }, {"ring.slots"});
  expect_input_error([&] { c.set("train.epochs"); }, {"section.key=value"});
  expect_input_error([&] { c.merge_file("/nonexistent/kdflow.toml"); },
                     {"/nonexistent/kdflow.toml"});
  // Nothing of a failed source is half-applied to keys that came before the bad one? It may be;
  // but the values that did apply are valid ones.
  EXPECT_EQ(c.get_int("ring.slots"), 0);
}

TEST(Config, MergeFileReadsAFile) {
  const auto path = std::filesystem::temp_directory_path() / "kdflow_config_test.toml";
  { std::ofstream(path) << "[ring]\nslots = 16\n"; }
  Config c;
  c.merge_file(path);
  EXPECT_EQ(c.get_int("ring.slots"), 16);
  std::filesystem::remove(path);
}

} // namespace
} // namespace kdflow

namespace kdflow {
namespace {

// torchrun's environment, from a table instead of the process's.
std::optional<DistEnv> env_of(const std::map<std::string, std::string>& vars) {
  return dist_env_from([&vars](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

TEST(DistEnv, ReadsTorchrunsVariables) {
  EXPECT_FALSE(env_of({}).has_value()); // a plain run
  const auto env = env_of({{"RANK", "5"},
                           {"WORLD_SIZE", "8"},
                           {"LOCAL_RANK", "1"},
                           {"LOCAL_WORLD_SIZE", "4"},
                           {"GROUP_RANK", "1"},
                           {"MASTER_ADDR", "10.0.0.1"},
                           {"MASTER_PORT", "29500"},
                           {"TORCHELASTIC_USE_AGENT_STORE", "True"}});
  ASSERT_TRUE(env.has_value());
  EXPECT_EQ(env->rank, 5);
  EXPECT_EQ(env->world, 8);
  EXPECT_EQ(env->local_rank, 1);
  EXPECT_EQ(env->local_world, 4);
  EXPECT_EQ(env->node, 1);
  EXPECT_EQ(env->master_addr, "10.0.0.1");
  EXPECT_EQ(env->master_port, 29500);
  EXPECT_TRUE(env->agent_store);
  // One rank (torchrun --nproc-per-node 1): the store's address is kept, for a group of one.
  const auto one = env_of(
      {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29400"}});
  ASSERT_TRUE(one.has_value());
  EXPECT_EQ(one->master_addr, "127.0.0.1");
  EXPECT_EQ(one->master_port, 29400);
  EXPECT_TRUE(env_of({{"RANK", "0"}, {"WORLD_SIZE", "1"}})->master_addr.empty());
}

TEST(DistEnv, BadValuesNameTheVariable) {
  const std::map<std::string, std::string> good = {
      {"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "localhost"}, {"MASTER_PORT", "29500"}};
  const auto with = [&](const std::string& key, const std::string& value) {
    auto vars = good;
    if (value.empty())
      vars.erase(key);
    else
      vars[key] = value;
    return vars;
  };
  const std::pair<std::string, std::string> cases[] = {
      {"RANK", "2"},       {"RANK", "-1"},
      {"RANK", "one"},     {"WORLD_SIZE", "0"},
      {"WORLD_SIZE", ""},  {"MASTER_PORT", "70000"},
      {"MASTER_PORT", ""}, {"MASTER_ADDR", ""},
      {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "3"},
      {"RANK", "1x"}};
  for (const auto& [key, value] : cases) {
    const std::string message = test::error_of([&] { (void)env_of(with(key, value)); });
    EXPECT_NE(message.find(key), std::string::npos) << key << "=" << value << ": " << message;
  }
}

} // namespace
} // namespace kdflow
