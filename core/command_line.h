// Command lines of the dtrain binaries (CLI11), with the exit codes of
// core/exit_codes.h: --help and --version print on stdout and end with 0; a
// parse error prints "<binary>: error: <what> (see <binary> --help)" on
// stderr and ends with kExitError (2), never with CLI11's own codes.
#pragma once

#include <functional>
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

// Runs a binary's main body with the exit codes of core/exit_codes.h: its own
// value, or after printing "<binary>: error: <what>" kExitError for a
// dtrain::Error and "<binary>: unexpected error: <what>" kExitUnexpected for
// any other exception. With `comm_errors_exit_at_once`, a TimeoutError or
// CommError ends the process with std::_Exit (output flushed first): a comm
// thread stuck inside a library call would hang the destructors.
int run_main(std::string_view binary, const std::function<int()>& body, bool comm_errors_exit_at_once = false);

// Validators whose messages say what the value must be, in words
// ("--steps: must be at least 1, not 0"), for numbers that count something.
CLI::Validator at_least(double minimum);
CLI::Validator more_than(double bound);

}  // namespace dtrain
