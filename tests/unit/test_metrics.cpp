#include "worker/metrics.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dtrain::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::json;

std::filesystem::path fresh_dir(const std::string& name) {
  const auto dir = std::filesystem::path(::testing::TempDir()) / fmt::format("dtrain_metrics_{}", name);
  std::filesystem::remove_all(dir);
  return dir;
}

std::vector<std::string> read_lines(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::vector<std::string> keys(const Json& object) {
  std::vector<std::string> out;
  for (const auto& item : object.items()) out.push_back(item.key());
  return out;
}

double parse_number(const std::string& text) { return Json::parse(text).get<double>(); }

TEST(FormatJsonNumber, IsShortestAndRoundTrips) {
  EXPECT_EQ(format_json_number(0.1), "0.1");
  EXPECT_EQ(format_json_number(2.0), "2");
  EXPECT_EQ(format_json_number(static_cast<double>(0.1f)), "0.10000000149011612");
  for (double v : {1.0 / 3.0, static_cast<double>(0.1f), 1e-8, 6.02214076e23, -2.5e-300,
                   std::numeric_limits<double>::denorm_min(), std::numeric_limits<double>::max()}) {
    const std::string text = format_json_number(v);
    EXPECT_EQ(parse_number(text), v) << text;
  }
}

TEST(FormatJsonNumber, NonFiniteIsNull) {
  EXPECT_EQ(format_json_number(std::nan("")), "null");
  EXPECT_EQ(format_json_number(std::numeric_limits<double>::infinity()), "null");
  EXPECT_EQ(format_json_number(-std::numeric_limits<double>::infinity()), "null");
}

TEST(MetricsWriter, WritesOneParsableObjectPerLine) {
  const auto dir = fresh_dir("lines") / "nested" / "run";
  const double third = 1.0 / 3.0;
  const double tenth_f = static_cast<double>(0.1f);
  {
    MetricsWriter writer(dir, /*append=*/false);
    EXPECT_EQ(writer.path(), dir / "metrics.jsonl");
    writer.log_step(10, third, 3e-4, tenth_f, 12345.5, 81.25);
    writer.log_eval(10, 2.5, 0.875, std::nullopt);
    writer.log_eval(20, 2.0, std::nullopt, std::exp(2.0));
    writer.log_end(20, tenth_f);
  }
  const std::vector<std::string> lines = read_lines(dir / "metrics.jsonl");
  ASSERT_EQ(lines.size(), 4u);
  const Json step = Json::parse(lines[0]);
  EXPECT_THAT(keys(step), ElementsAre("grad_norm", "loss", "lr", "step", "step_ms",
                                      "tokens_per_s"));  // nlohmann sorts keys
  EXPECT_THAT(lines[0], HasSubstr(R"({"step":10,"loss":)"));
  EXPECT_EQ(step["step"].get<int>(), 10);
  EXPECT_EQ(step["loss"].get<double>(), third);  // bit for bit
  EXPECT_EQ(step["lr"].get<double>(), 3e-4);
  EXPECT_EQ(step["grad_norm"].get<double>(), tenth_f);
  EXPECT_EQ(step["tokens_per_s"].get<double>(), 12345.5);
  EXPECT_EQ(step["step_ms"].get<double>(), 81.25);

  const Json eval = Json::parse(lines[1]);
  EXPECT_EQ(eval["event"], "eval");
  EXPECT_EQ(eval["accuracy"].get<double>(), 0.875);
  EXPECT_FALSE(eval.contains("perplexity"));

  const Json lm_eval = Json::parse(lines[2]);
  EXPECT_EQ(lm_eval["step"].get<int>(), 20);
  EXPECT_EQ(lm_eval["perplexity"].get<double>(), std::exp(2.0));
  EXPECT_FALSE(lm_eval.contains("accuracy"));

  EXPECT_EQ(Json::parse(lines[3]), Json::parse(R"({"event":"end","step":20,"loss":0.10000000149011612})"));
}

TEST(MetricsWriter, NanAndInfAreNull) {
  const auto dir = fresh_dir("nan");
  MetricsWriter writer(dir, false);
  writer.log_step(1, std::nan(""), 1e-3, std::numeric_limits<double>::infinity(), 1, 1);
  writer.log_eval(1, 1.0, std::nan(""), std::nullopt);
  const std::vector<std::string> lines = read_lines(writer.path());  // flushed while still open
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_TRUE(Json::parse(lines[0])["loss"].is_null());
  EXPECT_TRUE(Json::parse(lines[0])["grad_norm"].is_null());
  EXPECT_TRUE(Json::parse(lines[1])["accuracy"].is_null());
}

TEST(MetricsWriter, FreshRunTruncatesAndResumedRunAppends) {
  const auto dir = fresh_dir("append");
  MetricsWriter(dir, false).log_end(1, 1.0);
  MetricsWriter(dir, true).log_end(2, 2.0);
  EXPECT_EQ(read_lines(dir / "metrics.jsonl").size(), 2u);
  MetricsWriter(dir, false).log_end(3, 3.0);
  const std::vector<std::string> lines = read_lines(dir / "metrics.jsonl");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(Json::parse(lines[0])["step"].get<int>(), 3);
}

TEST(MetricsWriter, UnwritableDirectoryIsIoErrorNamingIt) {
  const auto base = fresh_dir("unwritable");
  std::filesystem::create_directories(base);
  std::ofstream(base / "file") << "not a directory";
  const auto out_dir = base / "file" / "run";  // fails even for root, unlike chmod
  try {
    MetricsWriter writer(out_dir, false);
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), HasSubstr(out_dir.string()));
  }
}

TEST(MetricsWriter, MetricsPathTakenByDirectoryIsIoError) {
  const auto dir = fresh_dir("isdir");
  std::filesystem::create_directories(dir / "metrics.jsonl");
  try {
    MetricsWriter writer(dir, true);
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), HasSubstr((dir / "metrics.jsonl").string()));
  }
}

}  // namespace
}  // namespace dtrain::worker
