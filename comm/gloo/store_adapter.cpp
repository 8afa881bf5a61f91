#include "comm/gloo/store_adapter.h"

namespace dtrain::comm::gloo_backend {

void StoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  store_->set(key, Bytes(data.begin(), data.end()));
}

std::vector<char> StoreAdapter::get(const std::string& key) {
  const Bytes value = store_->get(key, timeout_);
  return std::vector<char>(value.begin(), value.end());
}

void StoreAdapter::wait(const std::vector<std::string>& keys) { store_->wait(keys, timeout_); }

void StoreAdapter::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  store_->wait(keys, timeout);
}

}  // namespace dtrain::comm::gloo_backend
