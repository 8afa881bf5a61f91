#include "worker/profiler.h"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <ctime>
#include <fstream>
#include <limits>
#include <map>
#include <ostream>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "nn/cpu/host_device.h"
#include "proto/xplane.pb.h"

namespace dtrain::worker {
namespace {

[[noreturn]] void bad_schedule(const std::string& text, const std::string& why) {
  throw ConfigError("train.profile_steps",
                    fmt::format("'{}' {}; write \"wait=W,warmup=U,active=A\" (e.g. \"wait=1,warmup=1,active=3\": "
                                "step 1 untouched, step 2 warms up, steps 3 to 5 recorded)",
                                text, why));
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  std::string s = name;
  // The plugin splits "<host>.<tool extension>": keep the host's first label.
  return s.substr(0, s.find('.'));
}

// Every rank's text, on rank 0 (elsewhere: empty). Two allgathers: the
// lengths, then the texts padded to the longest (as 4-byte words).
std::vector<std::string> gather_to_rank0(comm::Communicator& comm, const std::string& mine) {
  const int world = comm.world_size();
  if (world == 1) return {mine};
  const auto length = static_cast<std::int32_t>(mine.size());
  std::vector<std::int32_t> lengths(static_cast<std::size_t>(world));
  comm.allgather(&length, lengths.data(), 1, DType::i32).wait();
  const std::size_t longest = static_cast<std::size_t>(*std::max_element(lengths.begin(), lengths.end()));
  const std::size_t words = std::max<std::size_t>(1, (longest + 3) / 4);
  std::vector<std::int32_t> padded(words, 0);
  std::copy(mine.begin(), mine.end(), reinterpret_cast<char*>(padded.data()));
  std::vector<std::int32_t> all(words * static_cast<std::size_t>(world));
  comm.allgather(padded.data(), all.data(), words, DType::i32).wait();
  if (comm.rank() != 0) return {};
  std::vector<std::string> texts;
  for (int r = 0; r < world; ++r) {
    const char* begin = reinterpret_cast<const char*>(all.data() + static_cast<std::size_t>(r) * words);
    texts.emplace_back(begin, static_cast<std::size_t>(lengths[static_cast<std::size_t>(r)]));
  }
  return texts;
}

// Writes `text` gzip'd to `file` through a temporary beside it, so a reader
// never sees half a file. False when any part fails.
bool write_gzip(const std::filesystem::path& file, const std::string& text) {
  const std::filesystem::path tmp = file.string() + ".tmp";
  gzFile out = ::gzopen(tmp.c_str(), "wb");
  if (out == nullptr) return false;
  bool ok = true;
  for (std::size_t at = 0; ok && at < text.size();) {
    const auto n = static_cast<unsigned>(std::min<std::size_t>(text.size() - at, 1u << 24));
    ok = ::gzwrite(out, text.data() + at, n) == static_cast<int>(n);
    at += n;
  }
  ok = ::gzclose(out) == Z_OK && ok;
  std::error_code ec;
  if (ok) std::filesystem::rename(tmp, file, ec);
  if (!ok || ec) std::filesystem::remove(tmp, ec);
  return ok && !ec;
}

// Writes `bytes` to `file` through a temporary beside it. False when it fails.
bool write_file(const std::filesystem::path& file, const std::string& bytes) {
  const std::filesystem::path tmp = file.string() + ".tmp";
  bool ok = false;
  {
    std::ofstream out(tmp, std::ios::binary);
    ok = static_cast<bool>(out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()))) &&
         static_cast<bool>(out.flush());
  }
  std::error_code ec;
  if (ok) std::filesystem::rename(tmp, file, ec);
  if (!ok || ec) std::filesystem::remove(tmp, ec);
  return ok && !ec;
}

}  // namespace

// One plane per rank, "/device:CUSTOM:<rank>" (the trace viewer's process
// <rank>), a line per thread, an event per complete event with its args as
// int64 stats; time counts from the earliest event (the viewer keeps
// picoseconds in 64 bits, too few for the epoch).
std::string profile_xspace(const std::vector<std::string>& rank_events, const std::string& host) {
  using Json = nlohmann::json;
  std::vector<Json> ranks;
  double origin_us = std::numeric_limits<double>::infinity();
  for (const std::string& text : rank_events) {
    ranks.push_back(Json::parse("[" + text + "]"));
    for (const Json& e : ranks.back()) {
      if (e.value("ph", "") == "X") origin_us = std::min(origin_us, e["ts"].get<double>());
    }
  }
  if (!std::isfinite(origin_us)) origin_us = 0.0;
  tensorflow::profiler::XSpace space;
  space.add_hostnames(host);
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    tensorflow::profiler::XPlane& plane = *space.add_planes();
    plane.set_id(static_cast<std::int64_t>(r) + 1);
    plane.set_name(fmt::format("/device:CUSTOM:{}", r));
    std::map<int, tensorflow::profiler::XLine*> lines;
    std::map<std::string, std::int64_t> event_ids, stat_ids;
    const auto line_of = [&](int tid) {
      auto& line = lines[tid];
      if (line == nullptr) {
        line = plane.add_lines();
        line->set_id(tid);
        line->set_display_id(tid);
        line->set_timestamp_ns(0);
      }
      return line;
    };
    const auto id_of = [](std::map<std::string, std::int64_t>& ids, const std::string& name) {
      return ids.emplace(name, static_cast<std::int64_t>(ids.size()) + 1).first->second;
    };
    for (const Json& e : ranks[r]) {
      const int tid = e.value("tid", 0);
      if (e.value("ph", "") == "M") {
        if (e.value("name", "") == "thread_name") line_of(tid)->set_name(e["args"]["name"].get<std::string>());
        continue;
      }
      tensorflow::profiler::XEvent& x = *line_of(tid)->add_events();
      x.set_metadata_id(id_of(event_ids, e["name"].get<std::string>()));
      x.set_offset_ps(std::llround((e["ts"].get<double>() - origin_us) * 1e6));
      x.set_duration_ps(std::llround(e["dur"].get<double>() * 1e6));
      for (const auto& [name, value] : e["args"].items()) {
        tensorflow::profiler::XStat& stat = *x.add_stats();
        stat.set_metadata_id(id_of(stat_ids, name));
        stat.set_int64_value(value.get<std::int64_t>());
      }
    }
    for (const auto& [name, id] : event_ids) {
      tensorflow::profiler::XEventMetadata& m = (*plane.mutable_event_metadata())[id];
      m.set_id(id);
      m.set_name(name);
      m.set_display_name(name);
    }
    for (const auto& [name, id] : stat_ids) {
      tensorflow::profiler::XStatMetadata& m = (*plane.mutable_stat_metadata())[id];
      m.set_id(id);
      m.set_name(name);
    }
  }
  return space.SerializeAsString();
}

std::optional<ProfileSchedule> parse_profile_steps(const std::string& text) {
  if (text.empty()) return std::nullopt;
  ProfileSchedule s;
  bool seen[3] = {false, false, false};
  const std::string_view all = text;
  for (std::size_t at = 0; at <= all.size();) {
    const std::size_t comma = std::min(all.find(',', at), all.size());
    const std::string_view item = all.substr(at, comma - at);
    at = comma + 1;
    const auto eq = item.find('=');
    if (eq == std::string_view::npos) bad_schedule(text, fmt::format("has '{}' without '='", item));
    const std::string_view key = item.substr(0, eq), value = item.substr(eq + 1);
    int n = 0;
    const auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
    if (ec != std::errc() || ptr != value.data() + value.size() || n < 0) {
      bad_schedule(text, fmt::format("gives {} '{}', not a whole number >= 0", key, value));
    }
    const int index = key == "wait" ? 0 : key == "warmup" ? 1 : key == "active" ? 2 : -1;
    if (index < 0) bad_schedule(text, fmt::format("names '{}': the parts are wait, warmup and active", key));
    if (seen[index]) bad_schedule(text, fmt::format("gives {} twice", key));
    seen[index] = true;
    (index == 0 ? s.wait : index == 1 ? s.warmup : s.active) = n;
  }
  if (s.active < 1) bad_schedule(text, "records no step (active must be at least 1)");
  return s;
}

std::string profile_run_name(std::chrono::system_clock::time_point t) {
  const std::time_t seconds = std::chrono::system_clock::to_time_t(t);
  std::tm utc{};
  ::gmtime_r(&seconds, &utc);
  return fmt::format("{:04}_{:02}_{:02}_{:02}_{:02}_{:02}", utc.tm_year + 1900, utc.tm_mon + 1, utc.tm_mday,
                     utc.tm_hour, utc.tm_min, utc.tm_sec);
}

Profiler::Profiler(ProfileSchedule schedule, std::int64_t first_step, comm::Communicator& comm, nn::Device& device,
                   int blocks, int accum, nn::BlockHooks& inner, std::filesystem::path tensorboard_dir,
                   std::ostream* console, std::ostream& warnings)
    : comm_(comm),
      device_(device),
      active_steps_{first_step + schedule.wait + schedule.warmup + 1,
                    first_step + schedule.wait + schedule.warmup + schedule.active},
      warmup_first_(first_step + schedule.wait + 1),
      tensorboard_dir_(std::move(tensorboard_dir)),
      console_(console),
      warnings_(warnings) {
  // The kernel timers count on the thread that runs the kernels: the
  // training thread on the plain CPU device, the only one sampled here.
  auto* host = dynamic_cast<nn::cpu::HostDevice*>(&device_);
  const bool kernels = host != nullptr && !host->asynchronous();
  tracer_ = std::make_unique<Tracer>(comm_.rank(), active_steps_, blocks, accum, std::filesystem::path(), inner,
                                     kernels ? &kernels_ : nullptr);
}

Profiler::~Profiler() {
  if (timing_) set_kernel_timing(false);
}

void Profiler::set_kernel_timing(bool on) {
  auto* host = dynamic_cast<nn::cpu::HostDevice*>(&device_);
  if (host == nullptr || host->asynchronous() || timing_ == on) return;
  host->set_profile(on ? &kernels_ : nullptr);
  timing_ = on;
}

void Profiler::begin_step(std::int64_t step) {
  set_kernel_timing(!tracer_->written() && step >= warmup_first_ && step <= active_steps_.last);
  tracer_->begin_step(step);
  if (tracer_->active()) last_recorded_ = step;
}

void Profiler::end_iteration() {
  if (tracer_->end_iteration()) collect();
}

void Profiler::finish() {
  if (tracer_->finish()) collect();
}

void Profiler::collect() {
  set_kernel_timing(false);
  const std::vector<std::string> texts = gather_to_rank0(comm_, tracer_->events_json());
  if (comm_.rank() != 0 || tensorboard_dir_.empty()) return;
  const std::filesystem::path dir =
      tensorboard_dir_ / "plugins" / "profile" / profile_run_name(std::chrono::system_clock::now());
  const std::string host = host_name();
  const std::filesystem::path file = dir / (host + ".trace.json.gz");
  const std::filesystem::path xplane = dir / (host + ".xplane.pb");
  std::string json = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  for (std::size_t r = 0; r < texts.size(); ++r) json += (r == 0 ? "" : ",\n") + texts[r];
  json += "\n]}\n";
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !write_gzip(file, json) || !write_file(xplane, profile_xspace(texts, host))) {
    warnings_ << fmt::format("warning: the profile of steps {} to {} is lost: cannot write '{}'{}; training goes on\n",
                             active_steps_.first, last_recorded_, file.string(),
                             ec ? ": " + ec.message() : std::string());
    return;
  }
  written_ = file;
  if (console_ != nullptr) {
    *console_ << fmt::format("profile of steps {} to {} ({} rank(s)): {} (tensorboard --logdir {}, Profile tab)\n",
                             active_steps_.first, last_recorded_, texts.size(), file.string(),
                             tensorboard_dir_.string());
  }
}

}  // namespace dtrain::worker
