// The tiny LM config the multi-process tests train: small enough for 4 ranks
// on 2 cores in a few seconds; dropout on, so that equal metrics also mean
// equal dropout masks.
#pragma once

#include <string>

namespace dtrain::testing {

// 20 steps of micro-batch 4, with `grad_accum_steps` micro-batches a step and
// `timeout_s` for every collective.
inline std::string tiny_lm_json(int grad_accum_steps, int timeout_s) {
  return std::string(R"({
  "model": {"kind": "lm", "vocab_size": 64, "d_model": 32, "n_heads": 2, "n_layers": 2,
            "d_ff": 64, "max_seq_len": 16, "dropout": 0.1},
  "data": {"kind": "synthetic", "seq_len": 16},
  "optimizer": {"lr": 3e-3, "grad_clip": 1.0},
  "schedule": {"warmup_steps": 5},
  "train": {"steps": 20, "micro_batch_size": 4, "grad_accum_steps": )") +
         std::to_string(grad_accum_steps) + R"(, "log_every": 1,
            "eval_every": 10, "eval_batches": 2},
  "parallel": {"timeout_s": )" + std::to_string(timeout_s) + "}\n}";
}

// The same model without dropout or evaluation, one rank's plain run:
// `steps` steps, warmup `warmup`, a progress line every `log_every`.
inline std::string quiet_tiny_lm_json(int steps, int warmup, int log_every) {
  return R"({
  "model": {"kind": "lm", "vocab_size": 64, "d_model": 32, "n_heads": 2, "n_layers": 2,
            "d_ff": 64, "max_seq_len": 16},
  "data": {"kind": "synthetic", "seq_len": 16},
  "optimizer": {"lr": 3e-3},
  "schedule": {"warmup_steps": )" +
         std::to_string(warmup) + R"(},
  "train": {"steps": )" + std::to_string(steps) + R"(, "micro_batch_size": 4, "log_every": )" +
         std::to_string(log_every) + R"(, "eval_every": 0, "eval_batches": 2}
})";
}

// What the multi-process worker, mpirun and Slurm tests train.
inline const std::string kTinyLm = tiny_lm_json(2, 30);

}  // namespace dtrain::testing
