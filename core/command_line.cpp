#include "core/command_line.h"

#include <cstdlib>
#include <iostream>

#include <fmt/format.h>

#include "core/error.h"
#include "core/exit_codes.h"
#include "dtrain/config.h"

namespace dtrain {
namespace {

// The value as a number, or the reason it is not one.
std::optional<double> number(const std::string& text) {
  try {
    std::size_t used = 0;
    const double v = std::stod(text, &used);
    if (used == text.size()) return v;
  } catch (const std::exception&) {
    // not a number: said by the caller
  }
  return std::nullopt;
}

}  // namespace

std::string version_text(std::string_view binary) { return fmt::format("{} {}", binary, DTRAIN_VERSION); }

int run_main(std::string_view binary, const std::function<int()>& body, bool comm_errors_exit_at_once) {
  try {
    return body();
  } catch (const Error& e) {
    std::cerr << fmt::format("{}: error: {}", binary, e.what()) << std::endl;
    const bool comm = dynamic_cast<const TimeoutError*>(&e) != nullptr || dynamic_cast<const CommError*>(&e) != nullptr;
    if (comm && comm_errors_exit_at_once) {
      std::cout.flush();
      std::_Exit(kExitError);
    }
    return kExitError;
  } catch (const std::exception& e) {
    std::cerr << fmt::format("{}: unexpected error: {}", binary, e.what()) << std::endl;
    return kExitUnexpected;
  }
}

std::optional<int> parse_args(CLI::App& app, int argc, const char* const* argv, std::string_view binary) {
  if (app.get_option_no_throw("--version") == nullptr) app.set_version_flag("--version", version_text(binary));
  try {
    app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << fmt::format("{}: error: {} (see {} --help)", binary, e.what(), binary) << std::endl;
    return kExitError;
  }
}

CLI::Validator at_least(double minimum) {
  return CLI::Validator(
      [minimum](std::string& text) -> std::string {
        const auto v = number(text);
        if (!v) return fmt::format("'{}' is not a number", text);
        if (*v < minimum) return fmt::format("must be at least {}, not {}", minimum, text);
        return "";
      },
      "");
}

CLI::Validator more_than(double bound) {
  return CLI::Validator(
      [bound](std::string& text) -> std::string {
        const auto v = number(text);
        if (!v) return fmt::format("'{}' is not a number", text);
        if (*v <= bound) return fmt::format("must be more than {}, not {}", bound, text);
        return "";
      },
      "");
}

}  // namespace dtrain
