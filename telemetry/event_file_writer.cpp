#include "telemetry/event_file_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <system_error>

#include <fmt/format.h>

#include "core/error.h"
#include "core/syscall.h"
#include "telemetry/event_file_format.h"

namespace dtrain::telemetry {
namespace {

std::atomic<int> files_opened{0};

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

// The seconds in the name of an event file ("events.out.tfevents.<s>.<...>"); -1 for other names.
std::int64_t name_seconds(const std::string& name) {
  if (!name.starts_with(kEventFilePrefix)) return -1;
  const char* first = name.data() + kEventFilePrefix.size();
  const char* last = name.data() + name.size();
  std::int64_t seconds = -1;
  const auto [end, ec] = std::from_chars(first, last, seconds);
  return ec == std::errc{} && end < last && *end == '.' ? seconds : -1;
}

// The latest seconds named by an event file in `dir` (-1: none).
std::int64_t latest_in(const std::filesystem::path& dir) {
  std::int64_t latest = -1;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    latest = std::max(latest, name_seconds(it->path().filename().string()));
  }
  return latest;
}

void write_all(int fd, std::string_view bytes, const std::filesystem::path& path) {
  while (!bytes.empty()) {
    const ssize_t n = DTRAIN_SYSCALL(::write(fd, bytes.data(), bytes.size()), path.string());
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
}

}  // namespace

std::string event_file_name(std::int64_t seconds) {
  return fmt::format("{}{:010}.{}.{}.{}", kEventFilePrefix, seconds, host_name(), ::getpid(), files_opened++);
}

EventFileWriter::EventFileWriter(const std::filesystem::path& dir, EventFileOptions options)
    : options_(std::move(options)) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    throw IoError(fmt::format("cannot create TensorBoard folder '{}': {}", dir.string(), ec.message()));
  }
  const auto seconds = std::max(static_cast<std::int64_t>(std::floor(now())), latest_in(dir) + 1);
  path_ = dir / event_file_name(seconds);
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_errno("cannot create TensorBoard event file", path_.string());
  tensorboard::Event first;
  first.set_file_version(std::string(kEventFileVersion));
  first.mutable_source_metadata()->set_writer(options_.source_writer);
  add(first);
  flush();
}

EventFileWriter::~EventFileWriter() {
  try {
    flush();
  } catch (const IoError&) {  // the caller flushes first when it cares
  }
  ::close(fd_);
}

double EventFileWriter::now() const {
  if (options_.wall_clock) return options_.wall_clock();
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void EventFileWriter::add(tensorboard::Event& event) {
  event.set_wall_time(now());
  serialized_.clear();
  event.AppendToString(&serialized_);
  append_record(serialized_, buffer_);
}

void EventFileWriter::add_scalars(std::int64_t step, std::span<const ScalarValue> values) {
  tensorboard::Event event;
  event.set_step(step);
  tensorboard::Summary& summary = *event.mutable_summary();
  for (const ScalarValue& v : values) {
    tensorboard::Summary::Value& value = *summary.add_value();
    value.set_tag(std::string(v.tag));
    value.set_simple_value(static_cast<float>(v.value));
  }
  add(event);
}

void EventFileWriter::add_text(std::int64_t step, std::string_view tag, std::string_view markdown) {
  tensorboard::Event event;
  event.set_step(step);
  tensorboard::Summary::Value& value = *event.mutable_summary()->add_value();
  value.set_tag(std::string(tag));
  // The text plugin's content is a TextPluginData with version 0: no bytes.
  value.mutable_metadata()->mutable_plugin_data()->set_plugin_name("text");
  tensorboard::TensorProto& tensor = *value.mutable_tensor();
  tensor.set_dtype(tensorboard::DT_STRING);
  tensor.mutable_tensor_shape();  // a scalar: a shape without dimensions
  tensor.add_string_val(std::string(markdown));
  add(event);
}

void EventFileWriter::add_summary(std::int64_t step, const std::function<void(tensorboard::Summary&)>& fill) {
  tensorboard::Event event;
  event.set_step(step);
  fill(*event.mutable_summary());
  add(event);
}

void EventFileWriter::add_session_start(std::int64_t step) {
  tensorboard::Event event;
  event.set_step(step);
  event.mutable_session_log()->set_status(tensorboard::SessionLog::START);
  add(event);
}

void EventFileWriter::flush() {
  if (buffer_.empty()) return;
  std::string pending;
  pending.swap(buffer_);
  write_all(fd_, pending, path_);  // on an error, what was pending is dropped
  pending.clear();
  buffer_.swap(pending);  // keeps the capacity
}

}  // namespace dtrain::telemetry
