//! `qk_norm_rope`'s kernel body run on this machine's CPU, its warps as
//! host threads (`on_host`): CI has no GPU, so this is where its numbers
//! are checked, for a rotation over the whole head (Qwen3's 128) and over
//! part of it (Qwen3.5's 64 of 256, and 32 of 128, the queries read strided out of the
//! query-and-gate projection), against the harness's own RMSNorm and
//! rotation in double precision.

use crate::on_host::{compile_and_run, THREAD_SHIMS};

const HARNESS: &str = r#"
#include <barrier>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <thread>
#include <vector>
struct Dim { unsigned x; };
struct Shape { int v[4]; int operator[](int i) const { return v[i]; } };
struct Strides { int64_t v[4]; int64_t operator[](int i) const { return v[i]; } };
struct __nv_bfloat16 { uint16_t bits; };
static float __bfloat162float(__nv_bfloat16 b) { uint32_t u = (uint32_t)b.bits << 16; float f; memcpy(&f, &u, 4); return f; }
static __nv_bfloat16 __float2bfloat16(float f) {
    uint32_t u; memcpy(&u, &f, 4); return {(uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16)};
}
static float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
SHIMS

template <int HQ, int HK, int D, int R, bool FLAT, int EPS_BITS, int SCALE_BITS, int LOG2BASE_BITS>
void kern(Dim blockIdx, Dim blockDim, Dim threadIdx, const __nv_bfloat16* q, Shape q_shape, Strides q_strides,
          const __nv_bfloat16* k, Strides k_strides, const __nv_bfloat16* gq, const __nv_bfloat16* gk,
          const int* offset, Shape offset_shape, __nv_bfloat16* qo, __nv_bfloat16* ko) {
#define FREQS 0
BODY
}

constexpr int bits(float f) { return std::bit_cast<int>(f); }

// q is the first half of each head of a [B, L, HQ, 2 D] projection (the
// gate the second half) when GATED, else [B, L, HQ, D]; k is [B, L, HK, D];
// FLAT passes them as [B, L, heads * D] (not with GATED).
template <int HQ, int HK, int D, int R, bool GATED, bool FLAT = false>
int check(int B, int L, int off) {
    constexpr float EPS = 1e-6f, BASE = 10000.0f;
    constexpr int QW = GATED ? 2 * D : D;
    std::vector<__nv_bfloat16> q(B * L * HQ * QW), k(B * L * HK * D), gq(D), gk(D);
    std::vector<__nv_bfloat16> qo(B * HQ * L * D), ko(B * HK * L * D);
    for (size_t i = 0; i < q.size(); ++i) q[i] = __float2bfloat16((float)((int)(i * 37 % 101) - 50) / 25.0f);
    for (size_t i = 0; i < k.size(); ++i) k[i] = __float2bfloat16((float)((int)(i * 53 % 89) - 44) / 22.0f);
    for (int i = 0; i < D; ++i) gq[i] = __float2bfloat16(0.5f + (i % 7) / 8.0f), gk[i] = __float2bfloat16(1.5f - (i % 5) / 8.0f);
    const Strides qs = FLAT ? Strides{{(int64_t)L * HQ * D, (int64_t)HQ * D, 1, 0}}
                            : Strides{{(int64_t)L * HQ * QW, (int64_t)HQ * QW, QW, 1}};
    const Strides ks = FLAT ? Strides{{(int64_t)L * HK * D, (int64_t)HK * D, 1, 0}}
                            : Strides{{(int64_t)L * HK * D, (int64_t)HK * D, D, 1}};
    const int offs[1] = {off};
    const int warps = B * L * (HQ + HK), blocks = (warps + 3) / 4;
    run_blocks(blocks, 4, [&](Dim blk, Dim t) {
        kern<HQ, HK, D, R, FLAT, bits(EPS), bits(1.0f), bits(13.287712379549449f)>(
            blk, Dim{128}, t, q.data(), Shape{{B, L, HQ, D}}, qs, k.data(), ks, gq.data(), gk.data(), offs,
            Shape{{1, 0, 0, 0}}, qo.data(), ko.data());
    });
    int bad = 0;
    for (int b = 0; b < B; ++b)
        for (int l = 0; l < L; ++l)
            for (int head = 0; head < HQ + HK; ++head) {
                const bool is_q = head < HQ;
                const int h = is_q ? head : head - HQ;
                const __nv_bfloat16* src = is_q ? &q[((b * L + l) * HQ + h) * QW] : &k[((b * L + l) * HK + h) * D];
                const __nv_bfloat16* w = is_q ? gq.data() : gk.data();
                const __nv_bfloat16* got = is_q ? &qo[((b * HQ + h) * L + l) * D] : &ko[((b * HK + h) * L + l) * D];
                double ss = 0;
                for (int d = 0; d < D; ++d) ss += (double)__bfloat162float(src[d]) * __bfloat162float(src[d]);
                const double inv = 1.0 / std::sqrt(ss / D + EPS);
                std::vector<double> y(D), want(D);
                for (int d = 0; d < D; ++d) y[d] = __bfloat162float(src[d]) * inv * __bfloat162float(w[d]);
                for (int d = 0; d < D; ++d) want[d] = y[d];
                for (int d = 0; d < R / 2; ++d) {
                    const double theta = (off + l) * std::pow((double)BASE, -2.0 * d / R);
                    want[d] = y[d] * std::cos(theta) - y[d + R / 2] * std::sin(theta);
                    want[d + R / 2] = y[d] * std::sin(theta) + y[d + R / 2] * std::cos(theta);
                }
                for (int d = 0; d < D; ++d) {
                    const double g = __bfloat162float(got[d]);
                    if (std::fabs(g - want[d]) > 0.02 * std::fmax(1.0, std::fabs(want[d]))) {
                        if (bad < 5) printf("b=%d l=%d head=%d d=%d: %g, want %g\n", b, l, head, d, g, want[d]);
                        ++bad;
                    }
                }
            }
    return bad;
}

int main() {
    int bad = 0;
    bad += check<3, 2, 128, 128, false>(2, 2, 5);
    bad += check<3, 2, 128, 128, false, true>(2, 2, 5);
    bad += check<2, 1, 256, 64, true>(1, 3, 300);
    bad += check<1, 1, 64, 64, false>(1, 1, 17);
    bad += check<2, 1, 128, 32, true>(2, 2, 40);
    printf("wrong elements: %d\n", bad);
    return bad != 0;
}
"#;

#[test]
fn the_qk_norm_rope_kernel_body_norms_and_rotates_whole_and_partial_heads() {
    let program = HARNESS.replace("SHIMS", THREAD_SHIMS).replace("BODY", crate::qk_norm_rope::SOURCE);
    let (ok, said) = compile_and_run("qk-norm-rope-on-host", &program);
    assert!(ok && said.contains("wrong elements: 0"), "{said}");
}
