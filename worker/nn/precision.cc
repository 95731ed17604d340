#include "worker/nn/precision.h"

#include <oneapi/dnnl/dnnl.h>

#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "worker/nn/dnnl_util.h"
#include "worker/nn/kernels.h"

namespace tessera {

Precision parse_precision(const std::string& name, const std::string& field) {
  if (name == "fp32") return Precision::kFp32;
  if (name == "bf16") return Precision::kBf16;
  throw ConfigError(field, "'" + name + "': expected fp32 or bf16");
}

const char* precision_name(Precision p) { return p == Precision::kBf16 ? "bf16" : "fp32"; }

namespace {

const char* isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41: return "SSE4.1";
    case dnnl::cpu_isa::avx: return "AVX";
    case dnnl::cpu_isa::avx2: return "AVX2";
    case dnnl::cpu_isa::avx2_vnni: return "AVX2 with VNNI";
    case dnnl::cpu_isa::avx512_core: return "AVX-512";
    case dnnl::cpu_isa::avx512_core_vnni: return "AVX-512 with VNNI";
    case dnnl::cpu_isa::avx512_core_bf16: return "AVX-512 BF16";
    case dnnl::cpu_isa::avx512_core_amx: return "AMX";
    default: return "an instruction set below AVX-512";
  }
}

bool at_least(dnnl::cpu_isa have, dnnl::cpu_isa want) {
  // The ISA values are bit masks, each a superset of the ones below it.
  return (static_cast<unsigned>(have) & static_cast<unsigned>(want)) == static_cast<unsigned>(want);
}

}  // namespace

void require_bf16_cpu() {
  const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
  if (!at_least(isa, dnnl::cpu_isa::avx512_core))
    throw ConfigError("spec.training.precision",
                      detail::concat("bf16 needs a CPU with AVX-512 (oneDNN's bf16 kernels); this one offers ",
                                     isa_name(isa), "; set precision: fp32"));
}

bool bf16_native() { return at_least(dnnl::get_effective_cpu_isa(), dnnl::cpu_isa::avx512_core_bf16); }

namespace {

using dnnl::memory;

// rows x cols floats at `src` (row stride ld) into `out`, contiguous bf16.
void to_bf16(const float* src, int64_t rows, int64_t cols, int64_t ld, std::vector<uint16_t>& out) {
  out.resize(static_cast<size_t>(rows * cols));
  uint16_t* o = out.data();
#pragma omp parallel for schedule(static) if (rows * cols > 65536)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) o[r * cols + c] = kernels::bf16_bits(src[r * ld + c]);
}

struct Matmul {
  dnnl::matmul prim;
  memory::desc a, b, c;
};

Matmul& matmul_for(char ta, char tb, int64_t m, int64_t n, int64_t k, float alpha, float beta, int64_t ldc) {
  using Key = std::tuple<char, char, int64_t, int64_t, int64_t, float, float, int64_t>;
  static thread_local std::map<Key, Matmul> plans;
  const Key key{ta, tb, m, n, k, alpha, beta, ldc};
  auto it = plans.find(key);
  if (it != plans.end()) return it->second;
  Matmul mm;
  // The bf16 copies are contiguous in the operands' own orientation; a transposed operand is read
  // through its strides.
  mm.a = ta == 'N' ? memory::desc({m, k}, memory::data_type::bf16, memory::dims{k, 1})
                   : memory::desc({m, k}, memory::data_type::bf16, memory::dims{1, m});
  mm.b = tb == 'N' ? memory::desc({k, n}, memory::data_type::bf16, memory::dims{n, 1})
                   : memory::desc({k, n}, memory::data_type::bf16, memory::dims{1, k});
  mm.c = memory::desc({m, n}, memory::data_type::f32, memory::dims{ldc, 1});
  dnnl::primitive_attr attr;
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(beta);
    attr.set_post_ops(ops);
  }
  mm.prim = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(mm.a, mm.b, mm.c), attr, dnnl_util::engine()));
  return plans.emplace(key, std::move(mm)).first->second;
}

}  // namespace

void gemm(Precision p, char ta, char tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (p == Precision::kFp32 || k == 0) {
    const dnnl_status_t st = dnnl_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    TESSERA_CHECK(st == dnnl_success, "dnnl_sgemm failed: status ", static_cast<int>(st));
    return;
  }
  static thread_local std::vector<uint16_t> a16, b16;
  if (ta == 'N') to_bf16(a, m, k, lda, a16);
  else to_bf16(a, k, m, lda, a16);
  if (tb == 'N') to_bf16(b, k, n, ldb, b16);
  else to_bf16(b, n, k, ldb, b16);
  Matmul& mm = matmul_for(ta, tb, m, n, k, alpha, beta, ldc);
  memory am(mm.a, dnnl_util::engine(), a16.data()), bm(mm.b, dnnl_util::engine(), b16.data()),
      cm(mm.c, dnnl_util::engine(), c);
  mm.prim.execute(dnnl_util::stream(), {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
  dnnl_util::stream().wait();
}

}  // namespace tessera
