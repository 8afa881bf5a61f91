// EventFileWriter: one TensorBoard event file (telemetry/event_file_format.h),
// written natively: scalars, text, histograms and the session-start marker
// that makes readers drop a replaced run's later steps. Records are buffered
// in memory and reach the file at flush(): the caller chooses how often (the
// trainer: at every logged step and at the end).
//
// Errors: IoError naming the directory or the file (creating, writing); the
// writer is then left as it was and may be dropped. A destructor's flush
// swallows its error: flush() explicitly to see it.
// Threading: one thread owns a writer.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <string_view>

#include "proto/tensorboard.pb.h"

namespace dtrain::telemetry {

struct EventFileOptions {
  // Event.wall_time of every record and the seconds in the file's name:
  // seconds since the epoch. Empty: the system clock (tests fix it).
  std::function<double()> wall_clock;
  // The first record's source_metadata.writer.
  std::string source_writer = "dtrain";
};

// A scalar of one step; TensorBoard keeps it as a float32 (simple_value).
struct ScalarValue {
  std::string_view tag;
  double value = 0.0;
};

// events.out.tfevents.<%010d seconds>.<hostname>.<pid>.<counter>, TensorBoard's
// own writers' name; counter counts the files this process opened.
std::string event_file_name(std::int64_t seconds);

class EventFileWriter {
 public:
  // Creates `dir` (with its parents) and a new file in it, and writes the
  // file_version record. TensorBoard reads a folder's files in name order,
  // so the name's seconds are raised, when needed, past those of every
  // event file already in `dir`: a newer file never sorts before an older.
  explicit EventFileWriter(const std::filesystem::path& dir, EventFileOptions options = {});
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  // One Event with one value per scalar.
  void add_scalars(std::int64_t step, std::span<const ScalarValue> values);
  // A text summary (the "text" plugin: Markdown, a string tensor).
  void add_text(std::int64_t step, std::string_view tag, std::string_view markdown);
  // One Event with the histograms `fill` adds to the summary.
  void add_summary(std::int64_t step, const std::function<void(tensorboard::Summary&)>& fill);
  // SessionLog START at `step`: readers drop this folder's events at and
  // after `step` that come before it (a resumed run's replaced steps).
  void add_session_start(std::int64_t step);
  // Appends `event` with its wall_time set (the other adds end here).
  void add(tensorboard::Event& event);
  // Writes what is buffered to the file.
  void flush();

  const std::filesystem::path& path() const { return path_; }

 private:
  double now() const;

  std::filesystem::path path_;
  EventFileOptions options_;
  int fd_ = -1;
  std::string buffer_;      // whole records not yet written
  std::string serialized_;  // reused for each Event's bytes
};

}  // namespace dtrain::telemetry
