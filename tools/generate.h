// dtrain-generate: samples text from an LM checkpoint with the native forward
// and a key/value cache (nn::Model::decode): the prompt fills the cache once,
// then each new token costs one position. Byte-level text models (data.kind
// "text") read and print text; token models read and print token ids.
// Errors are ConfigError (naming the option or field) or IoError (naming the
// checkpoint).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace dtrain::tools {

struct GenerateOptions {
  std::filesystem::path checkpoint;  // a checkpoint root or step directory
  std::string prompt;                // text, or token ids ("12 7 301"); empty: a newline (text models)
  int max_new_tokens = 128;
  double temperature = 1.0;          // 0: greedy (the most likely token)
  int top_k = 0;                     // sample among the k most likely tokens; 0: all
  std::uint64_t seed = 0;
  bool recompute = false;            // recompute the whole prefix for every token (no cache; for comparison)
};

struct Generated {
  std::vector<std::int32_t> prompt;  // the tokens the prompt became
  std::vector<std::int32_t> tokens;  // the new ones
  bool text = false;                 // byte-level text model
  std::string note;                  // what was adjusted (e.g. fewer tokens than asked, at max_seq_len)
  double seconds = 0.0;              // time spent generating the new tokens
};

Generated generate(const GenerateOptions& options);

// The new tokens as the model's data reads: text (bytes), or ids separated by spaces.
std::string render(const Generated& generated);

// The next token from the last position's logits [vocab]: argmax when
// temperature is 0, else a sample of softmax(logits / temperature) among the
// top_k most likely (0: all), drawn with `uniform` in [0, 1).
std::int32_t pick_token(const float* logits, std::int64_t vocab, double temperature, int top_k, double uniform);

}  // namespace dtrain::tools
