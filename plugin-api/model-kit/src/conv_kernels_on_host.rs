//! The short conv's two kernel bodies (`conv_window`, the layout's window
//! step; `depthwise_conv_kernel`, the conv) run on this
//! machine's CPU, one call per thread (`on_host`): CI has no GPU, so this is
//! where what they write is checked, from strided inputs, against the
//! harness's own loops (a concatenate and its tail; a conv in double
//! precision). The CUDA compile of the same bodies is
//! `kernels_compile`'s.

use crate::on_host::compile_and_run;

/// Shapes, strides, thread coordinates and a bf16 that rounds to nearest
/// even, as the CUDA headers give the bodies.
const PRELUDE: &str = r#"
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <type_traits>
#include <vector>
namespace cuda { namespace std = ::std; }
struct Shape { int v[3]; int operator[](int i) const { return v[i]; } };
struct Strides { int64_t v[3]; int64_t operator[](int i) const { return v[i]; } };
struct Dim { unsigned x; };
struct bf16 {
    uint16_t bits;
    bf16() : bits(0) {}
    explicit bf16(float f) { uint32_t u; memcpy(&u, &f, 4); bits = (u + 0x7fff + ((u >> 16) & 1)) >> 16; }
    explicit operator float() const { uint32_t u = (uint32_t)bits << 16; float f; memcpy(&f, &u, 4); return f; }
};
"#;

/// `check(B, KEEP, L, C)`: stored `[B, KEEP, C]` and inputs `[B, L, C]`,
/// both laid out as `[B, C, N]` in memory (strided reads), distinct values.
const WINDOW_HARNESS: &str = r#"
template <int KEEP, typename E>
void kern(Dim blockIdx, Dim blockDim, Dim threadIdx, const E* stored, Strides stored_strides, const E* inputs,
          Shape inputs_shape, Strides inputs_strides, E* window, E* state) {
BODY
}

template <int KEEP>
int check(int B, int L, int C) {
    using W = uint16_t;
    std::vector<W> stored(B * C * KEEP), inputs(B * C * L);
    for (size_t x = 0; x < stored.size(); ++x) stored[x] = W(1 + x);
    for (size_t x = 0; x < inputs.size(); ++x) inputs[x] = W(30000 + x);
    const Strides ss{{(int64_t)C * KEEP, 1, KEEP}}, is{{(int64_t)C * L, 1, L}};
    std::vector<W> window(B * (KEEP + L) * C, 0), state(B * KEEP * C, 0);
    const unsigned threads = 64, total = B * (KEEP + L) * C;
    for (unsigned blk = 0; blk <= total / threads + 1; ++blk)
        for (unsigned t = 0; t < threads; ++t)
            kern<KEEP, W>({blk}, {threads}, {t}, stored.data(), ss, inputs.data(), Shape{{B, L, C}}, is,
                          window.data(), state.data());
    int bad = 0;
    for (int b = 0; b < B; ++b)
        for (int t = 0; t < KEEP + L; ++t)
            for (int c = 0; c < C; ++c) {
                const W want = t < KEEP ? stored[(b * C + c) * KEEP + t] : inputs[(b * C + c) * L + t - KEEP];
                bad += window[(b * (KEEP + L) + t) * C + c] != want;
                if (t >= L) bad += state[(b * KEEP + t - L) * C + c] != want;
            }
    return bad;
}

int main() {
    // A decode step, a 3-token verify, a prompt longer than the window.
    const int bad = check<3>(2, 1, 24) + check<3>(1, 3, 40) + check<2>(3, 9, 16);
    printf("wrong elements: %d\n", bad);
    return bad != 0;
}
"#;

/// `check<T, K>(B, L, C)`: window `[B, K-1+L, C]` laid out as `[B, C, W]`,
/// taps `[C, K]` as `[K, C]`; each output element against the conv in
/// double precision, within `tol` relative (one rounding to T).
const CONV_HARNESS: &str = r#"
template <typename E>
void kern(Dim blockIdx, Dim blockDim, Dim threadIdx, const E* window, Shape window_shape, Strides window_strides,
          const float* taps, Shape taps_shape, Strides taps_strides, E* out) {
BODY
}

template <typename T, int K>
int check(int B, int L, int C, double tol) {
    const int W = K - 1 + L;
    std::vector<T> window(B * C * W);
    std::vector<float> taps(K * C);
    for (size_t x = 0; x < window.size(); ++x) window[x] = T((float)((int)(x * 37 % 101) - 50) / 16.0f);
    for (size_t x = 0; x < taps.size(); ++x) taps[x] = (float)((int)(x * 53 % 29) - 14) / 8.0f;
    std::vector<T> out(B * L * C);
    const unsigned threads = 64, total = B * L * C;
    for (unsigned blk = 0; blk <= total / threads + 1; ++blk)
        for (unsigned t = 0; t < threads; ++t)
            kern<T>({blk}, {threads}, {t}, window.data(), Shape{{B, W, C}}, Strides{{(int64_t)C * W, 1, W}},
                    taps.data(), Shape{{C, K, 0}}, Strides{{1, C}}, out.data());
    int bad = 0;
    for (int b = 0; b < B; ++b)
        for (int l = 0; l < L; ++l)
            for (int c = 0; c < C; ++c) {
                double want = 0;
                for (int j = 0; j < K; ++j) want += (double)(float)window[(b * C + c) * W + l + j] * taps[j * C + c];
                const double got = (float)out[(b * L + l) * C + c];
                if (std::fabs(got - want) > tol * std::fabs(want) + 1e-6) {
                    if (bad < 5) printf("b=%d l=%d c=%d: %g, want %g\n", b, l, c, got, want);
                    ++bad;
                }
            }
    return bad;
}

int main() {
    int bad = 0;
    // A decode step, a verify and a prompt, in float32 and bf16.
    bad += check<float, 4>(2, 1, 40, 1e-5);
    bad += check<float, 4>(1, 3, 24, 1e-5);
    bad += check<bf16, 4>(2, 3, 40, 1.0 / 128);
    bad += check<bf16, 3>(3, 9, 16, 1.0 / 128);
    printf("wrong elements: %d\n", bad);
    return bad != 0;
}
"#;

#[test]
fn the_conv_window_kernel_body_writes_the_window_and_its_tail() {
    let program = format!("{PRELUDE}{}", WINDOW_HARNESS.replace("BODY", crate::conv_window::SOURCE));
    let (ok, said) = compile_and_run("conv-window-on-host", &program);
    assert!(ok && said.contains("wrong elements: 0"), "{said}");
}

#[test]
fn the_conv_kernel_body_is_the_conv() {
    let program = format!("{PRELUDE}{}", CONV_HARNESS.replace("BODY", crate::depthwise_conv_kernel::SOURCE));
    let (ok, said) = compile_and_run("depthwise-conv-on-host", &program);
    assert!(ok && said.contains("wrong elements: 0"), "{said}");
}
