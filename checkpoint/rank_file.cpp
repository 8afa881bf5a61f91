#include "checkpoint/rank_file.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "core/crc32c.h"
#include "checkpoint/shard_format.h"
#include "core/error.h"

namespace dtrain::checkpoint {
namespace fs = std::filesystem;
namespace {

// Bounds the memory a read of a partly wanted record needs.
constexpr std::size_t kChunkBytes = std::size_t{8} << 20;

std::string step_name(std::int64_t step) { return fmt::format("{}{:09d}", kStepPrefix, step); }

}  // namespace

fs::path step_dir(const fs::path& root, std::int64_t step) { return root / step_name(step); }

fs::path pending_dir(const fs::path& root, std::int64_t step) {
  return root / fmt::format("{}{:09d}", kPendingPrefix, step);
}

std::string rank_file_name(int rank) { return fmt::format("rank_{:05d}.bin", rank); }

std::optional<std::int64_t> parse_step_name(const std::string& name) {
  std::string_view digits = name;
  if (digits.starts_with(kPendingPrefix)) {
    digits.remove_prefix(kPendingPrefix.size());
  } else if (digits.starts_with(kStepPrefix)) {
    digits.remove_prefix(kStepPrefix.size());
  } else {
    return std::nullopt;
  }
  std::int64_t step = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (ec != std::errc() || end != digits.data() + digits.size() || digits.empty() || step < 0) {
    return std::nullopt;
  }
  return step;
}

std::string hex32(std::uint32_t v) { return fmt::format("0x{:08x}", v); }

std::string describe(const RangeRecord& r) {
  return fmt::format("{}, tensor {}, block {}, elements [{}, {})", r.file(), r.tensor(), r.block(),
                     r.begin(), r.begin() + r.count());
}

RankFileRecord write_rank_file(Env& env, const fs::path& pending, int rank,
                               const std::vector<RangeData>& ranges) {
  env.create_directories(pending);
  RankFileRecord result{rank_file_name(rank), rank, 0, {}};
  const fs::path path = pending / result.file;
  auto file = env.new_writable_file(path);
  std::array<unsigned char, kShardDataOffset> head{};
  encode_shard_header({kShardVersion, static_cast<std::uint32_t>(rank), ranges.size()}, head.data());
  file->append(head.data(), head.size());
  std::uint64_t offset = kShardDataOffset;
  static constexpr std::array<unsigned char, kShardAlignment> kZeros{};
  for (const RangeData& rd : ranges) {
    DTRAIN_CHECK(rd.range.count >= 0 && (rd.data != nullptr || rd.range.count == 0),
                 "range of tensor {} block {} in rank {}", rd.range.tensor, rd.range.block, rank);
    if (offset != align_up(offset)) {
      file->append(kZeros.data(), align_up(offset) - offset);
      offset = align_up(offset);
    }
    const std::size_t bytes = static_cast<std::size_t>(rd.range.count) * sizeof(float);
    if (bytes > 0) file->append(rd.data, bytes);
    result.ranges.push_back({rd.range, rank, result.file, offset, crc32c(rd.data, bytes)});
    offset += bytes;
  }
  file->sync();
  file->close();
  result.size = offset;
  env.sync_dir(pending);  // the file's entry; the commit's fsync of root makes the directory durable
  return result;
}

void add_records(const RankFileRecord& record, Manifest* manifest) {
  FileRecord* f = manifest->add_files();
  f->set_name(record.file);
  f->set_size(record.size);
  f->set_rank(record.rank);
  for (const auto& r : record.ranges) {
    checkpoint::RangeRecord* out = manifest->add_ranges();
    out->set_tensor(r.range.tensor);
    out->set_block(r.range.block);
    out->set_begin(r.range.begin);
    out->set_count(r.range.count);
    out->set_rank(r.rank);
    out->set_file(r.file);
    out->set_offset(r.offset);
    out->set_crc32c(r.crc32c);
  }
}

std::uint32_t read_record(Env& env, const fs::path& dir, const RangeRecord& record,
                          std::int64_t copy_begin, std::int64_t copy_count, float* out) {
  const fs::path path = dir / record.file();
  const std::uint64_t bytes = static_cast<std::uint64_t>(record.count()) * sizeof(float);
  std::vector<unsigned char> chunk(std::min<std::uint64_t>(bytes, kChunkBytes));
  const auto copy_first = static_cast<std::uint64_t>(copy_begin) * sizeof(float);
  const auto copy_end = copy_first + static_cast<std::uint64_t>(copy_count) * sizeof(float);
  std::uint32_t crc = 0;
  for (std::uint64_t done = 0; done < bytes;) {
    const std::uint64_t n = std::min<std::uint64_t>(chunk.size(), bytes - done);
    env.read(path, record.offset() + done, n, chunk.data());
    crc = crc32c(chunk.data(), n, crc);
    const std::uint64_t lo = std::max(done, copy_first);
    const std::uint64_t hi = std::min(done + n, copy_end);
    if (out != nullptr && lo < hi) {
      std::memcpy(reinterpret_cast<unsigned char*>(out) + (lo - copy_first), chunk.data() + (lo - done),
                  hi - lo);
    }
    done += n;
  }
  return crc;
}

namespace {

// The records of wanted's tensor and block that overlap it, by begin.
std::vector<const RangeRecord*> overlapping(const Manifest& manifest, const Range& wanted) {
  std::vector<const RangeRecord*> found;
  const std::int64_t end = wanted.begin + wanted.count;
  for (const RangeRecord& r : manifest.ranges()) {
    if (r.tensor() == wanted.tensor && r.block() == wanted.block && r.begin() < end &&
        r.begin() + r.count() > wanted.begin) {
      found.push_back(&r);
    }
  }
  std::sort(found.begin(), found.end(),
            [](const RangeRecord* a, const RangeRecord* b) { return a->begin() < b->begin(); });
  return found;
}

std::string crc_mismatch(const fs::path& dir, const RangeRecord& record, std::uint32_t found) {
  return fmt::format("checkpoint '{}': {}: crc32c expected {} found {}", dir.string(), describe(record),
                     hex32(record.crc32c()), hex32(found));
}

// Checksums pieces of records on its own thread, in the order they are
// added, comparing each record's crc when its last piece is in. The reader
// keeps reading meanwhile; the pieces stay where the reader put them.
class BackgroundChecker {
 public:
  explicit BackgroundChecker(const fs::path& dir) : dir_(dir), thread_([this] { run(); }) {}
  BackgroundChecker(const BackgroundChecker&) = delete;
  BackgroundChecker& operator=(const BackgroundChecker&) = delete;
  ~BackgroundChecker() { finish(); }

  void add(const RangeRecord* record, const void* data, std::size_t n, bool last) {
    {
      std::lock_guard lock(mutex_);
      pieces_.push_back({record, data, n, last});
    }
    wake_.notify_one();
  }

  // Waits until every piece added is checked; the first mismatch, or "".
  std::string finish() {
    {
      std::lock_guard lock(mutex_);
      closed_ = true;
    }
    wake_.notify_one();
    if (thread_.joinable()) thread_.join();
    return problem_;
  }

 private:
  struct Piece {
    const RangeRecord* record;
    const void* data;
    std::size_t n;
    bool last;
  };

  void run() {
    std::uint32_t crc = 0;
    for (;;) {
      Piece piece{};
      {
        std::unique_lock lock(mutex_);
        // No timeout needed: the reader either adds pieces or closes, and
        // finish() (also run by the destructor) always closes.
        wake_.wait(lock, [&] { return closed_ || !pieces_.empty(); });
        if (pieces_.empty()) return;
        piece = pieces_.front();
        pieces_.pop_front();
      }
      if (!problem_.empty()) continue;  // only the first mismatch is reported
      crc = crc32c(piece.data, piece.n, crc);
      if (!piece.last) continue;
      if (crc != piece.record->crc32c()) {
        problem_ = crc_mismatch(dir_, *piece.record, crc);
      }
      crc = 0;
    }
  }

  fs::path dir_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Piece> pieces_;
  bool closed_ = false;
  std::string problem_;  // written by the thread only, read after the join
  std::thread thread_;   // last: starts after everything it uses exists
};

// Reads the whole record straight into `out` in bounded pieces. With a
// checker, the pieces are checksummed behind the reads and 0 is returned;
// without, returns their crc32c.
std::uint32_t read_whole_record(Env& env, const fs::path& dir, const RangeRecord& record, float* out,
                                BackgroundChecker* checker) {
  const fs::path path = dir / record.file();
  const std::uint64_t bytes = static_cast<std::uint64_t>(record.count()) * sizeof(float);
  auto* p = reinterpret_cast<unsigned char*>(out);
  if (bytes == 0 && checker != nullptr) checker->add(&record, p, 0, true);
  std::uint32_t crc = 0;
  for (std::uint64_t done = 0; done < bytes;) {
    const std::uint64_t n = std::min<std::uint64_t>(kChunkBytes, bytes - done);
    env.read(path, record.offset() + done, n, p + done);
    if (checker != nullptr) {
      checker->add(&record, p + done, n, done + n == bytes);
    } else {
      crc = crc32c(p + done, n, crc);
    }
    done += n;
  }
  return crc;
}

// Fills `out` from the records overlapping `wanted`. A record wanted whole
// is read straight into `out` (checked behind the reads when there is a
// checker); a partly wanted one is streamed and checked here.
void fill_range(Env& env, const fs::path& dir, const Manifest& manifest, const Range& wanted, float* out,
                BackgroundChecker* checker) {
  if (wanted.begin < 0 || wanted.count < 0) {
    throw Error(fmt::format("read_range: tensor {} block {}: bad range [{}, +{})", wanted.tensor,
                            wanted.block, wanted.begin, wanted.count));
  }
  const std::vector<const RangeRecord*> records = overlapping(manifest, wanted);
  const std::int64_t end = wanted.begin + wanted.count;
  std::int64_t next = wanted.begin;
  std::size_t i = 0;
  while (next < end) {
    // Of the records starting at or before `next`, read from the one reaching furthest.
    const RangeRecord* best = nullptr;
    for (; i < records.size() && records[i]->begin() <= next; ++i) {
      if (best == nullptr || records[i]->begin() + records[i]->count() > best->begin() + best->count()) {
        best = records[i];
      }
    }
    if (best == nullptr || best->begin() + best->count() <= next) {
      const std::int64_t gap_end = i < records.size() ? std::min(records[i]->begin(), end) : end;
      throw IoError(fmt::format("checkpoint '{}': tensor {} block {} elements [{}, {}) are in no rank file",
                                dir.string(), wanted.tensor, wanted.block, next, gap_end));
    }
    const std::int64_t stop = std::min(end, best->begin() + best->count());
    float* dest = out + (next - wanted.begin);
    const bool whole = next == best->begin() && stop == best->begin() + best->count();
    const std::uint32_t found = whole ? read_whole_record(env, dir, *best, dest, checker)
                                      : read_record(env, dir, *best, next - best->begin(), stop - next, dest);
    if ((!whole || checker == nullptr) && found != best->crc32c()) {
      throw IoError(crc_mismatch(dir, *best, found));
    }
    next = stop;
  }
}

}  // namespace

void read_range(Env& env, const fs::path& dir, const Manifest& manifest, const Range& wanted,
                float* out) {
  fill_range(env, dir, manifest, wanted, out, nullptr);
}

void read_ranges(Env& env, const fs::path& dir, const Manifest& manifest,
                 const std::vector<RangeTarget>& wanted) {
  BackgroundChecker checker(dir);
  try {
    for (const RangeTarget& t : wanted) fill_range(env, dir, manifest, t.range, t.out, &checker);
  } catch (const Error&) {
    // A mismatch the checker found came earlier in read order than this.
    const std::string problem = checker.finish();
    if (!problem.empty()) throw IoError(problem);
    throw;
  }
  const std::string problem = checker.finish();
  if (!problem.empty()) throw IoError(problem);
}

}  // namespace dtrain::checkpoint
