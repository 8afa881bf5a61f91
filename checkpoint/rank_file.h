// Reading back one range record of a rank file, shared by read_range and
// verify_step. Internal to checkpoint/.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "checkpoint/env.h"
#include "proto/checkpoint.pb.h"

namespace dtrain::checkpoint {

// Streams the record's bytes from dir/record.file() in bounded chunks and
// returns their crc32c. When `out` is non-null, also copies the record's
// elements [copy_begin, copy_begin + copy_count) (record-relative) to `out`.
std::uint32_t read_record(Env& env, const std::filesystem::path& dir, const RangeRecord& record,
                          std::int64_t copy_begin, std::int64_t copy_count, float* out);

// "rank_00001.bin, tensor exp_avg, block 3, elements [0, 100)": for messages.
std::string describe(const RangeRecord& record);
std::string hex32(std::uint32_t v);

}  // namespace dtrain::checkpoint
