// Config: applies defaults, TOML files and --set overrides through one schema, so that every source
// is checked the same way and the resolved file always lists every key.
#include "kdflow/core/config.hpp"

#include "kdflow/core/error.hpp"
#include "kdflow/core/input_file.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <toml++/toml.h>

namespace kdflow {
namespace {

// Whether `s` is well-formed UTF-8 (RFC 3629: no overlong forms, surrogates or code points past
// U+10FFFF).
bool is_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const std::size_t n = c < 0x80           ? 1
                          : (c >> 5) == 0x6  ? 2
                          : (c >> 4) == 0xe  ? 3
                          : (c >> 3) == 0x1e ? 4
                                             : 0;
    if (n == 0 || i + n > s.size()) return false;
    std::uint32_t cp = n == 1 ? c : c & (0x7f >> n);
    for (std::size_t k = 1; k < n; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc >> 6) != 0x2) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    static constexpr std::uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n;
  }
  return true;
}

const ConfigKey* find_key(const std::vector<ConfigKey>& schema, std::string_view name) {
  const auto it = std::find_if(schema.begin(), schema.end(),
                               [&](const ConfigKey& k) { return k.name == name; });
  return it == schema.end() ? nullptr : &*it;
}

const char* type_name(ConfigType type) {
  switch (type) {
  case ConfigType::boolean: return "a boolean";
  case ConfigType::integer: return "an integer";
  case ConfigType::real: return "a number";
  case ConfigType::string: return "a string";
  case ConfigType::strings: return "an array of strings";
  case ConfigType::tables: return "an array of tables";
  }
  return "?";
}

ConfigValue widen(const ConfigField& v) {
  return std::visit([](const auto& x) { return ConfigValue{x}; }, v);
}

std::string show(const ConfigValue& v);
std::string toml_quote(const std::string& s);
std::string toml_real(double v);

// A list of strings as TOML writes it: each quoted, so that ["a, b"] and ["a", "b"] differ.
std::string strings_text(const std::vector<std::string>& list) {
  std::vector<std::string> quoted;
  for (const auto& s : list) quoted.push_back(toml_quote(s));
  return fmt::format("[{}]", fmt::join(quoted, ", "));
}

// A scalar as TOML writes it (a string quoted, a real with its point).
std::string toml_text(const ConfigValue& v) {
  if (const auto* s = std::get_if<std::string>(&v)) return toml_quote(*s);
  if (const auto* d = std::get_if<double>(&v)) return toml_real(*d);
  return show(v);
}

// Rows as an inline TOML array of inline tables, each field's value written by `text`.
template <typename Text>
std::string rows_text(const std::vector<ConfigRow>& rows, Text text) {
  std::vector<std::string> out;
  for (const auto& row : rows) {
    std::vector<std::string> fields;
    for (const auto& [name, value] : row)
      fields.push_back(fmt::format("{} = {}", name, text(widen(value))));
    out.push_back(fmt::format("{{{}}}", fmt::join(fields, ", ")));
  }
  return fmt::format("[{}]", fmt::join(out, ", "));
}

std::string show(const ConfigValue& v) {
  return std::visit(
      [](const auto& x) -> std::string {
        using X = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<X, bool>)
          return x ? "true" : "false";
        else if constexpr (std::is_same_v<X, std::string>)
          return x;
        else if constexpr (std::is_same_v<X, std::vector<std::string>>)
          return strings_text(x);
        else if constexpr (std::is_same_v<X, std::vector<ConfigRow>>)
          return rows_text(x, toml_text);
        else
          return fmt::format("{}", x);
      },
      v);
}

std::string toml_quote(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
    case '"': out += "\\\""; break;
    case '\\': out += "\\\\"; break;
    case '\n': out += "\\n"; break;
    case '\t': out += "\\t"; break;
    default:
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) // TOML's control characters
        out += fmt::format("\\u{:04x}", int(c));
      else
        out += c;
    }
  }
  return out + "\"";
}

// Shortest round-trip text of a double that TOML reads back as a float (never "4", always "4.0").
std::string toml_real(double v) {
  std::string text = fmt::format("{}", v);
  if (text.find_first_of(".eEn") == std::string::npos) text += ".0";
  return text;
}

std::optional<ConfigValue> from_node(const ConfigKey& key, const toml::node& node);
std::optional<toml::table> inline_value(std::string_view text);

// A --set string: bare, or in matching single or double quotes.
std::string unquoted(std::string_view text) {
  if (text.size() >= 2 && (text.front() == '"' || text.front() == '\'') &&
      text.back() == text.front())
    text = text.substr(1, text.size() - 2);
  return std::string(text);
}

// Parses the text of a --set value as the key's type; nullopt when it does not read as one.
std::optional<ConfigValue> parse_text(const ConfigKey& key, std::string_view text) {
  switch (key.type) {
  case ConfigType::boolean:
    if (text == "true") return ConfigValue{true};
    if (text == "false") return ConfigValue{false};
    return std::nullopt;
  case ConfigType::integer: {
    std::int64_t v = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc{} || end != text.data() + text.size()) return std::nullopt;
    return ConfigValue{v};
  }
  case ConfigType::real: {
    double v = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc{} || end != text.data() + text.size() || !std::isfinite(v))
      return std::nullopt;
    return ConfigValue{v};
  }
  case ConfigType::string: return ConfigValue{unquoted(text)};
  case ConfigType::strings: {
    if (text.empty()) return ConfigValue{std::vector<std::string>{}};
    if (text.front() != '[') return ConfigValue{std::vector<std::string>{unquoted(text)}};
    // An inline TOML array, read by the TOML parser as a file's would be.
    const auto t = inline_value(text);
    return t ? from_node(key, *t->get("v")) : std::nullopt;
  }
  case ConfigType::tables: return std::nullopt; // Config::set reads them with rows_of()
  }
  return std::nullopt;
}

std::optional<ConfigValue> from_node(const ConfigKey& key, const toml::node& node) {
  switch (key.type) {
  case ConfigType::boolean:
    if (auto v = node.value_exact<bool>()) return ConfigValue{*v};
    return std::nullopt;
  case ConfigType::integer:
    if (auto v = node.value_exact<std::int64_t>()) return ConfigValue{*v};
    return std::nullopt;
  case ConfigType::real:
    if (auto v = node.value_exact<double>()) return ConfigValue{*v};
    if (auto v = node.value_exact<std::int64_t>()) return ConfigValue{static_cast<double>(*v)};
    return std::nullopt;
  case ConfigType::string:
    if (auto v = node.value_exact<std::string>()) return ConfigValue{*v};
    return std::nullopt;
  case ConfigType::strings: {
    const auto* array = node.as_array();
    if (array == nullptr) return std::nullopt;
    std::vector<std::string> out;
    for (const auto& element : *array) {
      auto v = element.value_exact<std::string>();
      if (!v) return std::nullopt;
      out.push_back(std::move(*v));
    }
    return ConfigValue{std::move(out)};
  }
  case ConfigType::tables: return std::nullopt; // rows_of(), which names the row and field
  }
  return std::nullopt;
}

// `value` against `key`'s rules (UTF-8 text, choices, range); `name` is what the error calls it.
void check_value(const ConfigKey& key, const ConfigValue& value, const std::string& origin,
                 const std::string& name) {
  // The resolved config.toml must read back: TOML text is UTF-8, whatever --set was given.
  const auto not_utf8 = [&] {
    return InputError(fmt::format("{}: key '{}' is not valid UTF-8 text", origin, name));
  };
  if (const auto* s = std::get_if<std::string>(&value); s != nullptr && !is_utf8(*s))
    throw not_utf8();
  if (const auto* list = std::get_if<std::vector<std::string>>(&value); list != nullptr)
    for (const auto& s : *list)
      if (!is_utf8(s)) throw not_utf8();
  if (!key.choices.empty()) {
    const auto& s = std::get<std::string>(value);
    if (std::find(key.choices.begin(), key.choices.end(), s) == key.choices.end())
      throw InputError(fmt::format("{}: key '{}' = '{}' is not one of: {}", origin, name, s,
                                   fmt::join(key.choices, ", ")));
  }
  if (key.type == ConfigType::integer || key.type == ConfigType::real) {
    const double v = key.type == ConfigType::integer
                         ? static_cast<double>(std::get<std::int64_t>(value))
                         : std::get<double>(value);
    if (!(v >= key.min && v <= key.max)) // NaN too: it compares false with every bound
      throw InputError(fmt::format("{}: key '{}' = {} is outside [{}, {}]", origin, name,
                                   show(value), key.min, key.max));
  }
}

ConfigField narrow(const ConfigValue& v) {
  return std::visit(
      [](const auto& x) -> ConfigField {
        using X = std::decay_t<decltype(x)>;
        if constexpr (std::is_constructible_v<ConfigField, X>)
          return x;
        else
          throw std::logic_error("config: a table field holds tables");
      },
      v);
}

// A tables key's rows from a TOML array of tables, every field checked as a key is, the missing
// ones at their defaults; InputError naming the row ("kd.features[2]") and the field.
std::vector<ConfigRow> rows_of(const ConfigKey& key, const toml::node& node,
                               const std::string& origin) {
  const auto* array = node.as_array();
  if (array == nullptr)
    throw InputError(fmt::format("{}: key '{}' must be an array of tables ([[{}]] blocks)", origin,
                                 key.name, key.name));
  std::vector<std::string> names;
  for (const auto& field : key.fields) names.push_back(field.name);
  std::vector<ConfigRow> rows;
  for (std::size_t i = 0; i < array->size(); ++i) {
    const std::string row_name = fmt::format("{}[{}]", key.name, i + 1);
    const auto* table = array->get(i)->as_table();
    if (table == nullptr) throw InputError(fmt::format("{}: {} must be a table", origin, row_name));
    ConfigRow row;
    for (const auto& field : key.fields) row.emplace(field.name, narrow(field.default_value));
    for (const auto& [leaf, value] : *table) {
      const std::string name = fmt::format("{}.{}", row_name, leaf.str());
      const auto field = std::find(names.begin(), names.end(), leaf.str());
      if (field == names.end())
        throw InputError(fmt::format("{}: unknown key '{}' (a row has {})", origin, name,
                                     fmt::join(names, ", ")));
      const ConfigKey& rule = key.fields[static_cast<std::size_t>(field - names.begin())];
      const auto parsed = from_node(rule, value);
      if (!parsed)
        throw InputError(
            fmt::format("{}: key '{}' must be {}", origin, name, type_name(rule.type)));
      check_value(rule, *parsed, origin, name);
      row[rule.name] = narrow(*parsed);
    }
    for (const auto& field : key.fields)
      if (field.required && !table->contains(field.name))
        throw InputError(fmt::format("{}: {}.{} is missing (every row names its {})", origin,
                                     row_name, field.name, field.name));
    rows.push_back(std::move(row));
  }
  return rows;
}

// The value of an inline TOML text (a --set value) as the TOML parser reads it in a file.
std::optional<toml::table> inline_value(std::string_view text) {
  try {
    const std::string doc = fmt::format("v = {}", text);
    toml::table t = toml::parse(std::string_view(doc), std::string_view("--set"));
    if (t.size() != 1 || t.get("v") == nullptr) return std::nullopt;
    return t;
  } catch (const toml::parse_error&) {
    return std::nullopt;
  }
}

} // namespace

Config::Config(const std::vector<ConfigKey>& schema) : schema_(&schema) {
  for (const auto& key : schema) values_.emplace(key.name, key.default_value);
}

void Config::assign(const ConfigKey& key, ConfigValue value, const std::string& origin) {
  check_value(key, value, origin, key.name);
  values_[key.name] = std::move(value);
}

void Config::merge_toml(std::string_view text, const std::string& origin) {
  toml::table root;
  try {
    root = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    throw InputError(fmt::format("{}:{}:{}: TOML syntax error: {}", origin, e.source().begin.line,
                                 e.source().begin.column, e.description()));
  }
  // One section's keys (a [section] table, or the first of [[section]] blocks).
  const auto merge_section = [&](std::string_view section, const toml::table& table) {
    for (const auto& [leaf, value] : table) {
      const std::string name = fmt::format("{}.{}", section, leaf.str());
      const ConfigKey* key = find_key(*schema_, name);
      if (key == nullptr) throw InputError(fmt::format("{}: unknown key '{}'", origin, name));
      if (key->type == ConfigType::tables) {
        assign(*key, rows_of(*key, value, origin), origin);
        continue;
      }
      auto parsed = from_node(*key, value);
      if (!parsed)
        throw InputError(
            fmt::format("{}: key '{}' must be {}", origin, name, type_name(key->type)));
      assign(*key, std::move(*parsed), origin);
    }
  };
  for (const auto& [section, node] : root) {
    // [[teacher]] blocks: the first is the [teacher] section, the others its `others` rows (block
    // k + 1 is teacher.others[k], as messages name it).
    const ConfigKey* others = find_key(*schema_, fmt::format("{}.others", section.str()));
    if (const auto* blocks = node.as_array();
        blocks != nullptr && others != nullptr && others->type == ConfigType::tables) {
      if (blocks->empty() || !blocks->get(0)->is_table())
        throw InputError(fmt::format("{}: [[{}]] must hold tables", origin, section.str()));
      const toml::table& first = *blocks->get(0)->as_table();
      if (first.contains("others"))
        throw InputError(fmt::format("{}: key '{}[1].others': with [[{}]] blocks each block is "
                                     "one (write the others as blocks too)",
                                     origin, section.str(), section.str()));
      merge_section(section.str(), first);
      toml::array rest;
      for (std::size_t i = 1; i < blocks->size(); ++i) rest.push_back(*blocks->get(i));
      assign(*others, rows_of(*others, rest, origin), origin);
      continue;
    }
    const auto* table = node.as_table();
    if (table == nullptr)
      throw InputError(fmt::format("{}: unknown key '{}' (keys live in sections, e.g. [train])",
                                   origin, section.str()));
    merge_section(section.str(), *table);
  }
}

void Config::merge_file(const std::filesystem::path& path) {
  check_input_file(path, "config file", std::uint64_t{16} << 20);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("{}: cannot read the config file", path.string()));
  std::ostringstream text;
  text << in.rdbuf();
  merge_toml(text.str(), path.string());
}

void Config::set(std::string_view assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string_view::npos || eq == 0)
    throw InputError(
        fmt::format("--set {}: expected section.key=value", toml_quote(std::string(assignment))));
  const std::string_view name = assignment.substr(0, eq);
  const ConfigKey* key = find_key(*schema_, name);
  if (key == nullptr)
    throw InputError(fmt::format("--set: unknown key {}", toml_quote(std::string(name))));
  if (key->type == ConfigType::tables) {
    const std::string_view text = assignment.substr(eq + 1);
    const auto t = text.empty() ? std::optional<toml::table>() : inline_value(text);
    if (!text.empty() && !t)
      throw InputError(fmt::format("--set: key '{}' must be an inline array of tables, e.g. "
                                   "[{{a = 1}}], got {}",
                                   name, toml_quote(std::string(text))));
    assign(*key, t ? rows_of(*key, *t->get("v"), "--set") : std::vector<ConfigRow>{}, "--set");
    return;
  }
  auto parsed = parse_text(*key, assignment.substr(eq + 1));
  if (!parsed)
    throw InputError(fmt::format("--set: key '{}' must be {}, got {}", name, type_name(key->type),
                                 toml_quote(std::string(assignment.substr(eq + 1)))));
  assign(*key, std::move(*parsed), "--set");
}

const ConfigValue& Config::value_of(std::string_view key, ConfigType type) const {
  const ConfigKey* k = find_key(*schema_, key);
  // Asking for a key the schema lacks, or with the wrong type, is a bug in kdflow, not user input.
  if (k == nullptr || k->type != type)
    throw std::logic_error(fmt::format("config key '{}' read as {}", key, type_name(type)));
  return values_.find(key)->second;
}

bool Config::get_bool(std::string_view key) const {
  return std::get<bool>(value_of(key, ConfigType::boolean));
}
std::int64_t Config::get_int(std::string_view key) const {
  return std::get<std::int64_t>(value_of(key, ConfigType::integer));
}
double Config::get_double(std::string_view key) const {
  return std::get<double>(value_of(key, ConfigType::real));
}
const std::string& Config::get_string(std::string_view key) const {
  return std::get<std::string>(value_of(key, ConfigType::string));
}
const std::vector<std::string>& Config::get_strings(std::string_view key) const {
  return std::get<std::vector<std::string>>(value_of(key, ConfigType::strings));
}
const std::vector<ConfigRow>& Config::get_tables(std::string_view key) const {
  return std::get<std::vector<ConfigRow>>(value_of(key, ConfigType::tables));
}
std::string Config::text(std::string_view key) const {
  const ConfigKey* k = find_key(*schema_, key);
  if (k == nullptr)
    throw std::logic_error(fmt::format("config key '{}' is not in the schema", key));
  return show(values_.find(key)->second);
}

std::string Config::to_toml() const {
  std::string out = "# kdflow resolved configuration: every key, defaults written out.\n";
  std::string section;
  for (const auto& key : *schema_) {
    const auto dot = key.name.find('.');
    const std::string sec = key.name.substr(0, dot);
    if (sec != section) {
      section = sec;
      out += fmt::format("\n[{}]\n", section);
    }
    const ConfigValue& v = values_.find(key.name)->second;
    std::string text;
    if (key.type == ConfigType::string) {
      text = toml_quote(std::get<std::string>(v));
    } else if (key.type == ConfigType::strings) {
      text = strings_text(std::get<std::vector<std::string>>(v));
    } else if (key.type == ConfigType::real) {
      text = toml_real(std::get<double>(v));
    } else if (key.type == ConfigType::tables) {
      text = rows_text(std::get<std::vector<ConfigRow>>(v), toml_text);
    } else {
      text = show(v);
    }
    out += fmt::format("# {}\n{} = {}\n", key.doc, key.name.substr(dot + 1), text);
  }
  return out;
}

} // namespace kdflow
