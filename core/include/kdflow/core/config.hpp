// The run's configuration: a fixed schema of `section.key` entries, each with a type, a default and
// a rule. Sources apply in order (defaults, then a TOML file, then --set overrides); an unknown key
// or a bad value is an InputError naming the key and where it came from. No torch or oneDNN here.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace kdflow {

// One row of a `tables` key: every field of the key's row schema, by its leaf name (a field is
// any type but tables).
using ConfigField = std::variant<bool, std::int64_t, double, std::string, std::vector<std::string>>;
using ConfigRow = std::map<std::string, ConfigField, std::less<>>;

using ConfigValue = std::variant<bool, std::int64_t, double, std::string, std::vector<std::string>,
                                 std::vector<ConfigRow>>;

// strings: a TOML array of strings (`key = ["a", "b"]`; with --set, the same inline array, one
// bare or quoted string for a list of one, or nothing for none). tables: an array of tables
// (`[[section.key]]` blocks, or `key = [{a = 1}, ...]` inline; --set takes the inline array), each
// row's fields checked against ConfigKey::fields, the missing ones at their defaults.
enum class ConfigType { boolean, integer, real, string, strings, tables };

// One entry of the schema. `choices` (strings) or [min, max] (numbers) constrain the value.
struct ConfigKey {
  std::string name; // "section.key"
  ConfigType type;
  ConfigValue default_value;
  std::string doc; // one line, written above the key in the resolved config.toml
  std::vector<std::string> choices = {};
  double min = -1e300;
  double max = 1e300;
  std::vector<ConfigKey> fields = {}; // tables: each row's fields (leaf names), no tables
  bool required = false;              // a table's field every row must give (no default)
};

// Every key kdflow knows, in the order the resolved file lists them. Keys whose values name a
// module's registry entry (student.arch) leave their choices to the app, which knows the modules.
const std::vector<ConfigKey>& config_schema();

class Config {
public:
  // All keys of `schema` (which must outlive the Config) at their defaults.
  explicit Config(const std::vector<ConfigKey>& schema = config_schema());

  // Applies a TOML file on top of the current values; `path` names the file in errors.
  void merge_file(const std::filesystem::path& path);
  // Applies TOML text (for tests and embedded defaults); `origin` names it in errors.
  void merge_toml(std::string_view text, const std::string& origin);
  // Applies one `section.key=value` override (the --set syntax). Strings may be quoted or bare.
  void set(std::string_view assignment);

  [[nodiscard]] bool get_bool(std::string_view key) const;
  [[nodiscard]] std::int64_t get_int(std::string_view key) const;
  [[nodiscard]] double get_double(std::string_view key) const;
  [[nodiscard]] const std::string& get_string(std::string_view key) const;
  [[nodiscard]] const std::vector<std::string>& get_strings(std::string_view key) const;
  [[nodiscard]] const std::vector<ConfigRow>& get_tables(std::string_view key) const;
  // A key's value as text for messages and records ("[a, b]" for a list, rows as inline tables).
  [[nodiscard]] std::string text(std::string_view key) const;

  // The resolved configuration as TOML, every key written out with its doc comment.
  [[nodiscard]] std::string to_toml() const;
  // The schema this configuration follows.
  [[nodiscard]] const std::vector<ConfigKey>& schema() const { return *schema_; }

private:
  const ConfigValue& value_of(std::string_view key, ConfigType type) const;
  void assign(const ConfigKey& key, ConfigValue value, const std::string& origin);

  const std::vector<ConfigKey>* schema_;
  std::map<std::string, ConfigValue, std::less<>> values_;
};

} // namespace kdflow
