// Float32 products against a weight stored [N, K] (`x @ W^T`, every linear
// layer's), for libmlx's CPU backend, with one order of sums per output
// whatever the number of rows.
//
// MLX hands every float32 matrix product to `cblas_sgemm`. For a decode
// step's few rows OpenBLAS's sgemm first copies the whole weight into packed
// panels, which costs more than the product itself. Sending one-row products
// to its gemv instead was faster, but a row then summed in gemv's order
// while the same row in a verify or a batch summed in sgemm's, so greedy
// speculation and batching could part from plain decoding at a near tie
// (docs/benchmarks.md, "Weight products in one order of sums").
//
// Here each output C[m, n] is one chain over k in 8 float lanes (lane j
// takes k = j mod 8, in increasing k), the lanes added in one fixed tree,
// then the k past the last multiple of 8 in order. Tiling, threads and the
// number of rows only decide which outputs are computed together, never an
// output's order, so a row's bits do not depend on the rows beside it.
//
// xtask builds this file into libmlx_stable_gemm.so beside libmlx and makes
// it libmlx's first needed library, so libmlx's calls bind to this
// `cblas_sgemm` in every process on the runtime: the engine and the oracle
// (mlx-lm) alike. Other layouts, and CPUs without AVX2 and FMA, go on to the
// BLAS library's own `cblas_sgemm`, found past this one (RTLD_NEXT): the
// route depends on the layout and the CPU, never on the number of rows.
#include <dlfcn.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace {
using Sgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*, int);
// CBLAS's enumerations.
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
// Rows of `a` a thread keeps in its L2 while it sweeps the weight.
constexpr int kRowBlock = 64;

Sgemm next_sgemm() {
    void* f = dlsym(RTLD_NEXT, "cblas_sgemm");
    if (!f) {
        std::fprintf(stderr, "libmlx_stable_gemm: no BLAS library past it defines cblas_sgemm\n");
        std::abort();
    }
    return reinterpret_cast<Sgemm>(f);
}

struct Product {
    int k;
    float alpha, beta;
    const float* a;
    int lda;
    const float* b;
    int ldb;
    float* c;
    int ldc;
};

// The stores of a tile: each chain's lane sum, plus the k past the last
// whole vector in order.
template <int MT, int NT>
inline void store(const Product& p, int m0, int n0, int kv, const float (&sums)[MT][NT]) {
    for (int i = 0; i < MT; ++i)
        for (int j = 0; j < NT; ++j) {
            const float* ar = p.a + (size_t)(m0 + i) * p.lda;
            const float* br = p.b + (size_t)(n0 + j) * p.ldb;
            float s = sums[i][j];
            for (int k = kv; k < p.k; ++k) s = __builtin_fmaf(br[k], ar[k], s);
            float& out = p.c[(size_t)(m0 + i) * p.ldc + n0 + j];
            out = p.beta == 0.f ? p.alpha * s : p.alpha * s + p.beta * out;
        }
}

// AVX2: 8 float lanes, 16 registers (docs/benchmarks.md says why not
// AVX-512). `tile<MT, NT>` computes the outputs C[m0 .. m0+MT, n0 .. n0+NT],
// MT rows of `a` against NT rows of the weight, each output its own chain,
// keeping MT x NT chains, NT weight vectors and one row vector in registers.
struct Avx2 {
    static constexpr int kMT = 4, kNT = 3;
    // Lanes (0+4, 1+5, 2+6, 3+7), then (0+2, 1+3), then 0+1.
    __attribute__((target("avx2,fma"))) static float sum(__m256 v) {
        const __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        const __m128 d = _mm_add_ps(q, _mm_movehl_ps(q, q));
        return _mm_cvtss_f32(_mm_add_ss(d, _mm_shuffle_ps(d, d, 1)));
    }
    template <int MT, int NT>
    __attribute__((target("avx2,fma"))) static void tile(const Product& p, int m0, int n0) {
        __m256 acc[MT][NT];
        for (int i = 0; i < MT; ++i)
            for (int j = 0; j < NT; ++j) acc[i][j] = _mm256_setzero_ps();
        const int kv = p.k / 8 * 8;
        for (int k = 0; k < kv; k += 8) {
            __m256 w[NT];
            for (int j = 0; j < NT; ++j) w[j] = _mm256_loadu_ps(p.b + (size_t)(n0 + j) * p.ldb + k);
            for (int i = 0; i < MT; ++i) {
                const __m256 x = _mm256_loadu_ps(p.a + (size_t)(m0 + i) * p.lda + k);
                for (int j = 0; j < NT; ++j) acc[i][j] = _mm256_fmadd_ps(w[j], x, acc[i][j]);
            }
        }
        float sums[MT][NT];
        for (int i = 0; i < MT; ++i)
            for (int j = 0; j < NT; ++j) sums[i][j] = sum(acc[i][j]);
        // Clean upper halves before the caller's code: MLX's own CPU kernels
        // use SSE encodings, which a dirty AVX state slows several times.
        _mm256_zeroupper();
        store<MT, NT>(p, m0, n0, kv, sums);
    }
};

// Rows m0 .. m0+MT against weight rows n0 .. n1: whole tiles, then the edge
// one weight row at a time.
template <class S, int MT>
void rows_against(const Product& p, int m0, int n0, int n1) {
    int n = n0;
    for (; n + S::kNT <= n1; n += S::kNT) S::template tile<MT, S::kNT>(p, m0, n);
    for (; n < n1; ++n) S::template tile<MT, 1>(p, m0, n);
}

// Rows m0 .. m1 against weight rows n0 .. n1: tiles of S::kMT rows, then
// the rows left over.
template <class S>
void block(const Product& p, int m0, int m1, int n0, int n1) {
    int m = m0;
    for (; m + S::kMT <= m1; m += S::kMT) rows_against<S, S::kMT>(p, m, n0, n1);
    if (m1 - m == 3) rows_against<S, 3>(p, m, n0, n1);
    if (m1 - m == 2) rows_against<S, 2>(p, m, n0, n1);
    if (m1 - m == 1) rows_against<S, 1>(p, m, n0, n1);
}

template <class S>
void stable_gemm(const Product& p, int m, int n) {
    // The work is cut into items: a block of rows against a chunk of the
    // weight that stays in L2 while every row of the block passes over it,
    // so the weight is read from memory once per block of rows. Threads
    // take items as they come free (each output is one item's), so a
    // thread the OS runs late leaves its share to the others instead of
    // holding them at the join (on a busy two-core server, where the HTTP
    // side shares the cores: docs/benchmarks.md, "Products in items taken
    // as threads come free"). A product of less work than a fork and join
    // is worth (attention's per-head products) stays on the calling thread.
    constexpr long kThreadedWork = 1L << 17;
    const int threads = (long)m * n * p.k >= kThreadedWork && n >= 2 * S::kNT ? omp_get_max_threads() : 1;
    // Chunks of at most 32768 weights (128 KiB), at least four per thread,
    // as many as the next multiple of the threads where whole tiles allow
    // (else one narrow chunk more), so that the threads finish together
    // when none is held up.
    const int widest = std::max(S::kNT, 32768 / p.k / S::kNT * S::kNT);
    const int wanted = std::max((n + widest - 1) / widest, 4 * threads);
    const int even = (wanted + threads - 1) / threads * threads;
    const int chunk = std::max(S::kNT, (n + even - 1) / even / S::kNT * S::kNT);
    const int chunks = (n + chunk - 1) / chunk;
    const int row_blocks = (m + kRowBlock - 1) / kRowBlock;
    const int items = row_blocks * chunks;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int item = 0; item < items; ++item) {
        const int m0 = item / chunks * kRowBlock, n0 = item % chunks * chunk;
        block<S>(p, m0, std::min(m, m0 + kRowBlock), n0, std::min(n, n0 + chunk));
    }
}
}  // namespace

extern "C" void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha, const float* a,
                            int lda, const float* b, int ldb, float beta, float* c, int ldc) {
    static const Sgemm sgemm = next_sgemm();
    static const bool simd = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (simd && order == kRowMajor && trans_a == kNoTrans && trans_b == kTrans && m > 0 && n > 0 && k > 0) {
        stable_gemm<Avx2>(Product{k, alpha, beta, a, lda, b, ldb, c, ldc}, m, n);
        return;
    }
    sgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
