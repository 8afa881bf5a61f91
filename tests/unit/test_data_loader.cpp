// Loader: order, world-size independence, prefetch equivalence, positions,
// reset, errors and timeouts of the producer thread.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <numeric>
#include <set>
#include <thread>
#include <vector>

#include "core/error.h"
#include "data/loader.h"
#include "data/token_stream_dataset.h"

namespace dtrain::data {
namespace {

using namespace std::chrono_literals;
constexpr auto kWait = 5000ms;

// A stream whose token at position p is p % 60000, so a window's first token
// tells which window it is.
std::shared_ptr<const Dataset> counting_dataset(int64_t n_tokens, int seq_len) {
  auto stream = std::make_shared<std::vector<uint16_t>>(static_cast<std::size_t>(n_tokens));
  for (int64_t i = 0; i < n_tokens; ++i)
    (*stream)[static_cast<std::size_t>(i)] = static_cast<uint16_t>(i % 60000);
  return std::make_shared<TokenStreamDataset>(stream, 0, n_tokens, seq_len, 60000, "counting");
}

// The window each row of the next `batches` batches starts at.
std::vector<int64_t> read_windows(Loader& loader, int batches) {
  std::vector<int64_t> windows;
  for (int b = 0; b < batches; ++b) {
    const Batch& batch = loader.next(kWait);
    for (int r = 0; r < batch.rows; ++r)
      windows.push_back(batch.tokens[static_cast<std::size_t>(r * batch.seq_len)] / batch.seq_len);
  }
  return windows;
}

LoaderOptions options(int micro_batch, int rank, int world, bool shuffle, int prefetch,
                      int64_t start = 0) {
  LoaderOptions o;
  o.micro_batch = micro_batch;
  o.rank = rank;
  o.world = world;
  o.seed = 11;
  o.shuffle = shuffle;
  o.prefetch = prefetch;
  o.start = start;
  return o;
}

TEST(Loader, UnshuffledRowsFollowDesignOrderAndTargetsAreShifted) {
  auto ds = counting_dataset(8 * 20 + 1, 8);      // 20 windows
  Loader loader(ds, options(3, 1, 2, false, 2));  // rank 1 of 2, B = 3
  const Batch& b0 = loader.next(kWait);
  EXPECT_EQ(b0.first_sample, 3);
  for (int r = 0; r < 3; ++r) {
    for (int t = 0; t < 8; ++t) {
      EXPECT_EQ(b0.tokens[r * 8 + t], (3 + r) * 8 + t);
      EXPECT_EQ(b0.targets[r * 8 + t], (3 + r) * 8 + t + 1);
    }
  }
  // Global batches of 6 samples; rank 1 reads samples 6g+3..6g+5, wrapping at 20.
  EXPECT_EQ(read_windows(loader, 3), (std::vector<int64_t>{9, 10, 11, 15, 16, 17, 1, 2, 3}));
}

TEST(Loader, TwoRanksOfTwoMatchOneRankOfFour) {
  auto ds = counting_dataset(4 * 23 + 1, 4);  // 23 windows: batches straddle epochs
  for (bool shuffle : {false, true}) {
    Loader r0(ds, options(2, 0, 2, shuffle, 2));
    Loader r1(ds, options(2, 1, 2, shuffle, 1));
    Loader single(ds, options(4, 0, 1, shuffle, 0));
    for (int g = 0; g < 30; ++g) {
      std::vector<int64_t> both = read_windows(r0, 1);
      const std::vector<int64_t> second = read_windows(r1, 1);
      both.insert(both.end(), second.begin(), second.end());
      ASSERT_EQ(both, read_windows(single, 1)) << "global batch " << g << " shuffle " << shuffle;
    }
    EXPECT_EQ(r0.position(), single.position());
  }
}

TEST(Loader, PrefetchGivesTheSameSequenceAsSynchronous) {
  auto ds = counting_dataset(16 * 50 + 1, 16);
  Loader sync(ds, options(4, 0, 1, true, 0));
  Loader async(ds, options(4, 0, 1, true, 3));
  for (int b = 0; b < 40; ++b) {  // > 3 epochs of 50 windows
    const Batch& x = sync.next(kWait);
    const Batch& y = async.next(kWait);
    ASSERT_EQ(x.tokens, y.tokens) << "batch " << b;
    ASSERT_EQ(x.targets, y.targets);
    ASSERT_EQ(x.first_sample, y.first_sample);
  }
}

TEST(Loader, ShuffledEpochReadsEveryWindowOnce) {
  auto ds = counting_dataset(4 * 24 + 1, 4);  // 24 windows = 6 batches of 4
  Loader loader(ds, options(4, 0, 1, true, 2));
  std::vector<int64_t> epoch0 = read_windows(loader, 6);
  std::vector<int64_t> epoch1 = read_windows(loader, 6);
  EXPECT_NE(epoch0, epoch1);
  for (auto* e : {&epoch0, &epoch1}) {
    std::vector<int64_t> sorted = *e;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> all(24);
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(sorted, all);
  }
}

TEST(Loader, PositionCountsGlobalSamplesAndResumes) {
  auto ds = counting_dataset(8 * 100 + 1, 8);
  Loader loader(ds, options(2, 1, 3, true, 2, /*start=*/5));
  EXPECT_EQ(loader.position(), 5);
  read_windows(loader, 7);
  EXPECT_EQ(loader.position(), 5 + 7 * 3 * 2);
  // Resuming at the saved position, even on another world size, continues the
  // global order: world 3 x B 2 -> world 1 x B 6 reads the same next samples.
  Loader resumed(ds, options(6, 0, 1, true, 0, loader.position()));
  const std::vector<int64_t> all = read_windows(resumed, 1);
  const std::vector<int64_t> mine = read_windows(loader, 1);
  EXPECT_EQ(mine, (std::vector<int64_t>{all[2], all[3]}));
}

TEST(Loader, ResetRewindsForEvaluation) {
  auto ds = counting_dataset(8 * 40 + 1, 8);
  Loader val(ds, options(4, 0, 1, false, 2));
  const std::vector<int64_t> first = read_windows(val, 3);
  read_windows(val, 2);
  val.reset(0);
  EXPECT_EQ(val.position(), 0);
  EXPECT_EQ(read_windows(val, 3), first);
  val.reset(8);
  EXPECT_EQ(read_windows(val, 1), (std::vector<int64_t>{8, 9, 10, 11}));
}

TEST(Loader, SlotsAreReusedNotReallocated) {
  auto ds = counting_dataset(8 * 40 + 1, 8);
  Loader loader(ds, options(4, 0, 1, true, 2));
  std::set<const void*> slots;
  std::set<const void*> buffers;
  for (int i = 0; i < 50; ++i) {
    const Batch& b = loader.next(kWait);
    slots.insert(&b);
    buffers.insert(b.tokens.data());
  }
  EXPECT_EQ(slots.size(), 3u);  // prefetch + the one held
  EXPECT_EQ(buffers.size(), 3u);
}

// Fills like `inner`, but throws DataError for window `bad` and can be slowed down.
class FaultyDataset final : public Dataset {
 public:
  FaultyDataset(std::shared_ptr<const Dataset> inner, int64_t bad, std::chrono::milliseconds delay)
      : Dataset(inner->info()), inner_(std::move(inner)), bad_(bad), delay_(delay) {}
  int64_t size() const override { return inner_->size(); }
  void fill(int64_t index, Batch& batch, int row) const override {
    if (delay_.count() > 0) std::this_thread::sleep_for(delay_);
    if (index == bad_) throw DataError("window " + std::to_string(index) + " is unreadable");
    inner_->fill(index, batch, row);
  }

 private:
  std::shared_ptr<const Dataset> inner_;
  int64_t bad_;
  std::chrono::milliseconds delay_;
};

TEST(Loader, ProducerExceptionSurfacesInNext) {
  auto ds = std::make_shared<FaultyDataset>(counting_dataset(8 * 40 + 1, 8), 9, 0ms);
  for (int prefetch : {0, 2}) {
    Loader loader(ds, options(4, 0, 1, false, prefetch));
    EXPECT_EQ(read_windows(loader, 2), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
    try {
      loader.next(kWait);
      ADD_FAILURE() << "expected DataError, prefetch " << prefetch;
    } catch (const DataError& e) {
      EXPECT_NE(std::string(e.what()).find("window 9 is unreadable"), std::string::npos);
    }
    EXPECT_THROW(loader.next(kWait), DataError);  // stays failed
    loader.reset(12);                             // past the bad window: works again
    EXPECT_EQ(read_windows(loader, 1), (std::vector<int64_t>{12, 13, 14, 15}));
  }
}

TEST(Loader, SlowProducerTimesOutNamingTheLoader) {
  auto ds = std::make_shared<FaultyDataset>(counting_dataset(8 * 40 + 1, 8), -1, 50ms);
  LoaderOptions o = options(2, 0, 1, false, 1);
  o.name = "val";
  Loader loader(ds, o);
  try {
    loader.next(1ms);
    ADD_FAILURE() << "expected TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("data loader 'val'"), std::string::npos) << e.what();
  }
  // The batch still arrives; nothing was lost.
  EXPECT_EQ(read_windows(loader, 1), (std::vector<int64_t>{0, 1}));
}

TEST(Loader, RejectsBadOptions) {
  auto ds = counting_dataset(100, 8);
  EXPECT_THROW(Loader(ds, options(0, 0, 1, false, 1)), ConfigError);
  EXPECT_THROW(Loader(ds, options(1, 0, 1, false, -1)), ConfigError);
  EXPECT_THROW(Loader(ds, options(1, 2, 2, false, 1)), Error);
}

}  // namespace
}  // namespace dtrain::data
