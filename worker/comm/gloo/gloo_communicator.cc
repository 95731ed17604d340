#include "worker/comm/gloo/gloo_communicator.h"

#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "common/error.h"
#include "common/flags.h"

namespace tessera {
namespace {

// Presents a tessera::Store (namespaced) to Gloo's rendezvous.
class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(tessera::Store& store, Millis timeout) : store_(store), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    std::string v = store_.get(key, timeout_);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { store_.wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    store_.wait(keys, timeout.count() > 0 ? Millis(timeout.count()) : timeout_);
  }

 private:
  tessera::Store& store_;
  Millis timeout_;
};

constexpr uint64_t kP2PSlotBit = uint64_t{1} << 62;

}  // namespace

struct GlooCommunicator::Op {
  const char* name;
  Clock::time_point deadline;
  Millis timeout;
  uint64_t slot_base;
  uint32_t step = 0;
  uint64_t slot() const { return slot_base | step; }
};

std::shared_ptr<gloo::transport::Device> GlooCommunicator::make_device(const std::string& hostname) {
  gloo::transport::tcp::attr attr;
  // A pod's peers reach it at its own address (its network namespace is not theirs, even on one
  // node): TESSERA_POD_IP, which the reconcile sets from status.podIP; an emulated node's NIC by name.
  if (const auto iface = env_value("TESSERA_GLOO_IFACE")) {
    attr.iface = *iface;
  } else if (const auto ip = env_value("TESSERA_POD_IP"); ip && !ip->empty()) {
    attr.hostname = *ip;
  } else {
    attr.hostname = hostname;
  }
  try {
    return gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw CommError("gloo: cannot create a TCP device on '" + (attr.iface.empty() ? attr.hostname : attr.iface) +
                    "': " + e.what());
  }
}

GlooCommunicator::GlooCommunicator(std::string group, int rank, std::vector<int> global_ranks, Millis timeout,
                                   std::shared_ptr<gloo::Context> context)
    : Communicator(std::move(group), rank, std::move(global_ranks), timeout), context_(std::move(context)) {}

GlooCommunicator::~GlooCommunicator() = default;

std::unique_ptr<GlooCommunicator> GlooCommunicator::connect(Store& store, int rank, std::vector<int> global_ranks,
                                                            Options options) {
  join_group(store, options.group, rank, global_ranks, options.timeout);
  const int size = static_cast<int>(global_ranks.size());
  PrefixStore ns(options.group, store);
  if (!options.device) options.device = make_device();
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->setTimeout(options.timeout);
  PrefixStore mesh_ns("mesh", ns);
  GlooStoreAdapter adapter(mesh_ns, options.timeout);
  try {
    context->connectFullMesh(adapter, options.device);
  } catch (const std::exception& e) {
    throw CommError(detail::concat("rendezvous of group '", options.group, "' (rank ", rank, " of ", size,
                                   "): connecting the mesh failed: ", e.what()));
  }
  std::unique_ptr<GlooCommunicator> comm(
      new GlooCommunicator(options.group, rank, std::move(global_ranks), options.timeout, std::move(context)));
  // A rank's side of the mesh can be complete while a peer is still finishing its own: without a
  // barrier, a rank that returned and closed its communicator at once would break the peer's connect
  // ("Connection closed by peer"). After it, every member has connected.
  comm->barrier(options.timeout);
  comm->clear_bytes_sent();
  return comm;
}

GlooCommunicator::Op GlooCommunicator::begin(const char* name, Millis timeout) {
  if (!broken_.empty())
    throw CommError(where(name) + ": communicator is unusable after an earlier failure: " + broken_);
  Millis t = resolve(timeout);
  ++seq_;
  return Op{name, Clock::now() + t, t, (seq_ & ((uint64_t{1} << 38) - 1)) << 24};
}

void GlooCommunicator::fail(const std::string& msg) {
  if (broken_.empty()) broken_ = msg;
  throw CommError(msg);
}

void GlooCommunicator::wait(Op& op, gloo::transport::UnboundBuffer& buf, bool is_send, int peer) {
  auto left = std::chrono::duration_cast<Millis>(op.deadline - Clock::now());
  if (left.count() < 1) left = Millis(1);
  std::string why;
  try {
    bool done = is_send ? buf.waitSend(nullptr, left) : buf.waitRecv(nullptr, left);
    if (done) return;
    why = "the operation was aborted";
  } catch (const std::exception& e) {
    why = e.what();
  }
  const std::string peer_name = detail::concat("rank ", peer, " (global ", global_ranks()[peer], ")");
  if (why.find("Timed out") != std::string::npos) {
    fail(detail::concat(where(op.name), ": ", peer_name, " did not answer within ", op.timeout.count(), " ms (",
                        is_send ? "send" : "recv", " pending)"));
  }
  fail(detail::concat(where(op.name), ": lost the connection to ", peer_name, " during ", is_send ? "send" : "recv",
                      ": ", why));
}

void GlooCommunicator::sendrecv(Op& op, const void* sbuf, size_t sbytes, int to, void* rbuf, size_t rbytes, int from) {
  std::unique_ptr<gloo::transport::UnboundBuffer> s, r;
  const uint64_t slot = op.slot();
  ++op.step;
  // Posting fails at once when the connection to the peer is already gone.
  auto lost = [&](int peer, const char* what, const std::exception& e) {
    fail(detail::concat(where(op.name), ": lost the connection to rank ", peer, " (global ", global_ranks()[peer],
                        ") posting a ", what, ": ", e.what()));
  };
  if (rbytes) {
    r = context_->createUnboundBuffer(rbuf, rbytes);
    try {
      r->recv(from, slot);
    } catch (const std::exception& e) {
      lost(from, "recv", e);
    }
  }
  if (sbytes) {
    s = context_->createUnboundBuffer(const_cast<void*>(sbuf), sbytes);
    try {
      s->send(to, slot);
    } catch (const std::exception& e) {
      lost(to, "send", e);
    }
    count_sent(to, sbytes);
  }
  if (r) wait(op, *r, false, from);
  if (s) wait(op, *s, true, to);
}

void GlooCommunicator::ring_reduce_scatter(Op& op, char* data, const std::vector<size_t>& counts, DType t,
                                           ReduceOp red) {
  const int p = size(), me = rank();
  const size_t elem = dtype_size(t);
  std::vector<size_t> offset(p + 1, 0);
  for (int i = 0; i < p; ++i) offset[i + 1] = offset[i] + counts[i] * elem;
  const size_t max_seg = *std::max_element(counts.begin(), counts.end()) * elem;
  if (scratch_.size() < max_seg) scratch_.resize(max_seg);
  const int next = (me + 1) % p, prev = (me + p - 1) % p;
  // Step s: send segment (me-s-1), receive segment (me-s-2) and reduce it; after p-1 steps member
  // `me` holds segment `me` reduced over everyone.
  for (int s = 0; s < p - 1; ++s) {
    const int send_seg = ((me - s - 1) % p + p) % p;
    const int recv_seg = ((me - s - 2) % p + p) % p;
    sendrecv(op, data + offset[send_seg], counts[send_seg] * elem, next, scratch_.data(), counts[recv_seg] * elem,
             prev);
    reduce_into(data + offset[recv_seg], scratch_.data(), counts[recv_seg], t, red);
  }
}

void GlooCommunicator::ring_allgather(Op& op, char* data, const std::vector<size_t>& counts, size_t elem) {
  const int p = size(), me = rank();
  std::vector<size_t> offset(p + 1, 0);
  for (int i = 0; i < p; ++i) offset[i + 1] = offset[i] + counts[i] * elem;
  const int next = (me + 1) % p, prev = (me + p - 1) % p;
  for (int s = 0; s < p - 1; ++s) {
    const int send_seg = ((me - s) % p + p) % p;
    const int recv_seg = ((me - s - 1) % p + p) % p;
    sendrecv(op, data + offset[send_seg], counts[send_seg] * elem, next, data + offset[recv_seg],
             counts[recv_seg] * elem, prev);
  }
}

void GlooCommunicator::allreduce(void* data, size_t count, DType t, ReduceOp red, Millis timeout) {
  Op op = begin("allreduce", timeout);
  if (size() == 1 || count == 0) return;
  auto counts = even_split(count, size());
  ring_reduce_scatter(op, static_cast<char*>(data), counts, t, red);
  ring_allgather(op, static_cast<char*>(data), counts, dtype_size(t));
}

void GlooCommunicator::reduce_scatter(const void* in, void* out, const std::vector<size_t>& counts, DType t,
                                      ReduceOp red, Millis timeout) {
  Op op = begin("reduce_scatter", timeout);
  const int p = size(), me = rank();
  if (static_cast<int>(counts.size()) != p)
    throw std::invalid_argument(
        detail::concat(where("reduce_scatter"), ": ", counts.size(), " counts for ", p, " members"));
  const size_t elem = dtype_size(t);
  const char* src = static_cast<const char*>(in);
  std::vector<size_t> offset(p + 1, 0);
  for (int i = 0; i < p; ++i) offset[i + 1] = offset[i] + counts[i] * elem;
  if (p == 1) {
    if (counts[0]) std::memcpy(out, src, counts[0] * elem);
    return;
  }
  // The ring of ring_reduce_scatter, out of place: the input is read, never copied whole. Each
  // step receives the neighbour's partial sum straight into a segment buffer (the two alternate:
  // one is sent while the other receives) and adds this member's part there; the last lands in `out`.
  const size_t max_seg = *std::max_element(counts.begin(), counts.end()) * elem;
  if (scratch_.size() < 2 * max_seg) scratch_.resize(2 * max_seg);
  char* partial[2] = {scratch_.data(), scratch_.data() + max_seg};
  const int next = (me + 1) % p, prev = (me + p - 1) % p;
  const char* send_ptr = src + offset[((me - 1) % p + p) % p];
  for (int s = 0; s < p - 1; ++s) {
    const int send_seg = ((me - s - 1) % p + p) % p;
    const int recv_seg = ((me - s - 2) % p + p) % p;
    const size_t rbytes = counts[recv_seg] * elem;
    char* dst = s == p - 2 ? static_cast<char*>(out) : partial[s % 2];
    sendrecv(op, send_ptr, counts[send_seg] * elem, next, dst, rbytes, prev);
    if (rbytes) reduce_into(dst, src + offset[recv_seg], counts[recv_seg], t, red);
    send_ptr = dst;
  }
}

void GlooCommunicator::allgatherv(const void* in, void* out, const std::vector<size_t>& counts, DType t,
                                  Millis timeout) {
  Op op = begin("allgather", timeout);
  if (static_cast<int>(counts.size()) != size())
    throw std::invalid_argument(
        detail::concat(where("allgather"), ": ", counts.size(), " counts for ", size(), " members"));
  const size_t elem = dtype_size(t);
  size_t mine = 0;
  for (int i = 0; i < rank(); ++i) mine += counts[i];
  char* o = static_cast<char*>(out);
  if (counts[rank()] && o + mine * elem != in) std::memmove(o + mine * elem, in, counts[rank()] * elem);
  if (size() > 1) ring_allgather(op, o, counts, elem);
}

void GlooCommunicator::broadcast(void* data, size_t count, DType t, int root, Millis timeout) {
  Op op = begin("broadcast", timeout);
  if (root < 0 || root >= size())
    throw std::invalid_argument(detail::concat(where("broadcast"), ": root ", root, " is not a member"));
  const size_t bytes = count * dtype_size(t);
  if (size() == 1 || bytes == 0) return;
  if (rank() != root) {
    sendrecv(op, nullptr, 0, 0, data, bytes, root);
    return;
  }
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> sends;
  const uint64_t slot = op.slot();
  for (int r = 0; r < size(); ++r) {
    if (r == root) continue;
    sends.push_back(context_->createUnboundBuffer(data, bytes));
    try {
      sends.back()->send(r, slot);
    } catch (const std::exception& e) {
      fail(detail::concat(where(op.name), ": lost the connection to rank ", r, " (global ", global_ranks()[r],
                          ") posting a send: ", e.what()));
    }
    count_sent(r, bytes);
  }
  int i = 0;
  for (int r = 0; r < size(); ++r)
    if (r != root) wait(op, *sends[i++], true, r);
}

void GlooCommunicator::send(const void* data, size_t bytes, int peer, uint32_t tag, Millis timeout) {
  if (!broken_.empty())
    throw CommError(where("send") + ": communicator is unusable after an earlier failure: " + broken_);
  if (peer < 0 || peer >= size() || peer == rank())
    throw std::invalid_argument(detail::concat(where("send"), ": invalid peer ", peer));
  Millis t = resolve(timeout);
  Op op{"send", Clock::now() + t, t, kP2PSlotBit | (uint64_t{tag} << 24)};
  sendrecv(op, data, bytes, peer, nullptr, 0, peer);
}

void GlooCommunicator::recv(void* data, size_t bytes, int peer, uint32_t tag, Millis timeout) {
  if (!broken_.empty())
    throw CommError(where("recv") + ": communicator is unusable after an earlier failure: " + broken_);
  if (peer < 0 || peer >= size() || peer == rank())
    throw std::invalid_argument(detail::concat(where("recv"), ": invalid peer ", peer));
  Millis t = resolve(timeout);
  Op op{"recv", Clock::now() + t, t, kP2PSlotBit | (uint64_t{tag} << 24)};
  sendrecv(op, nullptr, 0, peer, data, bytes, peer);
}

void GlooCommunicator::sendrecv(const void* sdata, size_t sbytes, int to, void* rdata, size_t rbytes, int from,
                                uint32_t tag, Millis timeout) {
  if (!broken_.empty())
    throw CommError(where("sendrecv") + ": communicator is unusable after an earlier failure: " + broken_);
  for (int peer : {to, from})
    if (peer < 0 || peer >= size() || peer == rank())
      throw std::invalid_argument(detail::concat(where("sendrecv"), ": invalid peer ", peer));
  Millis t = resolve(timeout);
  Op op{"sendrecv", Clock::now() + t, t, kP2PSlotBit | (uint64_t{tag} << 24)};
  sendrecv(op, sdata, sbytes, to, rdata, rbytes, from);
}

void GlooCommunicator::barrier(Millis timeout) {
  Op op = begin("barrier", timeout);
  // Dissemination barrier: round k signals rank+2^k and waits for rank-2^k.
  uint8_t out = 1, in = 0;
  for (int dist = 1; dist < size(); dist *= 2) {
    sendrecv(op, &out, 1, (rank() + dist) % size(), &in, 1, (rank() - dist + size()) % size());
  }
}

CommFactory gloo_factory(Millis timeout, std::string hostname) {
  auto device = std::make_shared<std::shared_ptr<gloo::transport::Device>>();
  return [=](Store& store, const std::string& group, int rank, std::vector<int> members) {
    if (!*device) *device = GlooCommunicator::make_device(hostname);
    GlooCommunicator::Options o;
    o.group = group;
    o.timeout = timeout;
    o.device = *device;
    return std::unique_ptr<Communicator>(GlooCommunicator::connect(store, rank, std::move(members), o));
  };
}

}  // namespace tessera
