// TensorBoard event files (telemetry/event_file_format.h, event_file_writer.h,
// histogram.h): the TFRecord framing against bytes TensorBoard's Python
// RecordWriter wrote, the CRC mask, cut and corrupt records, the writer's
// file name and records, and the histogram's buckets.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "support/temp_dir.h"
#include "telemetry/event_file_format.h"
#include "telemetry/event_file_writer.h"
#include "telemetry/histogram.h"

namespace dtrain::telemetry {
namespace {

using testing::TempDir;

std::string hex(std::string_view bytes) {
  std::string out;
  for (const unsigned char c : bytes) out += fmt::format("{:02x}", c);
  return out;
}

std::string read_all(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<tensorboard::Event> read_events(const std::filesystem::path& p) {
  const std::string bytes = read_all(p);
  std::string_view in = bytes, data;
  std::vector<tensorboard::Event> events;
  while (read_record(in, data) == RecordStatus::ok) {
    events.emplace_back();
    EXPECT_TRUE(events.back().ParseFromArray(data.data(), static_cast<int>(data.size())));
  }
  EXPECT_TRUE(in.empty()) << in.size() << " bytes left after the last whole record";
  return events;
}

TEST(EventFileFormat, MaskMatchesTensorBoard) {
  // tensorboard.compat.tensorflow_stub.pywrap_tensorflow.masked_crc32c
  EXPECT_EQ(mask_crc(crc32c("", 0)), 0xa282ead8u);
  EXPECT_EQ(mask_crc(crc32c("123456789", 9)), 0xc78ab0e5u);
  const std::uint64_t zero = 0;
  EXPECT_EQ(mask_crc(crc32c(&zero, 8)), 0x07980329u);
  for (const std::uint32_t crc : {0u, 1u, 0xE3069283u, 0xFFFFFFFFu, 0x80000000u}) {
    EXPECT_EQ(unmask_crc(mask_crc(crc)), crc);
    EXPECT_NE(mask_crc(crc), crc);
    EXPECT_NE(mask_crc(mask_crc(crc)), mask_crc(crc));
  }
}

TEST(EventFileFormat, RecordBytesMatchTensorBoardsRecordWriter) {
  // tensorboard.summary.writer.record_writer.RecordWriter(f).write(b"hello") and (b"")
  std::string out;
  append_record("hello", out);
  EXPECT_EQ(hex(out), "0500000000000000eab2043e68656c6c6fbb1f1c19");
  out.clear();
  append_record("", out);
  EXPECT_EQ(hex(out), "000000000000000029039807d8ea82a2");
}

TEST(EventFileFormat, ReadsRecordsBackAndRefusesCutOrCorruptOnes) {
  std::string file;
  append_record("first", file);
  append_record("the second record", file);
  std::string_view in = file, data;
  ASSERT_EQ(read_record(in, data), RecordStatus::ok);
  EXPECT_EQ(data, "first");
  ASSERT_EQ(read_record(in, data), RecordStatus::ok);
  EXPECT_EQ(data, "the second record");
  EXPECT_EQ(read_record(in, data), RecordStatus::end);

  // A writer killed mid-record: every cut of the last record reads as cut.
  const std::size_t first = kRecordHeaderBytes + 5 + kRecordFooterBytes;
  for (std::size_t cut = first + 1; cut < file.size(); ++cut) {
    std::string_view part = std::string_view(file).substr(0, cut);
    ASSERT_EQ(read_record(part, data), RecordStatus::ok);
    const std::string_view before = part;
    EXPECT_EQ(read_record(part, data), RecordStatus::cut) << "cut at " << cut;
    EXPECT_EQ(part.size(), before.size()) << "a cut record is not consumed";
  }
  // A flipped bit in the length, in the data, in the data's CRC.
  for (const std::size_t at : {std::size_t{0}, kRecordHeaderBytes + 2, kRecordHeaderBytes + 5}) {
    std::string bad = file;
    bad[at] = static_cast<char>(bad[at] ^ 0x10);
    std::string_view view = bad;
    EXPECT_EQ(read_record(view, data), RecordStatus::corrupt) << "byte " << at;
  }
}

TEST(EventFileWriter, NamesTheFileAsTensorBoardAndStartsWithTheFileVersion) {
  TempDir dir;
  double clock = 1700000000.75;
  EventFileWriter writer(dir / "tb", {.wall_clock = [&] { return clock; }});
  const std::string name = writer.path().filename().string();
  EXPECT_TRUE(std::regex_match(name, std::regex(R"(events\.out\.tfevents\.1700000000\.[^.]+(\..+)?\.\d+\.\d+)")))
      << name;
  EXPECT_EQ(writer.path().parent_path(), dir / "tb");
  clock = 1700000001.5;
  const std::vector<ScalarValue> values{{"loss/train", 2.5}, {"lr", 0.1}};
  writer.add_scalars(7, values);
  writer.add_session_start(3);
  writer.add_text(0, "config", "{}");
  EXPECT_EQ(read_events(writer.path()).size(), 1u) << "records reach the file at flush()";
  writer.flush();

  const std::vector<tensorboard::Event> events = read_events(writer.path());
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  EXPECT_EQ(events[0].source_metadata().writer(), "dtrain");
  EXPECT_EQ(events[0].wall_time(), 1700000000.75);
  EXPECT_EQ(events[1].wall_time(), 1700000001.5);
  EXPECT_EQ(events[1].step(), 7);
  ASSERT_EQ(events[1].summary().value_size(), 2);
  EXPECT_EQ(events[1].summary().value(0).tag(), "loss/train");
  EXPECT_EQ(events[1].summary().value(0).simple_value(), 2.5f);
  EXPECT_EQ(events[1].summary().value(1).simple_value(), 0.1f);
  EXPECT_EQ(events[2].step(), 3);
  EXPECT_EQ(events[2].session_log().status(), tensorboard::SessionLog::START);
  const tensorboard::Summary::Value& text = events[3].summary().value(0);
  EXPECT_EQ(text.metadata().plugin_data().plugin_name(), "text");
  EXPECT_EQ(text.tensor().dtype(), tensorboard::DT_STRING);
  ASSERT_EQ(text.tensor().string_val_size(), 1);
  EXPECT_EQ(text.tensor().string_val(0), "{}");
}

TEST(EventFileWriter, ANewFileSortsAfterTheFilesAlreadyThere) {
  TempDir dir;
  std::filesystem::create_directories(dir / "tb");
  std::ofstream(dir / "tb" / "events.out.tfevents.1800000000.other.99.0").put('x');
  std::ofstream(dir / "tb" / "notes.txt").put('x');
  EventFileWriter writer(dir / "tb", {.wall_clock = [] { return 1700000000.0; }});
  EXPECT_TRUE(writer.path().filename().string().starts_with("events.out.tfevents.1800000001."))
      << writer.path();
  EventFileWriter second(dir / "tb", {.wall_clock = [] { return 1900000000.0; }});
  EXPECT_TRUE(second.path().filename().string().starts_with("events.out.tfevents.1900000000."))
      << second.path();
}

TEST(EventFileWriter, AFolderThatCannotBeMadeIsAnIoErrorNamingIt) {
  TempDir dir;
  const auto file = dir.write("plain-file", "x");
  try {
    EventFileWriter writer(file / "tb");
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find((file / "tb").string()), std::string::npos) << e.what();
  }
}

TEST(Histogram, DefaultLimitsAreTensorFlows) {
  const std::span<const double> limits = default_bucket_limits();
  ASSERT_EQ(limits.size(), 1551u);  // 774 growing limits and DBL_MAX per sign, and 0
  EXPECT_EQ(limits.front(), -DBL_MAX);
  EXPECT_EQ(limits[775], 0.0);
  EXPECT_EQ(limits[776], 1e-12);
  EXPECT_EQ(limits.back(), DBL_MAX);
  for (std::size_t i = 1; i < limits.size(); ++i) {
    ASSERT_LT(limits[i - 1], limits[i]) << i;
    EXPECT_EQ(limits[i], -limits[limits.size() - 1 - i]) << i;
  }
  EXPECT_NEAR(limits[777] / limits[776], 1.1, 1e-12);
}

TEST(Histogram, CountsEachValueBelowTheFirstGreaterLimitAndCollapsesEmptyRuns) {
  Histogram h;
  const std::vector<float> values{0.0f, 0.0f, 1.0f, -1.0f, 2.0f, std::nanf("")};
  h.add(values);
  EXPECT_EQ(h.nan(), 1);
  tensorboard::HistogramProto p;
  h.encode(p);
  EXPECT_EQ(p.min(), -1.0);
  EXPECT_EQ(p.max(), 2.0);
  EXPECT_EQ(p.num(), 5.0);
  EXPECT_EQ(p.sum(), 2.0);
  EXPECT_EQ(p.sum_squares(), 6.0);
  ASSERT_EQ(p.bucket_size(), p.bucket_limit_size());
  double total = 0.0;
  const std::span<const double> limits = default_bucket_limits();
  for (int i = 0; i < p.bucket_size(); ++i) {
    total += p.bucket(i);
    if (i == 0) continue;
    EXPECT_LT(p.bucket_limit(i - 1), p.bucket_limit(i));
    if (p.bucket(i) == 0.0) {
      EXPECT_GT(p.bucket(i - 1), 0.0) << "empty buckets come collapsed";
    }
  }
  EXPECT_EQ(total, 5.0);
  EXPECT_EQ(p.bucket_limit(p.bucket_limit_size() - 1), DBL_MAX);
  // A non-empty bucket keeps its own limit, the first one above its values:
  // the zeros lie in [0, 1e-12).
  const auto count_below = [&](double limit) {
    for (int i = 0; i < p.bucket_size(); ++i) {
      if (p.bucket_limit(i) == limit) return p.bucket(i);
    }
    return -1.0;
  };
  for (const double v : {-1.0, 0.0, 1.0, 2.0}) {
    const double limit = *std::upper_bound(limits.begin(), limits.end(), v);
    EXPECT_EQ(count_below(limit), v == 0.0 ? 2.0 : 1.0) << v;
  }
}

}  // namespace
}  // namespace dtrain::telemetry
