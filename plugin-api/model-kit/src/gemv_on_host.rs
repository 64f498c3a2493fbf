//! `gemv`'s kernel body run on this machine's CPU (`on_host`): CI has no
//! GPU, so this is where its numbers are checked. Each CUDA thread of a
//! block is a host thread; a warp's shuffles meet at a barrier of its 32
//! threads and `__syncthreads` at one of the block's. Every fusion runs at
//! the split the engine chooses (`gemv::split_rows`) for one to four rows
//! of `x`, slices of K from one to four, and the safe split besides. The
//! expected outputs come from the harness's own loops in double precision
//! with MLX's roundings (the normalized input, each product, the residual
//! add and SwiGLU's steps rounded to bf16 where the separate ops round),
//! not from the body's arithmetic; a sum taken in another order may land
//! one bf16 step away, so an output may differ from it by one step of its
//! own magnitude (two for SwiGLU's product of two sums). The CUDA compile
//! of the same body is `kernels_compile`'s.

use crate::gemv::{split_rows, Fusion, Split, SOURCE};
use crate::on_host::{compile_and_run, THREAD_SHIMS};

/// CUDA's names for what the body uses, on the host. bf16 is the top 16
/// bits of a float, rounded to nearest even.
const PRELUDE: &str = r#"
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <random>
#include <thread>
#include <vector>
struct Dim { unsigned x; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct float2 { float x, y; };
struct __nv_bfloat16 { uint16_t bits; };
struct __nv_bfloat162 { __nv_bfloat16 x, y; };
static float __bfloat162float(__nv_bfloat16 b) { uint32_t u = (uint32_t)b.bits << 16; float f; memcpy(&f, &u, 4); return f; }
static __nv_bfloat16 __float2bfloat16(float f) {
    uint32_t u; memcpy(&u, &f, 4); u += 0x7fff + ((u >> 16) & 1); return {(uint16_t)(u >> 16)};
}
static float2 __bfloat1622float2(__nv_bfloat162 p) { return {__bfloat162float(p.x), __bfloat162float(p.y)}; }
static __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {__float2bfloat16(a), __float2bfloat16(b)}; }
// A product of two bf16 values is exact in float, so one rounding of it is
// what the device's bf16x2 multiply gives.
static __nv_bfloat162 __hmul2(__nv_bfloat162 a, __nv_bfloat162 b) {
    return __floats2bfloat162_rn(__bfloat162float(a.x) * __bfloat162float(b.x), __bfloat162float(a.y) * __bfloat162float(b.y));
}
static float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static float rsqrtf(float x) { return 1.f / sqrtf(x); }
template <typename T> static T __ldg(const T* p) { return *p; }
#define __shared__ static
THREAD_SHIMS
using bf = __nv_bfloat16;
static double d(bf b) { return __bfloat162float(b); }
static double r(double x) { return __bfloat162float(__float2bfloat16((float)x)); }

std::mt19937 rng(11);
std::vector<bf> random_bf(size_t n, float scale) {
    std::uniform_real_distribution<float> u(-scale, scale);
    std::vector<bf> v(n);
    for (auto& e : v) e = __float2bfloat16(u(rng));
    return v;
}
"#;

/// One fusion's section: the body under its defines, and `check`, which
/// launches it at template values `M`.. `KS` and counts the outputs further
/// from the reference than the module docs allow.
const SECTION: &str = r#"
namespace NAME {
DEFINES
template <int M, int K, int N0, int N1, int N2, int R, int WARPS, int KS, int EPS_BITS>
void kern(Dim blockIdx, Dim threadIdx, const bf* x, const bf* g, const bf* w0, const bf* w1, const bf* w2,
          const bf* res, bf* out0, bf* out1, bf* out2) {
BODY
}

template <int M, int K, int N0, int N1, int N2, int R, int WARPS, int KS>
int check() {
    constexpr int EPS_BITS = 0x358637bd;  // 1e-6
    const int ns[3] = {N0, N1, N2};
    const int outs = PAIR || RESIDUAL ? 1 : WEIGHTS;
    std::vector<bf> x = random_bf((size_t)M * K, 2.f), g = random_bf(K, 1.5f);
    std::vector<std::vector<bf>> w;
    for (int i = 0; i < WEIGHTS; ++i) w.push_back(random_bf((size_t)ns[i] * K, 0.05f));
    std::vector<bf> res = random_bf((size_t)M * N0, 1.f);
    std::vector<std::vector<bf>> out(3);
    for (int i = 0; i < outs; ++i) out[i].assign((size_t)M * ns[i], bf{0x7fc0});  // NaN until written
    const auto at = [&](int i) { return i < WEIGHTS ? w[i].data() : nullptr; };
    const int rows = (PAIR || RESIDUAL) ? N0 : N0 + N1 + N2;
    run_blocks(rows / (WARPS / KS * R), WARPS, [&](Dim b, Dim t) {
        kern<M, K, N0, N1, N2, R, WARPS, KS, EPS_BITS>(b, t, x.data(), g.data(), at(0), at(1), at(2), res.data(),
                                                     out[0].data(), outs > 1 ? out[1].data() : nullptr,
                                                     outs > 2 ? out[2].data() : nullptr);
    });
    int bad = 0;
    for (int m = 0; m < M; ++m) {
        std::vector<double> xn(K);
        double sq = 0;
        for (int k = 0; k < K; ++k) sq += d(x[m * K + k]) * d(x[m * K + k]);
        const double inv = 1.0 / std::sqrt(sq / K + 1e-6);
        for (int k = 0; k < K; ++k) xn[k] = NORM ? r(d(g[k]) * r(d(x[m * K + k]) * inv)) : d(x[m * K + k]);
        const auto product = [&](int i, int n) {
            double s = 0;
            for (int k = 0; k < K; ++k) s += d(w[i][(size_t)n * K + k]) * xn[k];
            return r(s);
        };
        for (int i = 0; i < outs; ++i)
            for (int n = 0; n < ns[i]; ++n) {
                double want = product(i, n);
                if (RESIDUAL) want = r(d(res[m * N0 + n]) + want);
                if (PAIR) {
                    // MLX's bf16 sigmoid and silu, then the product with up.
                    const double e1 = r(std::exp(std::fabs(want))), y1 = r(1.0 / r(1.0 + e1));
                    const double sg = want < 0 ? y1 : r(1.0 - y1);
                    want = r(r(want * sg) * product(1, n));
                }
                const double got = d(out[i][(size_t)m * ns[i] + n]);
                // One bf16 step (8 bits of mantissa) of the output's magnitude.
                // SwiGLU's two sums may each land a step away.
                const double step = (PAIR ? 2 : 1) * std::ldexp(1.0, std::ilogb(std::fmax(std::fabs(want), 1e-3)) - 7);
                if (!(std::fabs(got - want) <= step)) {
                    if (bad < 5) printf("  %s m=%d out%d[%d]: %g, want %g\n", "NAME", m, i, n, got, want);
                    ++bad;
                }
            }
    }
    return bad;
}
#undef NORM
#undef WEIGHTS
#undef PAIR
#undef RESIDUAL
}
"#;

fn section(name: &str, fusion: Fusion) -> String {
    SECTION.replace("NAME", name).replace("DEFINES", &fusion.defines()).replace("BODY", SOURCE)
}

/// A call of `name::check` at `m` rows of `x`, K `k`, outputs `outs`,
/// under `split`.
fn case(name: &str, m: i32, k: i32, outs: &[i32], s: Split) -> String {
    let n = |i: usize| outs.get(i).copied().unwrap_or(0);
    format!(
        "    bad += {name}::check<{m}, {k}, {}, {}, {}, {}, {}, {}>();\n",
        n(0),
        n(1),
        n(2),
        s.rows,
        s.warps,
        s.k_split
    )
}

#[test]
fn the_fused_projection_bodies_match_the_separate_ops_at_every_split() {
    let fusions = [
        ("norm_qkv", Fusion::NormThen(3), vec![64, 32, 32]),
        ("norm_one", Fusion::NormThen(1), vec![32]),
        ("norm_swiglu", Fusion::NormSwiGlu, vec![32, 32]),
        ("then_add", Fusion::ThenAdd, vec![32]),
        ("plain", Fusion::Plain, vec![48]),
    ];
    let mut program = PRELUDE.replace("THREAD_SHIMS", THREAD_SHIMS);
    let mut calls = String::new();
    for (name, fusion, outs) in &fusions {
        program += &section(name, *fusion);
        // The rows the kernel's outputs count (SwiGLU's pair is one output).
        let out_rows: &[i32] = if matches!(fusion, Fusion::NormSwiGlu) { &outs[..1] } else { outs };
        // K of one, two and four slices for the widest splits (each slice at
        // least 1024 long), and one down-projection-like K four times N.
        for (k, m) in [(1024, 1), (2048, 3), (4096, 1), (4096, 3), (4096, 4)] {
            calls += &case(name, m, k, outs, split_rows(*fusion, k, m, out_rows));
        }
        let safe = Split { warps: 4, rows: 1, k_split: 1 };
        calls += &case(name, 2, 512, outs, safe);
    }
    program += &format!("int main() {{\n    int bad = 0;\n{calls}    printf(\"wrong outputs: %d\\n\", bad);\n    return bad != 0;\n}}\n");
    let (ok, said) = compile_and_run("gemv-on-host", &program);
    assert!(ok && said.contains("wrong outputs: 0"), "{said}");
}
