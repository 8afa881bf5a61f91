// Reading and writing llm.c token shards (layout in token_shard_format.h).
// Free functions, no shared state: callable from any thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace dtrain::data {

// Reads one shard fully into memory. Throws IoError when the file is missing
// or unreadable, DataError (naming the file) on a wrong magic, an unsupported
// version, or a size that disagrees with the header's token count.
std::vector<uint16_t> read_token_shard(const std::string& path);

// Appends one shard's tokens to `out` (no intermediate copy). Same errors as
// read_token_shard.
void append_token_shard(const std::string& path, std::vector<uint16_t>& out);

// Writes `tokens` as a shard at `path` (replacing it). Throws IoError on an I/O
// failure, DataError when there are more tokens than the header can count.
void write_token_shard(const std::string& path, std::span<const uint16_t> tokens);

// The shard files that `pattern` names, sorted: a directory means every *.bin
// in it; otherwise a glob(3) pattern (a plain path matches itself). Throws
// IoError naming the pattern when nothing matches.
std::vector<std::string> expand_shard_paths(const std::string& pattern);

// Throws DataError naming `file`, the first offending token, its position and
// the fix when any token is >= vocab_size.
void check_token_range(std::span<const uint16_t> tokens, int vocab_size, const std::string& file);

// Every shard of `pattern` (see expand_shard_paths) concatenated into one
// stream, each shard checked against vocab_size (skipped when vocab_size <= 0).
std::vector<uint16_t> read_token_shards(const std::string& pattern, int vocab_size);

}  // namespace dtrain::data
