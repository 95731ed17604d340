#include "worker/comm/nccl/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "common/error.h"

namespace tessera {
namespace {

ncclDataType_t to_nccl(DType t) {
  switch (t) {
    case DType::kFloat32: return ncclFloat32;
    case DType::kFloat64: return ncclFloat64;
    case DType::kInt32: return ncclInt32;
    case DType::kInt64: return ncclInt64;
    case DType::kUInt8: return ncclUint8;
    case DType::kBFloat16: return ncclBfloat16;
  }
  return ncclUint8;
}

ncclRedOp_t to_nccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  return ncclSum;
}

std::string to_hex(const void* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    unsigned char c = static_cast<const unsigned char*>(p)[i];
    s += digits[c >> 4];
    s += digits[c & 15];
  }
  return s;
}

void from_hex(const std::string& s, void* p, size_t n) {
  if (s.size() != 2 * n) throw CommError("nccl: malformed unique id in the store");
  auto val = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  for (size_t i = 0; i < n; ++i) static_cast<unsigned char*>(p)[i] = (val(s[2 * i]) << 4) | val(s[2 * i + 1]);
}

}  // namespace

struct NcclCommunicator::Impl {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
};

NcclCommunicator::NcclCommunicator(std::string group, int rank, std::vector<int> global_ranks, Millis timeout,
                                   std::unique_ptr<Impl> impl)
    : Communicator(std::move(group), rank, std::move(global_ranks), timeout), impl_(std::move(impl)) {}

NcclCommunicator::~NcclCommunicator() {
  if (impl_->comm) {
    if (broken_.empty()) {
      ncclCommDestroy(impl_->comm);
    } else {
      ncclCommAbort(impl_->comm);
    }
  }
  if (impl_->stream) cudaStreamDestroy(impl_->stream);
}

std::unique_ptr<NcclCommunicator> NcclCommunicator::connect(Store& store, int rank, std::vector<int> global_ranks,
                                                            Options o) {
  join_group(store, o.group, rank, global_ranks, o.timeout);
  PrefixStore ns(o.group, store);
  ncclUniqueId id;
  if (rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) throw CommError(std::string("nccl: ncclGetUniqueId: ") + ncclGetErrorString(r));
    ns.set("nccl_id", to_hex(&id, sizeof(id)));
  } else {
    from_hex(ns.get("nccl_id", o.timeout), &id, sizeof(id));
  }
  auto impl = std::make_unique<Impl>();
  if (cudaSetDevice(o.device) != cudaSuccess ||
      cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking) != cudaSuccess)
    throw CommError(detail::concat("nccl: cannot use CUDA device ", o.device));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&impl->comm, static_cast<int>(global_ranks.size()), id, rank, &config);
  auto deadline = std::chrono::steady_clock::now() + o.timeout;
  while (r == ncclInProgress) {
    if (std::chrono::steady_clock::now() > deadline) {
      ncclCommAbort(impl->comm);
      throw CommError(detail::concat("rendezvous of group '", o.group, "' (rank ", rank,
                                     "): NCCL initialisation did not finish within ", o.timeout.count(), " ms"));
    }
    std::this_thread::sleep_for(Millis(1));
    ncclCommGetAsyncError(impl->comm, &r);
  }
  if (r != ncclSuccess) throw CommError(std::string("nccl: ncclCommInitRank: ") + ncclGetErrorString(r));
  return std::unique_ptr<NcclCommunicator>(
      new NcclCommunicator(o.group, rank, std::move(global_ranks), o.timeout, std::move(impl)));
}

void NcclCommunicator::check_usable(const char* op) const {
  if (!broken_.empty()) throw CommError(where(op) + ": communicator is unusable after an earlier failure: " + broken_);
}

void NcclCommunicator::complete(const char* op, Millis timeout) {
  const Millis t = resolve(timeout);
  const auto deadline = std::chrono::steady_clock::now() + t;
  for (;;) {
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(impl_->comm, &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      broken_ = where(op) + ": " + ncclGetErrorString(async);
      throw CommError(broken_);
    }
    cudaError_t s = cudaStreamQuery(impl_->stream);
    if (s == cudaSuccess) return;
    if (s != cudaErrorNotReady) {
      broken_ = where(op) + ": CUDA error " + cudaGetErrorString(s);
      throw CommError(broken_);
    }
    if (std::chrono::steady_clock::now() > deadline) {
      broken_ = detail::concat(where(op), ": not complete within ", t.count(),
                               " ms; a member of the group did not answer (NCCL does not say which)");
      ncclCommAbort(impl_->comm);
      impl_->comm = nullptr;
      throw CommError(broken_);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

#define TESSERA_NCCL(op, call)                             \
  do {                                                     \
    ncclResult_t r_ = (call);                              \
    if (r_ != ncclSuccess && r_ != ncclInProgress) {       \
      broken_ = where(op) + ": " + ncclGetErrorString(r_); \
      throw CommError(broken_);                            \
    }                                                      \
  } while (0)

void NcclCommunicator::allreduce(void* data, size_t count, DType t, ReduceOp op, Millis timeout) {
  check_usable("allreduce");
  TESSERA_NCCL("allreduce", ncclAllReduce(data, data, count, to_nccl(t), to_nccl(op), impl_->comm, impl_->stream));
  count_ring(2 * (size() - 1) * count * dtype_size(t) / size());
  complete("allreduce", timeout);
}

void NcclCommunicator::reduce_scatter(const void* in, void* out, const std::vector<size_t>& counts, DType t,
                                      ReduceOp op, Millis timeout) {
  check_usable("reduce_scatter");
  const size_t elem = dtype_size(t);
  size_t off = 0, total = 0;
  for (size_t c : counts) total += c;
  TESSERA_NCCL("reduce_scatter", ncclGroupStart());
  for (int r = 0; r < size(); ++r) {
    void* dst = r == rank() ? out : nullptr;
    TESSERA_NCCL("reduce_scatter", ncclReduce(static_cast<const char*>(in) + off * elem, dst, counts[r], to_nccl(t),
                                              to_nccl(op), r, impl_->comm, impl_->stream));
    off += counts[r];
  }
  TESSERA_NCCL("reduce_scatter", ncclGroupEnd());
  count_ring((size() - 1) * total * elem / size());
  complete("reduce_scatter", timeout);
}

void NcclCommunicator::allgatherv(const void* in, void* out, const std::vector<size_t>& counts, DType t,
                                  Millis timeout) {
  check_usable("allgather");
  const size_t elem = dtype_size(t);
  size_t off = 0, total = 0;
  TESSERA_NCCL("allgather", ncclGroupStart());
  for (int r = 0; r < size(); ++r) {
    char* dst = static_cast<char*>(out) + off * elem;
    const void* src = r == rank() ? in : dst;
    TESSERA_NCCL("allgather", ncclBroadcast(src, dst, counts[r], to_nccl(t), r, impl_->comm, impl_->stream));
    off += counts[r];
    total += counts[r];
  }
  TESSERA_NCCL("allgather", ncclGroupEnd());
  count_ring((total - counts[rank()]) * elem);
  complete("allgather", timeout);
}

void NcclCommunicator::broadcast(void* data, size_t count, DType t, int root, Millis timeout) {
  check_usable("broadcast");
  TESSERA_NCCL("broadcast", ncclBroadcast(data, data, count, to_nccl(t), root, impl_->comm, impl_->stream));
  if ((rank() + 1) % size() != root) count_ring(count * dtype_size(t));
  complete("broadcast", timeout);
}

void NcclCommunicator::send(const void* data, size_t bytes, int peer, uint32_t, Millis timeout) {
  check_usable("send");
  TESSERA_NCCL("send", ncclSend(data, bytes, ncclUint8, peer, impl_->comm, impl_->stream));
  count_sent(peer, bytes);
  complete("send", timeout);
}

void NcclCommunicator::recv(void* data, size_t bytes, int peer, uint32_t, Millis timeout) {
  check_usable("recv");
  TESSERA_NCCL("recv", ncclRecv(data, bytes, ncclUint8, peer, impl_->comm, impl_->stream));
  complete("recv", timeout);
}

void NcclCommunicator::sendrecv(const void* sdata, size_t sbytes, int to, void* rdata, size_t rbytes, int from,
                                uint32_t, Millis timeout) {
  check_usable("sendrecv");
  TESSERA_NCCL("sendrecv", ncclGroupStart());
  if (sbytes) TESSERA_NCCL("sendrecv", ncclSend(sdata, sbytes, ncclUint8, to, impl_->comm, impl_->stream));
  if (rbytes) TESSERA_NCCL("sendrecv", ncclRecv(rdata, rbytes, ncclUint8, from, impl_->comm, impl_->stream));
  TESSERA_NCCL("sendrecv", ncclGroupEnd());
  if (sbytes) count_sent(to, sbytes);
  complete("sendrecv", timeout);
}

void NcclCommunicator::barrier(Millis timeout) {
  check_usable("barrier");
  float* d = nullptr;
  if (cudaMallocAsync(&d, sizeof(float), impl_->stream) != cudaSuccess) throw CommError(where("barrier") + ": alloc");
  cudaMemsetAsync(d, 0, sizeof(float), impl_->stream);
  TESSERA_NCCL("barrier", ncclAllReduce(d, d, 1, ncclFloat32, ncclSum, impl_->comm, impl_->stream));
  cudaFreeAsync(d, impl_->stream);
  complete("barrier", timeout);
}

CommFactory nccl_factory(Millis timeout, int device) {
  return [=](Store& store, const std::string& group, int rank, std::vector<int> members) {
    NcclCommunicator::Options o;
    o.group = group;
    o.timeout = timeout;
    o.device = device;
    return std::unique_ptr<Communicator>(NcclCommunicator::connect(store, rank, std::move(members), o));
  };
}

}  // namespace tessera
