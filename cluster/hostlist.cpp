#include "cluster/hostlist.h"

#include <cctype>
#include <charconv>
#include <string_view>

#include <fmt/format.h>

#include "core/error.h"

namespace dtrain::cluster {
namespace {

// More digits than this could overflow a long; no real host index needs them.
constexpr size_t kMaxDigits = 18;

// Reads one expression left to right; every error names the expression, the
// position and what such an expression should look like.
class Cursor {
 public:
  Cursor(std::string_view text, std::string_view kind, std::string_view example)
      : text_(text), kind_(kind), example_(example) {}

  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return text_[pos_]; }
  size_t pos() const { return pos_; }
  void advance() { ++pos_; }

  // Consumes a run of decimal digits; *width (if given) receives their count,
  // which Slurm uses as the zero-padded width of a range.
  long number(size_t* width = nullptr) {
    const size_t start = pos_;
    while (!at_end() && std::isdigit(static_cast<unsigned char>(peek()))) ++pos_;
    if (pos_ == start) {
      fail(start, at_end() ? std::string("expected a number, found the end")
                           : fmt::format("expected a number, found '{}'", peek()));
    }
    if (pos_ - start > kMaxDigits) fail(start, "number has too many digits");
    long value = 0;
    std::from_chars(text_.data() + start, text_.data() + pos_, value);
    if (width != nullptr) *width = pos_ - start;
    return value;
  }

  [[noreturn]] void fail(size_t pos, std::string_view problem) const {
    throw Error(fmt::format("{} '{}': {} at position {} (expected something like '{}')", kind_,
                            text_, problem, pos, example_));
  }

 private:
  std::string_view text_;
  std::string_view kind_;
  std::string_view example_;
  size_t pos_ = 0;
};

struct Range {
  long lo = 0;
  long hi = 0;
  size_t width = 0;  // digits of the low end: "08" pads to 2
};

// Literal text, or (when `ranges` is not empty) one bracket group.
struct Segment {
  std::string literal;
  std::vector<Range> ranges;
};
using Pattern = std::vector<Segment>;  // one comma-separated host expression

class HostlistParser {
 public:
  explicit HostlistParser(std::string_view text) : cursor_(text, "hostlist", "n[01-04,7],gpu1") {}

  std::vector<Pattern> parse() {
    if (cursor_.at_end()) cursor_.fail(0, "the list is empty");
    std::vector<Pattern> hosts;
    for (;;) {
      hosts.push_back(parse_host());
      if (cursor_.at_end()) return hosts;
      cursor_.advance();  // parse_host stops only at the end or at a ','
    }
  }

  void fail(size_t pos, std::string_view problem) const { cursor_.fail(pos, problem); }

 private:
  Pattern parse_host() {
    const size_t start = cursor_.pos();
    Pattern pattern;
    std::string literal;
    while (!cursor_.at_end() && cursor_.peek() != ',') {
      const char c = cursor_.peek();
      if (c == '[') {
        if (!literal.empty()) pattern.push_back({std::move(literal), {}});
        literal.clear();
        pattern.push_back({"", parse_group()});
      } else if (c == ']') {
        cursor_.fail(cursor_.pos(), "']' without a matching '['");
      } else if (!std::isgraph(static_cast<unsigned char>(c))) {
        cursor_.fail(cursor_.pos(), "whitespace or control character in a host name");
      } else {
        literal += c;
        cursor_.advance();
      }
    }
    if (!literal.empty()) pattern.push_back({std::move(literal), {}});
    if (pattern.empty()) cursor_.fail(start, "empty host name");
    return pattern;
  }

  // At '['; returns after the matching ']'.
  std::vector<Range> parse_group() {
    const size_t open = cursor_.pos();
    cursor_.advance();
    std::vector<Range> ranges;
    for (;;) {
      if (cursor_.at_end()) cursor_.fail(open, "'[' is never closed");
      if (cursor_.peek() == ']' && ranges.empty()) cursor_.fail(open, "empty brackets");
      if (cursor_.peek() == ']' || cursor_.peek() == ',') {
        cursor_.fail(cursor_.pos(), "empty range");
      }
      ranges.push_back(parse_range(open));
      if (cursor_.at_end()) cursor_.fail(open, "'[' is never closed");
      if (cursor_.peek() == ']') {
        cursor_.advance();
        return ranges;
      }
      if (cursor_.peek() != ',') {
        cursor_.fail(cursor_.pos(), fmt::format("expected ',' or ']', found '{}'", cursor_.peek()));
      }
      cursor_.advance();
    }
  }

  Range parse_range(size_t open) {
    const size_t start = cursor_.pos();
    Range range;
    range.lo = cursor_.number(&range.width);
    range.hi = range.lo;
    if (!cursor_.at_end() && cursor_.peek() == '-') {
      cursor_.advance();
      if (cursor_.at_end()) cursor_.fail(open, "'[' is never closed");
      range.hi = cursor_.number();
    }
    if (range.hi < range.lo) {
      cursor_.fail(start, fmt::format("range {}-{} goes down (write the low end first)", range.lo,
                                      range.hi));
    }
    if (range.hi - range.lo >= kMaxExpandedHosts) {
      cursor_.fail(start, fmt::format("range {}-{} is too large", range.lo, range.hi));
    }
    return range;
  }

  Cursor cursor_;
};

std::string format_index(long value, size_t width) {
  std::string digits = std::to_string(value);
  if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
  return digits;
}

// Hosts `pattern` expands to, or kMaxExpandedHosts + 1 when that is exceeded.
long count_hosts(const Pattern& pattern) {
  long count = 1;
  for (const Segment& segment : pattern) {
    if (segment.ranges.empty()) continue;
    long group = 0;
    for (const Range& range : segment.ranges) group += range.hi - range.lo + 1;
    if (group > kMaxExpandedHosts || count * group > kMaxExpandedHosts) {
      return kMaxExpandedHosts + 1;
    }
    count *= group;
  }
  return count;
}

// Appends every name of pattern[index..] after `prefix`; the earliest group
// varies slowest, as in Slurm.
void expand_pattern(const Pattern& pattern, size_t index, const std::string& prefix,
                    std::vector<std::string>& out) {
  if (index == pattern.size()) {
    out.push_back(prefix);
    return;
  }
  const Segment& segment = pattern[index];
  if (segment.ranges.empty()) {
    expand_pattern(pattern, index + 1, prefix + segment.literal, out);
    return;
  }
  for (const Range& range : segment.ranges) {
    for (long value = range.lo; value <= range.hi; ++value) {
      expand_pattern(pattern, index + 1, prefix + format_index(value, range.width), out);
    }
  }
}

}  // namespace

std::vector<std::string> expand_hostlist(const std::string& hostlist) {
  HostlistParser parser(hostlist);
  const std::vector<Pattern> patterns = parser.parse();
  long total = 0;
  for (const Pattern& pattern : patterns) total += count_hosts(pattern);
  if (total > kMaxExpandedHosts) {
    parser.fail(0, fmt::format("the list names more than {} hosts", kMaxExpandedHosts));
  }
  std::vector<std::string> hosts;
  hosts.reserve(static_cast<size_t>(total));
  for (const Pattern& pattern : patterns) expand_pattern(pattern, 0, "", hosts);
  return hosts;
}

std::string first_host(const std::string& hostlist) {
  const std::vector<Pattern> patterns = HostlistParser(hostlist).parse();
  std::string host;
  for (const Segment& segment : patterns.front()) {
    host += segment.ranges.empty()
                ? segment.literal
                : format_index(segment.ranges.front().lo, segment.ranges.front().width);
  }
  return host;
}

std::vector<int> expand_tasks_per_node(const std::string& spec) {
  Cursor cursor(spec, "tasks per node", "2(x3),1");
  if (cursor.at_end()) cursor.fail(0, "the list is empty");
  std::vector<int> counts;
  for (;;) {
    const size_t start = cursor.pos();
    const long count = cursor.number();
    long repeat = 1;
    if (!cursor.at_end() && cursor.peek() == '(') {
      cursor.advance();
      if (cursor.at_end() || cursor.peek() != 'x')
        cursor.fail(cursor.pos(), "expected 'x' after '('");
      cursor.advance();
      const size_t repeat_pos = cursor.pos();
      repeat = cursor.number();
      if (repeat < 1) cursor.fail(repeat_pos, "repetition must be at least 1");
      if (cursor.at_end() || cursor.peek() != ')') cursor.fail(cursor.pos(), "expected ')'");
      cursor.advance();
    }
    if (count > kMaxExpandedHosts) cursor.fail(start, "task count is too large");
    if (repeat > kMaxExpandedHosts - static_cast<long>(counts.size())) {
      cursor.fail(start, fmt::format("the list names more than {} nodes", kMaxExpandedHosts));
    }
    counts.insert(counts.end(), static_cast<size_t>(repeat), static_cast<int>(count));
    if (cursor.at_end()) return counts;
    if (cursor.peek() != ',') {
      cursor.fail(cursor.pos(), fmt::format("expected ',' or '(', found '{}'", cursor.peek()));
    }
    cursor.advance();
  }
}

}  // namespace dtrain::cluster
