// GrpcStore: the Store of a job on the controller's rendezvous service (proto/tessera.proto), used
// by workers to register for their rank and to bootstrap Gloo / NCCL, and by a pod's supervisor to
// report failed ranks and follow the gang's rounds (restarts in place). Calls wait for the service to
// come up (wait-for-ready, reconnect backoff ~50 ms) until their deadline. Errors: a refused token
// or unknown job is CommError with the service's message; a key not written in time is StoreTimeout.
// Thread-safe.
#pragma once

#include <memory>
#include <string>

#include "worker/comm/store.h"

namespace tessera {

class GrpcStore : public Store {
 public:
  // target: "host:port" of the rendezvous service.
  GrpcStore(const std::string& target, std::string job, std::string token);
  ~GrpcStore() override;

  struct Assignment {
    int rank = 0, world_size = 0, local_rank = 0;
    std::string node;
    int64_t generation = 0;
  };
  // Registers process `slot` of pod `replica`, serving /metrics on `metrics_port` (0: none);
  // returns its place in the job.
  Assignment register_worker(int replica, int slot, const std::string& host, int metrics_port, Millis timeout);

  // A pod's supervisor: rank `slot` of pod `replica` ended with `exit_code` in round `round`
  // (`message`: why, at most 4 KiB). Best effort: false when the controller could not be told.
  bool report_exit(int replica, int slot, int exit_code, const std::string& message, int64_t round, Millis timeout);
  // The gang's round, waiting up to `timeout` for one later than `known` (-1: at once); none when the
  // controller cannot be reached or does not serve the job (now).
  std::optional<int64_t> await_round(int64_t known, Millis timeout);

  void set(const std::string& key, const std::string& value) override;
  std::optional<std::string> try_get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  void barrier(const std::string& name, int rank, int count, Millis timeout);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera
