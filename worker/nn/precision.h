// The arithmetic of a step's products (spec.training.precision). kBf16 means what
// torch.autocast(dtype=torch.bfloat16) means: convolutions, transposed convolutions and matrix
// products take their inputs rounded to bf16 (round to nearest even: kernels::bf16_bits) and
// accumulate and write fp32; everything else (normalisation, softmax, losses, the optimiser) and the
// weights stay fp32. gemm() is the layers' one matrix product on the host, in either precision.
#pragma once

#include <cstdint>
#include <string>

namespace tessera {

enum class Precision { kFp32, kBf16 };

// "fp32" or "bf16"; ConfigError on `field` otherwise.
Precision parse_precision(const std::string& name, const std::string& field = "spec.training.precision");
const char* precision_name(Precision p);

// Throws ConfigError on spec.training.precision where this CPU has no bf16 path: oneDNN's bf16
// kernels need AVX-512 (avx512_core; native bf16 instructions with AVX-512 BF16, emulated without).
// ONEDNN_MAX_CPU_ISA caps what oneDNN may use, and so what this sees.
void require_bf16_cpu();
// Whether oneDNN runs bf16 natively here (AVX-512 BF16 or AMX) rather than emulated on AVX-512.
bool bf16_native();

// Row-major C = alpha op(A) op(B) + beta C, op(A) m x k, op(B) k x n; ta / tb 'N' or 'T' as in
// dnnl_sgemm. kFp32: oneDNN's sgemm. kBf16: A and B rounded to bf16 and multiplied by oneDNN's
// matmul primitive (one per shape and thread, kept), accumulating in fp32 into C.
void gemm(Precision p, char ta, char tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace tessera
