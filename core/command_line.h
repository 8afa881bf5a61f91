// Command lines of the dtrain binaries (CLI11), with the exit codes of
// core/exit_codes.h: --help and --version print on stdout and end with 0; a
// parse error prints "<binary>: error: <what> (see <binary> --help)" on
// stderr and ends with kExitError (2), never with CLI11's own codes.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <CLI/CLI.hpp>

namespace dtrain {

// "dtrain-worker 0.1.0": what --version prints.
std::string version_text(std::string_view binary);

// Parses argv with `app`, adding --version unless `app` has it. nullopt: go
// on; otherwise main returns the value (help, version or error printed).
std::optional<int> parse_args(CLI::App& app, int argc, const char* const* argv, std::string_view binary);

// Validators whose messages say what the value must be, in words
// ("--steps: must be at least 1, not 0"), for numbers that count something.
CLI::Validator at_least(double minimum);
CLI::Validator more_than(double bound);

}  // namespace dtrain
