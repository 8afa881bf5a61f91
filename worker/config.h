// The training configuration (proto/config.proto): read from JSON with the
// schema's field names, overridden with `--set key.path=value`, completed with
// defaults and validated. Every problem is a ConfigError naming the dotted
// field ("model.d_model") and saying what to do. A resolved config is complete:
// config_to_json(c) loads back to a Config equal to c.
// All functions are pure (no global state) but for one warning on standard
// error: schedule.warmup_steps above train.steps is clamped to it, not
// refused. Any thread may call them.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "proto/config.pb.h"

namespace dtrain::worker {

// Reads `file` (JSON; // comments allowed), applies `overrides` in order (each
// "key.path=value" without the "--set"; value parsed by the field's type, or as
// a JSON literal), applies defaults (train.out_dir: "runs/<file stem>") and
// validates. Throws IoError if the file cannot be read, ConfigError otherwise.
config::Config load_config(const std::filesystem::path& file,
                           const std::vector<std::string>& overrides = {});

// As load_config, for JSON text in memory; train.out_dir defaults to "runs/default".
config::Config parse_config_json(std::string_view json,
                                 const std::vector<std::string>& overrides = {});

// Fills every unset field with its documented default; `run_name` names the
// default train.out_dir ("runs/<run_name>"). Idempotent.
void apply_defaults(config::Config& config, std::string_view run_name);

// Throws ConfigError for the first invalid field. REQUIRES: apply_defaults ran.
void validate_config(const config::Config& config);

// The config as pretty JSON: proto field names, every field printed (unset
// `optional` fields as null), floats in shortest round-trip form. Written as
// out_dir/config.json.
std::string config_to_json(const config::Config& config);

}  // namespace dtrain::worker
