//! `decode_attention`'s kernels run on this machine's CPU (`on_host`): CI
//! has no GPU, so this is where their numbers are checked. Each CUDA
//! thread of a block is a host thread; a warp's shuffles meet at a barrier
//! of its 32 threads and `__syncthreads` at one of the block's, so the body
//! runs as written, warp-uniform loops and all. The slices are merged by
//! the merge kernel's body, one call per output element. The expected
//! outputs come from the harness's own softmax in double precision over
//! the keys each query may see, not from the kernel's arithmetic.
//!
//! Cases: bf16 and float32 K/V at head sizes 128 and 64 (8 and 4 lanes a
//! key, 16-byte loads) and 96 (a warp a key, element loads), a masked batch
//! with a row masked out, one to four slices of the keys (the kernel reads
//! their count from its grid), a causal 3-query verify, keys stored
//! token-major (`[B, T, H, D]`, read through strides), and the paged pool.
//! The CUDA compile of the same bodies is `kernels_compile`'s.

use crate::decode_attention::{lanes_per_key, source, DENSE, MERGE_SOURCE, PAGED};
use crate::on_host::{compile_and_run, THREAD_SHIMS};

const HARNESS: &str = r#"
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <random>
#include <thread>
#include <vector>
#include <algorithm>
using std::min;
struct Shape { int v[4]; int operator[](int i) const { return v[i]; } };
struct Strides { int64_t v[4]; int64_t operator[](int i) const { return v[i]; } };
struct Dim { unsigned x; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
// bfloat16 as its top 16 bits of a float (round to nearest even).
struct bf16 {
    uint16_t bits;
    bf16() = default;
    explicit bf16(float f) { uint32_t u; memcpy(&u, &f, 4); u += 0x7fff + ((u >> 16) & 1); bits = u >> 16; }
    operator float() const { uint32_t u = (uint32_t)bits << 16; float f; memcpy(&f, &u, 4); return f; }
};
#define __shared__ static
#define __expf expf
static float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
THREAD_SHIMS

#define SIGNATURE(NAME) \
template <typename Elem, int D, int G, int R, int HKV, int SCALE_BITS, bool CAUSAL, int BLOCK> \
void NAME(Dim gridDim, Dim blockIdx, Dim blockDim, Dim threadIdx, \
          const Elem* q, Shape q_shape, Strides q_strides, const Elem* k, Shape k_shape, Strides k_strides, \
          const Elem* v, Shape v_shape, Strides v_strides, const bool* mask, Strides mask_strides, \
          const int* flat, Shape flat_shape, Strides flat_strides, float* part, float* ml)

SIGNATURE(dense_masked) {
@DENSE_MASKED@
}
#undef KROW
#undef VROW
SIGNATURE(dense_unmasked) {
@DENSE_UNMASKED@
}
#undef KROW
#undef VROW
SIGNATURE(paged_masked) {
@PAGED_MASKED@
}

template <int D, int R>
void merge(Dim blockIdx, Dim blockDim, Dim threadIdx, const float* part, Shape part_shape, const float* ml,
           float* out) {
@MERGE@
}

enum Kind { DenseMasked, DenseUnmasked, Paged };

// One launch: `blocks` blocks of 256 threads, each thread a host thread.
template <Kind K, typename T, int D, int R, int HKV, bool CAUSAL, int BLOCK>
void launch(int blocks, const T* q, Shape qs, Strides qst, const T* k, Shape ks, Strides kst, const T* v,
            Strides vst, const bool* mask, Strides mst, const int* flat, Shape fs, Strides fst, float* part,
            float* ml) {
    constexpr int G = @LANES_PER_KEY@;
    run_blocks(blocks, 8, [&](Dim at, Dim th) {
        // gridDim.x counts blocks (MLX's launch gives threads in all).
        const Dim gd{(unsigned)blocks}, dim{256};
        if constexpr (K == DenseMasked)
            dense_masked<T, D, G, R, HKV, 0, CAUSAL, BLOCK>(gd, at, dim, th, q, qs, qst, k, ks, kst, v, ks, vst, mask, mst, flat, fs, fst, part, ml);
        else if constexpr (K == DenseUnmasked)
            dense_unmasked<T, D, G, R, HKV, 0, CAUSAL, BLOCK>(gd, at, dim, th, q, qs, qst, k, ks, kst, v, ks, vst, mask, mst, flat, fs, fst, part, ml);
        else
            paged_masked<T, D, G, R, HKV, 0, CAUSAL, BLOCK>(gd, at, dim, th, q, qs, qst, k, ks, kst, v, ks, vst, mask, mst, flat, fs, fst, part, ml);
    });
}
"#;

/// The cases: each builds Q/K/V, runs the kernel and the merge, and
/// compares with the reference. `SCALE_BITS` is a template constant in
/// the kernel; the harness passes 0 there and folds the scale into Q
/// instead (`__int_as_float(0)` is 0, so the body's `sc` is replaced).
const CASES: &str = r#"
std::mt19937 rng(7);
float uni() { return std::uniform_real_distribution<float>(-1.f, 1.f)(rng); }

// Attention of query (b, hq, ql) over keys t < seen where live(b, t), in
// double; key t's element d of head h is kv(b, h, t, d).
template <typename KV, typename LIVE>
void reference(int B, int HQ, int QL, int HKV, int D, int T, bool causal, const std::vector<float>& q, KV key,
               KV val, LIVE live, std::vector<double>& out) {
    const int R = HQ / HKV;
    out.assign((size_t)B * QL * HQ * D, 0.0);
    for (int b = 0; b < B; ++b)
        for (int ql = 0; ql < QL; ++ql)
            for (int hq = 0; hq < HQ; ++hq) {
                const int h = hq / R, seen = causal ? T - (QL - 1 - ql) : T;
                std::vector<double> s;
                std::vector<int> ts;
                for (int t = 0; t < seen; ++t) {
                    if (!live(b, t)) continue;
                    double x = 0;
                    for (int d = 0; d < D; ++d) x += (double)q[(((size_t)b * HQ + hq) * QL + ql) * D + d] * key(b, h, t, d);
                    s.push_back(x);
                    ts.push_back(t);
                }
                if (s.empty()) continue;
                const double m = *std::max_element(s.begin(), s.end());
                double l = 0;
                for (auto& x : s) l += (x = std::exp(x - m));
                for (size_t i = 0; i < s.size(); ++i)
                    for (int d = 0; d < D; ++d)
                        out[(((size_t)b * QL + ql) * HQ + hq) * D + d] += s[i] / l * val(b, h, ts[i], d);
            }
}

// Runs the merge over `blocks` partial results and compares with `want`
// (laid out [B * QL, HQ, D]); returns the largest difference.
template <int D, int R>
double merged_error(int pairs, int splits, const std::vector<float>& part, const std::vector<float>& ml,
                    const std::vector<double>& want) {
    std::vector<float> out(want.size());
    const int n = (int)out.size();
    for (int i = 0; i < (n + 255) / 256 * 256; ++i)
        merge<D, R>({(unsigned)(i / 256)}, {256}, {(unsigned)(i % 256)}, part.data(), Shape{{pairs, splits, R, D}},
                    ml.data(), out.data());
    double worst = 0;
    for (int i = 0; i < n; ++i) worst = std::max(worst, std::fabs(out[i] - want[i]));
    return worst;
}

// A dense case: B rows, HQ query heads over HKV K/V heads, QL queries,
// T keys stored with `strided` (K as [B, T, HKV, D] in memory) or
// contiguous strides; `masked` drops row 1's first keys and all of row 2's.
template <typename T, int D, int R, int HKV>
double dense(int B, int QL, int Tk, bool causal, bool masked, bool strided, int splits) {
    const int HQ = R * HKV;
    const float scale = 1.f / std::sqrt((float)D);
    std::vector<float> qf((size_t)B * HQ * QL * D);
    for (auto& x : qf) x = uni();
    std::vector<T> q(qf.size());
    for (size_t i = 0; i < qf.size(); ++i) { q[i] = T(qf[i] * scale); qf[i] = (float)q[i]; }
    std::vector<T> k((size_t)B * HKV * Tk * D), v(k.size());
    for (size_t i = 0; i < k.size(); ++i) { k[i] = T(uni() * 3); v[i] = T(uni()); }
    const Strides kst = strided ? Strides{{(int64_t)Tk * HKV * D, D, (int64_t)HKV * D, 1}}
                                : Strides{{(int64_t)HKV * Tk * D, (int64_t)Tk * D, D, 1}};
    auto at = [&](const std::vector<T>& a) {
        return [&a, kst](int b, int h, int t, int d) { return (double)(float)a[b * kst[0] + h * kst[1] + t * kst[2] + d]; };
    };
    std::vector<char> mk((size_t)B * Tk, 1);
    if (masked) {
        for (int t = 0; t < Tk / 3; ++t) mk[1 * Tk + t] = 0;
        if (B > 2) for (int t = 0; t < Tk; ++t) mk[2 * Tk + t] = 0;
    }
    bool* mask = new bool[mk.size()];
    for (size_t i = 0; i < mk.size(); ++i) mask[i] = mk[i];
    std::vector<double> want;
    reference(B, HQ, QL, HKV, D, Tk, causal, qf, at(k), at(v), [&](int b, int t) { return mk[b * Tk + t] != 0; }, want);
    const int blocks = B * QL * HKV * splits;
    std::vector<float> part((size_t)blocks * R * D), ml((size_t)blocks * R * 2);
    const Shape qs{{B, HQ, QL, D}}, ks{{B, HKV, Tk, D}};
    const Strides qst{{(int64_t)HQ * QL * D, (int64_t)QL * D, D, 1}}, mst{{Tk, 1, 0, 0}};
    if (masked)
        launch<DenseMasked, T, D, R, HKV, false, 0>(blocks, q.data(), qs, qst, k.data(), ks, kst, v.data(), kst, mask, mst, nullptr, Shape{}, Strides{}, part.data(), ml.data());
    else if (causal)
        launch<DenseUnmasked, T, D, R, HKV, true, 0>(blocks, q.data(), qs, qst, k.data(), ks, kst, v.data(), kst, mask, mst, nullptr, Shape{}, Strides{}, part.data(), ml.data());
    else
        launch<DenseUnmasked, T, D, R, HKV, false, 0>(blocks, q.data(), qs, qst, k.data(), ks, kst, v.data(), kst, mask, mst, nullptr, Shape{}, Strides{}, part.data(), ml.data());
    delete[] mask;
    return merged_error<D, R>(B * QL * HKV, splits, part, ml, want);
}

// The paged pool: K/V [HKV, cap * BLOCK, D]; row b's j-th block is
// table[b][j]; `flat` [B, HKV, nb] = h * cap + table[b][j].
template <typename T, int D, int R, int HKV, int BLOCK>
double paged(int B, int nb, int cap, int splits) {
    const int HQ = R * HKV, Tk = nb * BLOCK, S = cap * BLOCK;
    std::vector<float> qf((size_t)B * HQ * D);
    std::vector<T> q(qf.size());
    for (size_t i = 0; i < qf.size(); ++i) { q[i] = T(uni() * 0.2f); qf[i] = (float)q[i]; }
    std::vector<T> k((size_t)HKV * S * D), v(k.size());
    for (size_t i = 0; i < k.size(); ++i) { k[i] = T(uni() * 3); v[i] = T(uni()); }
    std::vector<int> table((size_t)B * nb), flat((size_t)B * HKV * nb);
    for (int b = 0; b < B; ++b)
        for (int j = 0; j < nb; ++j) table[b * nb + j] = (b * 5 + j * 3 + 1) % cap;
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < HKV; ++h)
            for (int j = 0; j < nb; ++j) flat[(b * HKV + h) * nb + j] = h * cap + table[b * nb + j];
    auto at = [&](const std::vector<T>& a) {
        return [&a, &table, nb, S](int b, int h, int t, int d) {
            const int slot = table[b * nb + t / BLOCK] * BLOCK + t % BLOCK;
            return (double)(float)a[((size_t)h * S + slot) * D + d];
        };
    };
    bool* mask = new bool[(size_t)B * Tk];
    for (int i = 0; i < B * Tk; ++i) mask[i] = (i % Tk) >= (i / Tk) * 3;
    std::vector<double> want;
    reference(B, HQ, 1, HKV, D, Tk, false, qf, at(k), at(v), [&](int b, int t) { return mask[b * Tk + t]; }, want);
    const int blocks = B * HKV * splits;
    std::vector<float> part((size_t)blocks * R * D), ml((size_t)blocks * R * 2);
    const Strides kst{{(int64_t)S * D, D, 1, 0}}, qst{{(int64_t)HQ * D, D, D, 1}}, mst{{Tk, 1, 0, 0}};
    const Strides fst{{(int64_t)HKV * nb, nb, 1, 0}};
    launch<Paged, T, D, R, HKV, false, BLOCK>(blocks, q.data(), Shape{{B, HQ, 1, D}}, qst, k.data(), Shape{{HKV, S, D, 0}}, kst, v.data(), kst, mask, mst, flat.data(), Shape{{B, HKV, nb, 0}}, fst, part.data(), ml.data());
    delete[] mask;
    return merged_error<D, R>(B * HKV, splits, part, ml, want);
}

int main() {
    struct { const char* what; double err; } cases[] = {
        {"bf16 head 128, masked rows, 300 keys in 1 slice", dense<bf16, 128, 4, 2>(3, 1, 300, false, true, false, 1)},
        {"bf16 head 128, one row, 4 slices", dense<bf16, 128, 4, 2>(1, 1, 300, false, false, false, 4)},
        {"f32 head 128, causal verify of 3, 2 slices", dense<float, 128, 2, 2>(2, 3, 40, true, false, false, 2)},
        {"bf16 head 64, keys token-major, 3 slices", dense<bf16, 64, 3, 2>(2, 1, 100, false, false, true, 3)},
        {"f32 head 96 (a warp a key), masked, 2 slices", dense<float, 96, 2, 1>(3, 1, 70, false, true, false, 2)},
        {"bf16 head 128, paged blocks of 16, 3 slices", paged<bf16, 128, 4, 2, 16>(2, 5, 9, 3)},
    };
    int bad = 0;
    for (auto& c : cases) {
        const bool ok = c.err < 2e-5;
        bad += !ok;
        printf("%s: %s, largest difference %.3g\n", ok ? "ok" : "WRONG", c.what, c.err);
    }
    printf("wrong cases: %d\n", bad);
    return bad != 0;
}
"#;

#[test]
fn the_decode_attention_kernels_attend_as_a_softmax_in_double_precision() {
    // The scale is folded into Q (SCALE_BITS = 0 would zero it).
    let body = |s: String| s.replace("const float sc = __int_as_float(SCALE_BITS);", "const float sc = 1.f;");
    let lanes = [64, 96, 128].iter().map(|&d| format!("D == {d} ? {} : ", lanes_per_key(d))).collect::<String>();
    let text = HARNESS
        .replace("THREAD_SHIMS", THREAD_SHIMS)
        .replace("@DENSE_MASKED@", &body(source(DENSE, true)))
        .replace("@DENSE_UNMASKED@", &body(source(DENSE, false)))
        .replace("@PAGED_MASKED@", &body(source(PAGED, true)))
        .replace("@MERGE@", MERGE_SOURCE)
        .replace("@LANES_PER_KEY@", &format!("({lanes}0)"));
    let (ok, said) = compile_and_run("decode-attention-on-host", &format!("{text}{CASES}"));
    println!("{said}");
    assert!(ok && said.contains("wrong cases: 0"), "{said}");
}
