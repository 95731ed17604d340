#include "worker/comm/communicator.h"

#include <algorithm>

#include "common/error.h"
#include "worker/nn/kernels.h"

namespace tessera {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kFloat32: return 4;
    case DType::kFloat64: return 8;
    case DType::kInt32: return 4;
    case DType::kInt64: return 8;
    case DType::kUInt8: return 1;
    case DType::kBFloat16: return 2;
  }
  TESSERA_CHECK(false, "unknown dtype ", static_cast<int>(t));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kUInt8: return "uint8";
    case DType::kBFloat16: return "bfloat16";
  }
  return "?";
}

namespace {

template <typename T>
void reduce_typed(T* __restrict out, const T* __restrict in, size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      for (size_t i = 0; i < n; ++i) out[i] += in[i];
      return;
    case ReduceOp::kMax:
      for (size_t i = 0; i < n; ++i) out[i] = std::max(out[i], in[i]);
      return;
    case ReduceOp::kMin:
      for (size_t i = 0; i < n; ++i) out[i] = std::min(out[i], in[i]);
      return;
  }
}

// bf16 entries: each pair combined in fp32 and the result rounded to nearest even.
void reduce_bf16(uint16_t* __restrict out, const uint16_t* __restrict in, size_t n, ReduceOp op) {
  for (size_t i = 0; i < n; ++i) {
    const float a = kernels::bf16_value(out[i]), b = kernels::bf16_value(in[i]);
    const float r = op == ReduceOp::kSum ? a + b : op == ReduceOp::kMax ? std::max(a, b) : std::min(a, b);
    out[i] = kernels::bf16_bits(r);
  }
}

}  // namespace

void reduce_into(void* out, const void* in, size_t count, DType t, ReduceOp op) {
  switch (t) {
    case DType::kFloat32: return reduce_typed(static_cast<float*>(out), static_cast<const float*>(in), count, op);
    case DType::kFloat64: return reduce_typed(static_cast<double*>(out), static_cast<const double*>(in), count, op);
    case DType::kInt32: return reduce_typed(static_cast<int32_t*>(out), static_cast<const int32_t*>(in), count, op);
    case DType::kInt64: return reduce_typed(static_cast<int64_t*>(out), static_cast<const int64_t*>(in), count, op);
    case DType::kUInt8: return reduce_typed(static_cast<uint8_t*>(out), static_cast<const uint8_t*>(in), count, op);
    case DType::kBFloat16: return reduce_bf16(static_cast<uint16_t*>(out), static_cast<const uint16_t*>(in), count, op);
  }
}

std::vector<size_t> even_split(size_t total, int parts) {
  TESSERA_CHECK(parts > 0, "parts=", parts);
  std::vector<size_t> counts(parts, total / parts);
  for (size_t i = 0; i < total % parts; ++i) counts[i] += 1;
  return counts;
}

void join_group(Store& store, const std::string& group, int rank, const std::vector<int>& global_ranks,
                Millis timeout) {
  const int size = static_cast<int>(global_ranks.size());
  if (size <= 0 || rank < 0 || rank >= size)
    throw ConfigError("rank", detail::concat(rank, " is outside group '", group, "' of ", size, " ranks"));
  PrefixStore ns(group, store);
  ns.set("joined/" + std::to_string(rank), std::to_string(global_ranks[rank]));
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back("joined/" + std::to_string(r));
  try {
    ns.wait(keys, timeout);
  } catch (const StoreTimeout&) {
    std::string missing;
    int n = 0;
    for (int r = 0; r < size; ++r) {
      if (ns.try_get(keys[r])) continue;
      missing += detail::concat(n++ ? ", " : "", r, " (global ", global_ranks[r], ")");
    }
    throw CommError(detail::concat("rendezvous of group '", group, "' (", size, " ranks; this is rank ", rank,
                                   ", global ", global_ranks[rank], "): rank", n > 1 ? "s " : " ", missing,
                                   " did not join within ", timeout.count(), " ms"));
  }
}

Communicator::Communicator(std::string group, int rank, std::vector<int> global_ranks, Millis default_timeout)
    : group_(std::move(group)),
      rank_(rank),
      global_ranks_(std::move(global_ranks)),
      default_timeout_(default_timeout),
      bytes_sent_(new std::atomic<uint64_t>[global_ranks_.size()]) {
  TESSERA_CHECK(rank_ >= 0 && rank_ < size(), "rank ", rank_, " outside group of ", size());
  for (int i = 0; i < size(); ++i) bytes_sent_[i] = 0;
}

std::vector<uint64_t> Communicator::bytes_sent() const {
  std::vector<uint64_t> out(size());
  for (int i = 0; i < size(); ++i) out[i] = bytes_sent_[i].load(std::memory_order_relaxed);
  return out;
}

void Communicator::allgather(const void* in, void* out, size_t count, DType t, Millis timeout) {
  allgatherv(in, out, std::vector<size_t>(size(), count), t, timeout);
}

std::string Communicator::where(const char* op) const {
  return detail::concat(op, " on group '", group_, "' (rank ", rank_, " of ", size(), ", global rank ",
                        global_ranks_[rank_], ")");
}

void Communicator::check_size(const char* op, size_t got, size_t want) {
  if (got != want) throw std::invalid_argument(detail::concat(op, ": buffer has ", got, " elements, needs ", want));
}

}  // namespace tessera
