// Every gradient-exchange strategy over world sizes 1..8 and node shapes, one thread per rank, with
// fp32 and bf16 on the wire: results equal the reference sum, sparse strategies at density 1 equal
// dense, error feedback conserves the gradient across ranks and steps, and uneven nodes are
// rejected where required. bf16 on the wire: within bf16's rounding of fp32, half the bytes.
#include "worker/comm/exchange.h"

#include <gtest/gtest.h>

#include <map>
#include <mutex>

#include "common/error.h"
#include "testing/rank_threads.h"
#include "worker/comm/gloo/gloo_communicator.h"
#include "worker/nn/kernels.h"

namespace tessera {
namespace {

using testing::rethrow_first;
using testing::run_ranks;

// Small integers, so every summation order gives the same float, and bf16 holds every sum exactly.
float grad_value(int rank, int step, size_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + rank * 13 + step * 5 + (i * i) % 29) % 23) - 11);
}

struct Shape {
  int nodes, local;
};

std::string shape_name(const ::testing::TestParamInfo<Shape>& p) {
  return std::to_string(p.param.nodes) + "x" + std::to_string(p.param.local);
}

class ExchangeTest : public ::testing::TestWithParam<Shape> {};

TEST_P(ExchangeTest, StrategiesMatchReferenceSum) {
  const Shape shape = GetParam();
  const int world = shape.nodes * shape.local;
  MemoryStore store;
  const std::vector<size_t> sizes = {0, 1, 5, 17, 1000, 4099};
  std::mutex mu;
  std::map<std::string, std::vector<float>> first_result;  // bitwise identical on every rank
  rethrow_first(run_ranks(world, [&](int r) {
    CommGroups g = connect_groups(store, Topology::grid(shape.nodes, shape.local), r, gloo_factory(Millis(20000)));
    for (const char* s : {"dense", "torus", "topk", "hitopk"}) {
      for (const auto& [density, wire] : {std::pair{1.0, DType::kFloat32}, std::pair{0.05, DType::kFloat32},
                                          std::pair{1.0, DType::kBFloat16}, std::pair{0.05, DType::kBFloat16}}) {
        if ((s == std::string("dense") || s == std::string("torus")) && density < 1.0) continue;
        auto ex = make_exchange(ExchangeConfig{s, density, "mstopk", Device::kCpu, wire}, g);
        for (size_t d : sizes) {
          const int bucket = static_cast<int>(d);
          std::vector<float> total_out(d, 0.0f), total_in(d, 0.0f);
          for (int step = 0; step < 3; ++step) {
            std::vector<float> grad(d), want(d, 0.0f);
            for (size_t i = 0; i < d; ++i) {
              grad[i] = grad_value(r, step, i);
              for (int q = 0; q < world; ++q) want[i] += grad_value(q, step, i);
              total_in[i] += want[i];
            }
            ExchangeStats st = ex->exchange(bucket, grad);
            for (size_t i = 0; i < d; ++i) total_out[i] += grad[i];
            if (density == 1.0) {
              ASSERT_EQ(grad, want) << s << " d=" << d << " step " << step;
            }
            ASSERT_LE(st.selected, density < 1.0 ? topk_count(d, density) : d) << s;
            // The selection is part of the call's time, and only sparse strategies select.
            const bool sparse = s == std::string("topk") || s == std::string("hitopk");
            ASSERT_GE(st.select_seconds, 0.0) << s;
            ASSERT_LE(st.select_seconds, st.seconds) << s;
            if (!sparse) {
              ASSERT_EQ(st.select_seconds, 0.0) << s;
            }
            std::lock_guard<std::mutex> lock(mu);
            auto key = std::string(s) + "/" + std::to_string(density) + "/" + dtype_name(wire) + "/" +
                       std::to_string(d) + "/" + std::to_string(step);
            auto [it, inserted] = first_result.emplace(key, grad);
            if (!inserted) {
              ASSERT_EQ(it->second, grad) << "ranks disagree on " << key;
            }
          }
          // Conservation: every rank's residual, plus everything delivered, is everything put in.
          std::vector<float> residual(d, 0.0f);
          ex->add_residual(bucket, residual);
          g.world->allreduce(std::span<float>(residual));
          for (size_t i = 0; i < d; ++i)
            ASSERT_EQ(total_out[i] + residual[i], total_in[i])
                << s << " density " << density << " " << dtype_name(wire) << " d=" << d << " i=" << i;
        }
      }
    }
  }));
}

INSTANTIATE_TEST_SUITE_P(Shapes, ExchangeTest,
                         ::testing::Values(Shape{1, 1}, Shape{1, 2}, Shape{2, 1}, Shape{3, 1}, Shape{1, 3}, Shape{1, 4},
                                           Shape{4, 1}, Shape{2, 2}, Shape{2, 3}, Shape{3, 2}, Shape{4, 2}, Shape{2, 4},
                                           Shape{8, 1}),
                         shape_name);

// A gradient of several million floats crosses the torus in chunks, pipelined over the intra- and
// inter-node communicators (a helper thread on the latter): still the exact sum on every rank.
TEST(ExchangeTorusTest, LargeGradientsArePipelinedInChunksAndStayExact) {
  for (Shape shape : {Shape{2, 2}, Shape{3, 2}}) {
    const int world = shape.nodes * shape.local;
    const size_t d = 3 * (size_t{1} << 20) + 7;  // 3 chunks, uneven
    MemoryStore store;
    rethrow_first(run_ranks(world, [&](int r) {
      CommGroups g = connect_groups(store, Topology::grid(shape.nodes, shape.local), r, gloo_factory(Millis(20000)));
      auto ex = make_exchange(ExchangeConfig{"torus", 1.0, "mstopk"}, g);
      for (int step = 0; step < 2; ++step) {
        std::vector<float> grad(d);
        for (size_t i = 0; i < d; ++i) grad[i] = grad_value(r, step, i);
        ex->exchange(0, grad);
        for (size_t i = 0; i < d; ++i) {
          float want = 0;
          for (int q = 0; q < world; ++q) want += grad_value(q, step, i);
          ASSERT_EQ(grad[i], want) << shape.nodes << "x" << shape.local << " rank " << r << " i=" << i;
        }
      }
    }));
  }
}

TEST(ExchangeConfigTest, UnevenNodesRejectedOnlyWhereRequired) {
  // Node a has ranks 0 and 1, node b has rank 2.
  MemoryStore store;
  Topology topo({{"a", 0}, {"a", 1}, {"b", 0}});
  rethrow_first(run_ranks(3, [&](int r) {
    CommGroups g = connect_groups(store, topo, r, gloo_factory(Millis(20000)));
    for (const char* s : {"torus", "hitopk"}) {
      try {
        make_exchange(ExchangeConfig{s, 0.01, "mstopk"}, g);
        ADD_FAILURE() << s << " accepted uneven nodes";
      } catch (const ConfigError& e) {
        EXPECT_EQ(e.field(), "communication.strategy");
        EXPECT_NE(std::string(e.what()).find("same number of ranks on every node"), std::string::npos);
      }
    }
    for (const char* s : {"dense", "topk"}) {
      auto ex = make_exchange(ExchangeConfig{s, 1.0, "exact"}, g);
      std::vector<float> x(10, static_cast<float>(r + 1));
      ex->exchange(0, x);
      for (float v : x) ASSERT_EQ(v, 6.0f) << s;
    }
  }));
}

TEST(ExchangeConfigTest, BadConfigurationNamesTheField) {
  MemoryStore store;
  CommGroups g = connect_groups(store, Topology::grid(1, 1), 0, gloo_factory(Millis(5000)));
  auto field_of = [&](ExchangeConfig c) {
    try {
      make_exchange(c, g);
    } catch (const ConfigError& e) {
      return e.field();
    }
    return std::string("accepted");
  };
  EXPECT_EQ(field_of({"ring", 0.01, "mstopk"}), "communication.strategy");
  EXPECT_EQ(field_of({"topk", 0.0, "mstopk"}), "communication.density");
  EXPECT_EQ(field_of({"topk", 1.5, "mstopk"}), "communication.density");
  EXPECT_EQ(field_of({"topk", 0.1, "sort"}), "communication.selector");
  EXPECT_EQ(field_of({"topk", 0.1, "exact"}), "accepted");
  EXPECT_EQ(field_of({"torus", 1.0, "exact", Device::kCpu, DType::kBFloat16}), "accepted");
  EXPECT_EQ(field_of({"dense", 1.0, "exact", Device::kCuda, DType::kBFloat16}), "communication.gradientPrecision");
}

// Gradients that bf16 does not hold: with bf16 on the wire every strategy's sum is within bf16's
// rounding of the fp32 sum (each value rounded once, each partial sum of the rings once more: at
// most world rounds of 2^-9 of the largest partial sum), every rank gets the same bits, dense and
// torus send exactly half the bytes of fp32 and the sparse pairs 6 bytes of 8; the sparse
// strategies' residual keeps what rounding left out, so the gradient is still conserved.
TEST(ExchangeBf16Test, WithinBf16RoundingOfFp32AtHalfTheBytes) {
  const Shape shape{2, 2};
  const int world = 4;
  const size_t d = 3001;
  auto value = [](int rank, int step, size_t i) {
    return std::sin(0.37f * static_cast<float>(i) + 1.3f * rank + 0.7f * step) * (1.0f + (i % 5) * 0.013f);
  };
  MemoryStore store;
  std::mutex mu;
  std::map<std::string, std::vector<float>> first_result;
  std::map<std::string, uint64_t> bytes_fp32, bytes_bf16;
  rethrow_first(run_ranks(world, [&](int r) {
    CommGroups g = connect_groups(store, Topology::grid(shape.nodes, shape.local), r, gloo_factory(Millis(20000)));
    for (const char* s : {"dense", "torus", "topk", "hitopk"}) {
      const double density = std::string(s) == "topk" || std::string(s) == "hitopk" ? 0.1 : 1.0;
      auto fp32 = make_exchange(ExchangeConfig{s, density, "exact"}, g);
      auto bf16 = make_exchange(ExchangeConfig{s, density, "exact", Device::kCpu, DType::kBFloat16}, g);
      std::vector<double> total_in(d, 0.0), total_out(d, 0.0);
      for (int step = 0; step < 3; ++step) {
        std::vector<float> a(d), b(d);
        for (size_t i = 0; i < d; ++i) {
          a[i] = b[i] = value(r, step, i);
          for (int q = 0; q < world; ++q) total_in[i] += value(q, step, i);
        }
        const ExchangeStats sa = fp32->exchange(0, a), sb = bf16->exchange(0, b);
        for (size_t i = 0; i < d; ++i) total_out[i] += b[i];
        if (density == 1.0) {
          for (size_t i = 0; i < d; ++i) {
            float bound = 0;
            for (int q = 0; q < world; ++q) bound += std::abs(value(q, step, i));
            ASSERT_NEAR(b[i], a[i], world * bound * 0x1p-8f) << s << " step " << step << " i=" << i;
          }
        }
        std::lock_guard<std::mutex> lock(mu);
        bytes_fp32[s] += sa.bytes.intra + sa.bytes.inter;
        bytes_bf16[s] += sb.bytes.intra + sb.bytes.inter;
        auto [it, inserted] = first_result.emplace(std::string(s) + std::to_string(step), b);
        if (!inserted) {
          ASSERT_EQ(it->second, b) << "ranks disagree on " << s << " step " << step;
        }
      }
      if (density == 1.0) continue;
      std::vector<float> residual(d, 0.0f);
      bf16->add_residual(0, residual);
      g.world->allreduce(std::span<float>(residual));
      for (size_t i = 0; i < d; ++i)
        ASSERT_NEAR(total_out[i] + residual[i], total_in[i], 1e-4 * (1 + std::abs(total_in[i]))) << s << " i=" << i;
    }
  }));
  EXPECT_EQ(2 * bytes_bf16["dense"], bytes_fp32["dense"]);
  EXPECT_EQ(2 * bytes_bf16["torus"], bytes_fp32["torus"]);
  // topk sends only pairs; hitopk's reduce-scatter inside the node stays fp32.
  EXPECT_EQ(8 * bytes_bf16["topk"], 6 * bytes_fp32["topk"]);
  EXPECT_LT(bytes_bf16["hitopk"], bytes_fp32["hitopk"]);
}

TEST(ExchangeBytesTest, HierarchicalTopkSendsLittleBetweenNodes) {
  const int nodes = 2, local = 2, world = 4;
  const size_t d = 200000;
  MemoryStore store;
  std::vector<std::map<std::string, LinkBytes>> bytes(world);
  rethrow_first(run_ranks(world, [&](int r) {
    CommGroups g = connect_groups(store, Topology::grid(nodes, local), r, gloo_factory(Millis(20000)));
    for (const char* s : {"dense", "torus", "topk", "hitopk"}) {
      auto ex = make_exchange(ExchangeConfig{s, 0.001, "mstopk"}, g);
      std::vector<float> x(d);
      for (size_t i = 0; i < d; ++i) x[i] = grad_value(r, 0, i) * (1.0f + i % 7);
      bytes[r][s] = ex->exchange(0, x).bytes;
    }
  }));
  auto inter = [&](const char* s) {
    uint64_t sum = 0;
    for (int r = 0; r < world; ++r) sum += bytes[r][s].inter;
    return sum;
  };
  // dense: the world ring crosses nodes twice; the two boundary ranks each send 2(p-1)/p * 4d bytes.
  EXPECT_EQ(inter("dense"), 2 * (2 * 3 * (d / 4) * 4));
  // torus: every rank all-reduces its d/2 shard with one peer on the other node.
  EXPECT_EQ(inter("torus"), 4 * ((d / 2) / 2 * 2 * 4));
  // hitopk: every rank sends its k = 0.001 * d/2 pairs of 8 bytes to the other node.
  EXPECT_EQ(inter("hitopk"), 4 * (topk_count(d / 2, 0.001) * 8));
  EXPECT_LE(inter("hitopk") * 50, inter("dense"));
  EXPECT_GT(bytes[0]["hitopk"].intra, 0u);
}

}  // namespace
}  // namespace tessera
