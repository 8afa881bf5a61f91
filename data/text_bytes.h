// Plain text as bytes: every byte is one token (vocab 256), so any text file
// or folder of files (e.g. Debian's fortunes) trains a byte-level LM.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::data {

inline constexpr int kTextVocabSize = 256;

// The files `path` stands for: the file itself, or every regular file directly
// in the directory, sorted by name, skipping fortune's index files (*.dat,
// *.u8). Throws IoError naming the path (and, for the fortunes folder, the
// package to install) when it is missing or holds no file.
std::vector<std::string> list_text_files(const std::string& path);

// The bytes of list_text_files(path), concatenated in order, one token each.
// Throws IoError on unreadable files, DataError when they are all empty.
std::vector<uint16_t> read_text_bytes(const std::string& path);

}  // namespace dtrain::data
