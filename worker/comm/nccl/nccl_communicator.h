// The GPU backend: NCCL collectives on a CUDA stream (built when NCCL is found; TESSERA_HAVE_NCCL).
// Buffers are device pointers. Rendezvous: members join through the Store (join_group), rank 0
// publishes the NCCL unique id there. Deadlines: every operation polls its stream and the
// communicator's async error until the deadline, then aborts the communicator and throws CommError
// (NCCL cannot tell which peer is missing, so the message names the group and its members).
// Uneven reduce-scatter / all-gather segments use grouped ncclReduce / ncclBroadcast per segment.
// Byte counters follow the ring schedule NCCL uses. Not thread-safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "worker/comm/communicator.h"
#include "worker/comm/topology.h"

namespace tessera {

class NcclCommunicator final : public Communicator {
 public:
  struct Options {
    std::string group = "world";
    Millis timeout{30000};
    int device = 0;  // CUDA device ordinal of this rank
  };
  static std::unique_ptr<NcclCommunicator> connect(Store& store, int rank, std::vector<int> global_ranks,
                                                   Options options);
  ~NcclCommunicator() override;

  std::string backend() const override { return "nccl"; }
  using Communicator::allgather;  // the typed wrappers
  using Communicator::allreduce;
  using Communicator::broadcast;
  void allreduce(void* data, size_t count, DType t, ReduceOp op, Millis timeout) override;
  void reduce_scatter(const void* in, void* out, const std::vector<size_t>& counts, DType t, ReduceOp op,
                      Millis timeout) override;
  void allgatherv(const void* in, void* out, const std::vector<size_t>& counts, DType t, Millis timeout) override;
  void broadcast(void* data, size_t count, DType t, int root, Millis timeout) override;
  void send(const void* data, size_t bytes, int peer, uint32_t tag, Millis timeout) override;
  void recv(void* data, size_t bytes, int peer, uint32_t tag, Millis timeout) override;
  void sendrecv(const void* sdata, size_t sbytes, int to, void* rdata, size_t rbytes, int from, uint32_t tag,
                Millis timeout) override;
  void barrier(Millis timeout) override;

 private:
  struct Impl;
  NcclCommunicator(std::string group, int rank, std::vector<int> global_ranks, Millis timeout,
                   std::unique_ptr<Impl> impl);
  void check_usable(const char* op) const;
  // Waits for the stream until the deadline; aborts and throws CommError on timeout or async error.
  void complete(const char* op, Millis timeout);
  void count_ring(size_t bytes) {
    if (size() > 1) count_sent((rank() + 1) % size(), bytes);
  }

  std::unique_ptr<Impl> impl_;
  std::string broken_;
};

// A CommFactory for connect_groups(): NCCL communicators on CUDA device `device`.
CommFactory nccl_factory(Millis timeout, int device);

}  // namespace tessera
