// One-row float32 products through BLAS's gemv, for libmlx's CPU backend.
//
// MLX hands every float32 matrix product to `cblas_sgemm`, a decode step's
// too: one row of activations against each weight matrix. OpenBLAS's sgemm
// first copies the whole weight into its packed panels (`sgemm_incopy`),
// which for one row costs more than the product; its gemv reads the weight
// once, in place (docs/benchmarks.md, "One-row products through gemv").
//
// xtask builds this file into libmlx_gemv_route.so beside libmlx and makes
// it libmlx's first needed library, so libmlx's calls bind to this
// `cblas_sgemm` in every process on the runtime: the engine and the oracle
// (mlx-lm) alike. A product of one row goes to `cblas_sgemv`; every other to
// the BLAS library's own `cblas_sgemm`, found past this one (RTLD_NEXT).
#include <dlfcn.h>
#include <cstdio>
#include <cstdlib>

namespace {
using Sgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*, int);
using Sgemv = void (*)(int, int, int, int, float, const float*, int, const float*, int, float, float*, int);
// CBLAS's enumerations.
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

void* next(const char* name) {
    void* f = dlsym(RTLD_NEXT, name);
    if (!f) {
        std::fprintf(stderr, "libmlx_gemv_route: no BLAS library past it defines %s\n", name);
        std::abort();
    }
    return f;
}
}  // namespace

extern "C" void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha, const float* a,
                            int lda, const float* b, int ldb, float beta, float* c, int ldc) {
    static const Sgemm sgemm = reinterpret_cast<Sgemm>(next("cblas_sgemm"));
    static const Sgemv sgemv = reinterpret_cast<Sgemv>(next("cblas_sgemv"));
    if (order == kRowMajor && m == 1 && trans_a == kNoTrans) {
        // C[1, N] = a[1, K] op(B). B stored [N, K] (transposed): B a; stored
        // [K, N]: B^T a. The one row of `a` and of C is contiguous.
        if (trans_b == kTrans) return sgemv(kRowMajor, kNoTrans, n, k, alpha, b, ldb, a, 1, beta, c, 1);
        if (trans_b == kNoTrans) return sgemv(kRowMajor, kTrans, k, n, alpha, b, ldb, a, 1, beta, c, 1);
    }
    sgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
