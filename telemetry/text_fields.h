// The text shape telemetry's store records share (metrics_snapshot.h,
// heartbeat_format.h): one line of "key=value" fields separated by spaces,
// values without spaces, numbers in decimal as std::to_chars writes them.
// Pure functions; header-only.
#pragma once

#include <charconv>
#include <string_view>
#include <system_error>

namespace dtrain::telemetry {

// Calls field(key, value) for each field of `text`, in order; runs of spaces
// separate fields. False as soon as a field has no '=' or field() returns
// false; true otherwise (also for empty text).
template <typename Field>
bool for_each_field(std::string_view text, Field&& field) {
  std::size_t pos = 0;
  while (pos < text.size()) {
    if (text[pos] == ' ') {
      ++pos;
      continue;
    }
    std::size_t end = text.find(' ', pos);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view item = text.substr(pos, end - pos);
    const std::size_t eq = item.find('=');
    if (eq == std::string_view::npos || !field(item.substr(0, eq), item.substr(eq + 1))) return false;
    pos = end;
  }
  return true;
}

// The whole of `text` as a number (no sign on unsigned types, no spaces, no
// trailing characters); false when it is not one or does not fit.
template <typename Number>
bool parse_number(std::string_view text, Number& out) {
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && ptr == text.data() + text.size();
}

}  // namespace dtrain::telemetry
