// JSON <-> config::Config. The JSON tree is walked against the protobuf
// Descriptor (not handed to JsonStringToMessage) so that every error names the
// dotted field, the expected type and the valid alternatives in our own words.
#include "worker/config.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <limits>
#include <set>
#include <sstream>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dtrain::worker {
namespace {

namespace pb = google::protobuf;
using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;
using CppType = pb::FieldDescriptor::CppType;

std::string dotted(std::string_view prefix, std::string_view name) {
  return prefix.empty() ? std::string(name) : fmt::format("{}.{}", prefix, name);
}

std::string field_names(const pb::Descriptor& message) {
  std::string out;
  for (int i = 0; i < message.field_count(); ++i) {
    out += (i == 0 ? "" : ", ") + message.field(i)->name();
  }
  return out;
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t substitute = diagonal + (a[i - 1] == b[j - 1] ? 0 : 1);
      diagonal = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, substitute});
    }
  }
  return row[b.size()];
}

// "; did you mean d_model?" when one field is within two edits of `name`.
std::string suggestion(std::string_view name, const pb::Descriptor& message) {
  const pb::FieldDescriptor* best = nullptr;
  std::size_t best_distance = 3;
  for (int i = 0; i < message.field_count(); ++i) {
    const std::size_t d = edit_distance(name, message.field(i)->name());
    if (d < best_distance) best = message.field(i), best_distance = d;
  }
  return best == nullptr ? "" : fmt::format("; did you mean {}?", best->name());
}

// `where` says where the value came from: "in run.json", "in --set a.b=1".
[[noreturn]] void throw_unknown(const std::string& path, std::string_view parent,
                                const pb::Descriptor& message, std::string_view where) {
  const std::string_view name = std::string_view(path).substr(path.rfind('.') + 1);
  throw ConfigError(path, fmt::format("unknown field ({}){}; valid fields of {}: {}", where,
                                      suggestion(name, message),
                                      parent.empty() ? "the config" : parent,
                                      field_names(message)));
}

std::string expected_type(const pb::FieldDescriptor& field) {
  switch (field.cpp_type()) {
    case CppType::CPPTYPE_INT32:
    case CppType::CPPTYPE_INT64: return "an integer";
    case CppType::CPPTYPE_UINT32:
    case CppType::CPPTYPE_UINT64: return "a non-negative integer";
    case CppType::CPPTYPE_FLOAT:
    case CppType::CPPTYPE_DOUBLE: return "a number";
    case CppType::CPPTYPE_BOOL: return "true or false";
    case CppType::CPPTYPE_STRING: return "a string";
    case CppType::CPPTYPE_MESSAGE: return fmt::format("an object (the {} section)", field.name());
    case CppType::CPPTYPE_ENUM: break;
  }
  return "a value";
}

[[noreturn]] void throw_type(const std::string& path, std::string_view expected,
                             const Json& value, std::string_view where) {
  std::string text = value.dump();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  throw ConfigError(path, fmt::format("expected {}, got {} {} ({})", expected,
                                      value.type_name(), text, where));
}

// An integral JSON number (1e3 counts) that fits T.
template <typename T>
T to_integer(const Json& value, const pb::FieldDescriptor& field, const std::string& path,
             std::string_view where) {
  constexpr T kMin = std::numeric_limits<T>::min();
  constexpr T kMax = std::numeric_limits<T>::max();
  bool in_range = false;
  T result = 0;
  if (value.is_number_unsigned()) {
    const auto v = value.get<std::uint64_t>();
    in_range = v <= static_cast<std::uint64_t>(kMax);
    result = static_cast<T>(v);
  } else if (value.is_number_integer()) {
    const auto v = value.get<std::int64_t>();
    in_range = std::is_signed_v<T> ? (v >= static_cast<std::int64_t>(kMin) &&
                                      v <= static_cast<std::int64_t>(kMax))
                                   : v >= 0;
    result = static_cast<T>(v);
  } else if (value.is_number_float() && std::isfinite(value.get<double>()) &&
             value.get<double>() == std::trunc(value.get<double>())) {
    const double v = value.get<double>();
    // 2^63 and 2^64 are exact doubles, so `< kMax + 1.0` is an exact bound.
    in_range = v >= static_cast<double>(kMin) && v < static_cast<double>(kMax) + 1.0;
    result = in_range ? static_cast<T>(v) : 0;
  } else {
    throw_type(path, expected_type(field), value, where);
  }
  if (!in_range) {
    throw ConfigError(path, fmt::format("{} is out of range [{}, {}] ({})", value.dump(), kMin,
                                        kMax, where));
  }
  return result;
}

double to_real(const Json& value, const pb::FieldDescriptor& field, const std::string& path,
               std::string_view where, double limit) {
  if (!value.is_number()) throw_type(path, expected_type(field), value, where);
  const double v = value.get<double>();
  if (!std::isfinite(v) || std::fabs(v) > limit) {
    throw ConfigError(path, fmt::format("{} is out of range for a {} ({})", value.dump(),
                                        field.cpp_type_name(), where));
  }
  return v;
}

void fill_message(pb::Message& message, const Json& object, const std::string& path,
                  std::string_view where);

// JSON null clears the field, so an unset field reads back as unset.
void set_field(pb::Message& message, const pb::FieldDescriptor& field, const Json& value,
               const std::string& path, std::string_view where) {
  const pb::Reflection& r = *message.GetReflection();
  DTRAIN_CHECK(!field.is_repeated(), "repeated config field {} is not supported", path);
  if (value.is_null()) {
    r.ClearField(&message, &field);
    return;
  }
  switch (field.cpp_type()) {
    case CppType::CPPTYPE_INT32:
      return r.SetInt32(&message, &field, to_integer<std::int32_t>(value, field, path, where));
    case CppType::CPPTYPE_INT64:
      return r.SetInt64(&message, &field, to_integer<std::int64_t>(value, field, path, where));
    case CppType::CPPTYPE_UINT32:
      return r.SetUInt32(&message, &field, to_integer<std::uint32_t>(value, field, path, where));
    case CppType::CPPTYPE_UINT64:
      return r.SetUInt64(&message, &field, to_integer<std::uint64_t>(value, field, path, where));
    case CppType::CPPTYPE_FLOAT:
      return r.SetFloat(&message, &field,
                        static_cast<float>(to_real(value, field, path, where,
                                                   std::numeric_limits<float>::max())));
    case CppType::CPPTYPE_DOUBLE:
      return r.SetDouble(&message, &field,
                         to_real(value, field, path, where, std::numeric_limits<double>::max()));
    case CppType::CPPTYPE_BOOL:
      if (!value.is_boolean()) throw_type(path, expected_type(field), value, where);
      return r.SetBool(&message, &field, value.get<bool>());
    case CppType::CPPTYPE_STRING:
      if (!value.is_string()) throw_type(path, expected_type(field), value, where);
      return r.SetString(&message, &field, value.get<std::string>());
    case CppType::CPPTYPE_MESSAGE:
      return fill_message(*r.MutableMessage(&message, &field), value, path, where);
    case CppType::CPPTYPE_ENUM: break;
  }
  DTRAIN_CHECK(false, "config field {} has a type the loader does not handle", path);
}

// Merges `object` into `message`: fields it names are replaced, others kept.
void fill_message(pb::Message& message, const Json& object, const std::string& path,
                  std::string_view where) {
  const pb::Descriptor& descriptor = *message.GetDescriptor();
  if (!object.is_object()) {
    throw_type(path.empty() ? "(top level)" : path,
               path.empty() ? "a JSON object" : fmt::format("an object (the {} section)", path),
               object, where);
  }
  for (const auto& [key, value] : object.items()) {
    const std::string field_path = dotted(path, key);
    const pb::FieldDescriptor* field = descriptor.FindFieldByName(key);
    if (field == nullptr) throw_unknown(field_path, path, descriptor, where);
    set_field(message, *field, value, field_path, where);
  }
}

// Parses JSON (// and /* */ comments allowed). A repeated key is an error:
// nlohmann would silently keep the last one.
Json parse_json(std::string_view text, const std::string& source) {
  std::vector<std::pair<std::set<std::string>, std::string>> objects;  // keys seen, current key
  auto reject_duplicates = [&](int, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) {
      objects.emplace_back();
    } else if (event == Json::parse_event_t::object_end && !objects.empty()) {
      objects.pop_back();
    } else if (event == Json::parse_event_t::key && !objects.empty()) {
      auto& [seen, current] = objects.back();
      current = parsed.get<std::string>();
      if (!seen.insert(current).second) {
        std::string path;
        for (const auto& level : objects) path = dotted(path, level.second);
        throw ConfigError(path, fmt::format("appears twice in {}; keep one", source));
      }
    }
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), reject_duplicates, /*allow_exceptions=*/true,
                       /*ignore_comments=*/true);
  } catch (const Json::parse_error& e) {
    std::string_view detail = e.what();  // "[json.exception.parse_error.101] parse error at line 3, ..."
    if (const auto p = detail.find("] "); p != std::string_view::npos) detail.remove_prefix(p + 2);
    throw ConfigError(source, fmt::format("malformed JSON: {}; fix the syntax", detail));
  }
}

// Strings may be written bare (model.kind=lm) or as a JSON string ("lm");
// every other value is a JSON literal.
Json parse_override_value(const pb::FieldDescriptor& field, const std::string& value,
                          const std::string& path, std::string_view where) {
  if (field.cpp_type() == CppType::CPPTYPE_STRING && (value.empty() || value.front() != '"')) {
    return Json(value);
  }
  Json parsed = Json::parse(value, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) {
    throw ConfigError(path, fmt::format("cannot read '{}' as {} ({})", value,
                                        expected_type(field), where));
  }
  return parsed;
}

void apply_override(config::Config& config, const std::string& text) {
  const std::string where = fmt::format("in --set {}", text);
  const std::size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw ConfigError(text, fmt::format("override '{}' is not key.path=value; write e.g. "
                                        "--set train.steps=1000",
                                        text));
  }
  const std::string path = text.substr(0, eq);
  const std::string value = text.substr(eq + 1);
  pb::Message* message = &config;
  std::string prefix;
  for (std::size_t start = 0;;) {
    const std::size_t dot = path.find('.', start);
    const std::string name = path.substr(start, dot == std::string::npos ? dot : dot - start);
    const std::string field_path = dotted(prefix, name);
    const pb::Descriptor& descriptor = *message->GetDescriptor();
    const pb::FieldDescriptor* field = descriptor.FindFieldByName(name);
    if (field == nullptr) throw_unknown(field_path, prefix, descriptor, where);
    if (dot == std::string::npos) {
      return set_field(*message, *field, parse_override_value(*field, value, field_path, where),
                       field_path, where);
    }
    if (field->cpp_type() != CppType::CPPTYPE_MESSAGE) {
      throw ConfigError(field_path, fmt::format("is a {}, not a section, so '{}' names no field ({})",
                                                field->type_name(), path, where));
    }
    message = message->GetReflection()->MutableMessage(message, field);
    prefix = field_path;
    start = dot + 1;
  }
}

// train.steps below schedule.warmup_steps (a short trial of a long config)
// clamps the warmup to the run instead of refusing it, and says so.
void clamp_warmup(config::Config& config) {
  config::Schedule& s = *config.mutable_schedule();
  const std::int64_t steps = config.train().steps();
  if (steps < 1 || s.warmup_steps() <= steps) return;
  std::cerr << fmt::format("warning: schedule.warmup_steps is {} but train.steps only {}: the warmup is clamped to "
                           "{} steps (the learning rate never reaches its decay)\n",
                           s.warmup_steps(), steps, steps);
  s.set_warmup_steps(static_cast<std::int32_t>(steps));
}

config::Config resolve(std::string_view text, const std::string& source,
                       std::string_view run_name, const std::vector<std::string>& overrides) {
  config::Config config;
  fill_message(config, parse_json(text, source), "", fmt::format("in {}", source));
  for (const std::string& override_text : overrides) apply_override(config, override_text);
  apply_defaults(config, run_name);
  clamp_warmup(config);
  validate_config(config);
  return config;
}

// The float's shortest decimal form as a double: the JSON shows 0.0003, not
// 0.0003000000142492354, and still reads back as the same float.
double widen_shortest(float value) {
  const std::string text = fmt::format("{}", value);
  double result = value;
  std::from_chars(text.data(), text.data() + text.size(), result);
  return result;
}

OrderedJson message_to_json(const pb::Message& message) {
  OrderedJson out = OrderedJson::object();
  const pb::Descriptor& descriptor = *message.GetDescriptor();
  const pb::Reflection& r = *message.GetReflection();
  for (int i = 0; i < descriptor.field_count(); ++i) {
    const pb::FieldDescriptor* f = descriptor.field(i);
    OrderedJson& slot = out[f->name()];
    if (f->cpp_type() != CppType::CPPTYPE_MESSAGE && f->has_presence() && !r.HasField(message, f)) {
      continue;  // stays null
    }
    switch (f->cpp_type()) {
      case CppType::CPPTYPE_INT32: slot = r.GetInt32(message, f); break;
      case CppType::CPPTYPE_INT64: slot = r.GetInt64(message, f); break;
      case CppType::CPPTYPE_UINT32: slot = r.GetUInt32(message, f); break;
      case CppType::CPPTYPE_UINT64: slot = r.GetUInt64(message, f); break;
      case CppType::CPPTYPE_FLOAT: slot = widen_shortest(r.GetFloat(message, f)); break;
      case CppType::CPPTYPE_DOUBLE: slot = r.GetDouble(message, f); break;
      case CppType::CPPTYPE_BOOL: slot = r.GetBool(message, f); break;
      case CppType::CPPTYPE_STRING: slot = r.GetString(message, f); break;
      case CppType::CPPTYPE_MESSAGE: slot = message_to_json(r.GetMessage(message, f)); break;
      case CppType::CPPTYPE_ENUM:
        DTRAIN_CHECK(false, "config field {} has a type the writer does not handle", f->name());
    }
  }
  return out;
}

}  // namespace

config::Config load_config(const std::filesystem::path& file,
                           const std::vector<std::string>& overrides) {
  std::error_code ec;
  if (std::filesystem::is_directory(file, ec)) {
    throw IoError(fmt::format("config '{}' is a directory; pass a JSON file", file.string()));
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) throw_errno("cannot open config", file.string());
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw_errno("cannot read config", file.string());
  return resolve(text.str(), file.string(), file.stem().string(), overrides);
}

config::Config parse_config_json(std::string_view json,
                                 const std::vector<std::string>& overrides) {
  return resolve(json, "config JSON", "default", overrides);
}

std::string config_to_json(const config::Config& config) {
  return message_to_json(config).dump(2) + "\n";
}

}  // namespace dtrain::worker
