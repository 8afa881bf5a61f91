// dtrain-generate --checkpoint DIR [--prompt TEXT] [--max-new-tokens N]
//                 [--temperature T] [--top-k K] [--seed S] [--recompute]
// Samples from a language model checkpoint (tools/generate.h). Prints the
// prompt and the new text (or token ids) on stdout; with --stats, the time
// and tokens/s on stderr.
#include <iostream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "core/command_line.h"
#include "core/openmp_wait.h"
#include "tools/generate.h"

int main(int argc, char** argv) {
  dtrain::choose_openmp_wait_policy(argv);  // first: it may execute the program again
  CLI::App app{"dtrain-generate: sample from a dtrain language model checkpoint"};
  dtrain::tools::GenerateOptions o;
  bool stats = false;
  app.add_option("--checkpoint", o.checkpoint, "checkpoint root or step directory")->required();
  app.add_option("--prompt", o.prompt, "text (byte models) or token ids (\"12 7 301\")");
  app.add_option("--max-new-tokens", o.max_new_tokens, "tokens to generate")->capture_default_str();
  app.add_option("--temperature", o.temperature, "0: greedy; higher: more random")->capture_default_str();
  app.add_option("--top-k", o.top_k, "sample among the k most likely tokens (0: all)")->capture_default_str();
  app.add_option("--seed", o.seed, "the same seed gives the same text")->capture_default_str();
  app.add_flag("--recompute", o.recompute, "recompute the whole prefix for each token (no cache; for comparison)");
  app.add_flag("--stats", stats, "print the time and tokens/s on stderr");
  if (const auto code = dtrain::parse_args(app, argc, argv, "dtrain-generate")) return *code;
  return dtrain::run_main("dtrain-generate", [&] {
    const dtrain::tools::Generated g = dtrain::tools::generate(o);
    if (g.text) std::cout << std::string(g.prompt.begin(), g.prompt.end());
    std::cout << dtrain::tools::render(g) << std::endl;
    if (!g.note.empty()) std::cerr << "dtrain-generate: " << g.note << "\n";
    if (stats) {
      std::cerr << fmt::format("new_tokens: {}\nseconds: {:.4f}\ntokens_per_s: {:.1f}\n", g.tokens.size(), g.seconds,
                               g.seconds > 0.0 ? static_cast<double>(g.tokens.size()) / g.seconds : 0.0);
    }
    return 0;
  });
}
