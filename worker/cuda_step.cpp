#include "worker/cuda_step.h"

#include <cuda_runtime_api.h>

#include "nn/cuda/check.h"
#include "nn/cuda/transformer.h"
#include "sharding/cuda/device_engine.h"

namespace dtrain::worker {
namespace {

// The compute stream: non-blocking, so that nothing on the legacy default
// stream (another library's) serialises with it.
class Stream {
 public:
  Stream() { DTRAIN_CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~Stream() {
    if (stream_ != nullptr) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

class CudaStepImpl final : public CudaStep {
 public:
  CudaStepImpl(const nn::ModelConfig& model, const nn::ParameterLayout& layout, sharding::Engine& host,
               const CudaStepOptions& o)
      : engine_(layout, host, o.device_comm, o.world_size,
                sharding::cuda::DeviceEngineOptions{o.bucket_mb, model.compute, o.reduce}, stream_.get()),
        model_(model, layout, o.micro_batch, o.seq_len, stream_.get()) {
    model_.bind(engine_.pointers());
  }
  ~CudaStepImpl() override = default;

  void begin_step() override {
    engine_.begin_step();
    model_.reset_result();
  }

  void micro_batch(const nn::ModelInputs& inputs, const nn::StepKey& key, bool sync,
                   float loss_factor) override {
    engine_.set_sync(sync);
    model_.forward(inputs, engine_, true, key);
    model_.backward(engine_, loss_factor);
  }

  CudaStepResult finish_step(const nn::AdamWHyper& hyper, std::int64_t adam_step, float max_norm) override {
    engine_.finish_backward();
    CudaStepResult r;
    r.grad_norm = engine_.grad_norm(max_norm);  // synchronises the stream
    r.loss = model_.collect().loss;  // the stream is idle: reads the pinned copy; throws on a bad target
    r.applied = engine_.step(hyper, adam_step);
    return r;
  }

  void begin_eval() override { model_.reset_result(); }
  void eval_batch(const nn::ModelInputs& inputs) override {
    model_.forward(inputs, no_hooks_, false, nn::StepKey{});
  }
  nn::ForwardResult end_eval() override { return model_.collect(); }

  float loss_scale() const override { return engine_.loss_scale(); }
  void download_state(sharding::Engine& host) override { engine_.download_state(host); }
  void upload_state(sharding::Engine& host) override { engine_.upload_state(host); }
  std::int64_t device_bytes() const override { return engine_.device_bytes() + model_.activation_bytes(); }

 private:
  Stream stream_;  // declared first: destroyed last
  sharding::cuda::DeviceEngine engine_;
  nn::cuda::Transformer model_;
  nn::BlockHooks no_hooks_;  // evaluation communicates nothing
};

}  // namespace

std::unique_ptr<CudaStep> make_cuda_step(const nn::ModelConfig& model, const nn::ParameterLayout& layout,
                                         sharding::Engine& host, const CudaStepOptions& options) {
  return std::make_unique<CudaStepImpl>(model, layout, host, options);
}

}  // namespace dtrain::worker
