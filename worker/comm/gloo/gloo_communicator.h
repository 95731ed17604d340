// The CPU backend: Gloo's TCP transport, used only for point-to-point transfers (unbound buffers);
// the collectives are ring algorithms written here, so every byte is counted and every wait knows
// which peer it is waiting for. (Gloo's own options-based collectives lack reduce-scatter, and its
// older class-based one hangs when mixed with them on one context.)
//
// Not thread-safe: one thread issues a communicator's operations. Several communicators (world,
// intra-node, inter-node) may share one transport device.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "worker/comm/communicator.h"
#include "worker/comm/topology.h"

namespace gloo {
class Context;
namespace transport {
class Device;
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo

namespace tessera {

class GlooCommunicator final : public Communicator {
 public:
  struct Options {
    std::string group = "world";  // names the group in errors and namespaces its store keys
    Millis timeout{30000};        // rendezvous deadline and default deadline of every operation
    // Transport device; shared by the sub-groups of one process. Created on loopback when null.
    std::shared_ptr<gloo::transport::Device> device;
  };

  // A TCP device bound to TESSERA_GLOO_IFACE (an interface), else TESSERA_POD_IP (the pod's
  // address), else `hostname` (an address or name of this host; "127.0.0.1" for one
  // machine). The TESSERA_GLOO_IFACE environment variable, when set, names an interface instead.
  static std::shared_ptr<gloo::transport::Device> make_device(const std::string& hostname = "127.0.0.1");

  // Joins the group: waits until all members have announced themselves in `store` (throwing
  // CommError naming the ranks that did not join within the timeout), then connects a full mesh.
  // `global_ranks[i]` is the world rank of member i, `rank` this member's index.
  static std::unique_ptr<GlooCommunicator> connect(Store& store, int rank, std::vector<int> global_ranks,
                                                   Options options);
  ~GlooCommunicator() override;

  std::string backend() const override { return "gloo"; }
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
  using Clock = std::chrono::steady_clock;
  struct Op;  // one collective in flight: name, deadline, slot

  GlooCommunicator(std::string group, int rank, std::vector<int> global_ranks, Millis timeout,
                   std::shared_ptr<gloo::Context> context);

  Op begin(const char* name, Millis timeout);
  // Sends `sbytes` to `to` and receives `rbytes` from `from` concurrently on the op's current slot.
  void sendrecv(Op& op, const void* sbuf, size_t sbytes, int to, void* rbuf, size_t rbytes, int from);
  void wait(Op& op, gloo::transport::UnboundBuffer& buf, bool is_send, int peer);
  [[noreturn]] void fail(const std::string& msg);
  // In-place ring reduce-scatter over the segments of `data`; member r ends owning segment r.
  void ring_reduce_scatter(Op& op, char* data, const std::vector<size_t>& counts, DType t, ReduceOp red);
  // In-place ring allgather of the segments of `data`; member r contributes segment r.
  void ring_allgather(Op& op, char* data, const std::vector<size_t>& counts, size_t elem);

  std::shared_ptr<gloo::Context> context_;
  uint64_t seq_ = 0;    // collectives issued; names their slots
  std::string broken_;  // the first failure; non-empty once broken
  std::vector<char> scratch_;
};

// A CommFactory for connect_groups(): Gloo communicators sharing one TCP device on `hostname`.
CommFactory gloo_factory(Millis timeout, std::string hostname = "127.0.0.1");

}  // namespace tessera
