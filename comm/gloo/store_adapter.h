// gloo's rendezvous store interface over a comm::Store, so gloo's pairs find
// each other through the run's store (with its token and timeouts).
#pragma once

#include <memory>

#include <gloo/rendezvous/store.h>

#include "comm/store.h"

namespace dtrain::comm::gloo_backend {

class StoreAdapter : public ::gloo::rendezvous::Store {
 public:
  // Keys are used as given; scope them with a PrefixStore. `timeout` bounds
  // gloo's waits that carry none.
  StoreAdapter(std::shared_ptr<comm::Store> store, Duration timeout)
      : store_(std::move(store)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  std::shared_ptr<comm::Store> store_;
  Duration timeout_;
};

}  // namespace dtrain::comm::gloo_backend
