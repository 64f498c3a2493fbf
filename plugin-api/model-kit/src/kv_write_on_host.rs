//! `kv_write`'s kernel body run on this machine's CPU, one call per thread
//! (`on_host`): CI has no GPU, so this is where the bytes it writes are
//! checked (which column of which row and head each element of K, V and
//! the queries lands in, strided sources, a storage with more rows than the
//! update, every element width). The expected layout is computed by the
//! harness's own loops over (row, head, position, dimension), not by the
//! body's index arithmetic. The CUDA compile of the same body is
//! `kernels_compile`'s.

use crate::kv_write::SOURCE;
use crate::on_host::compile_and_run;

/// The harness: `kern` is the body with CUDA's thread coordinates as
/// arguments, run for every thread of the launch (and some past it, which
/// must write nothing); `check` fills K/V/Q seen as `[B, H, L, D]` through
/// transposed strides (as `[B, L, H, D]` in memory, the projections'
/// layout), writes them at `column` of storage `[B + 1, H, C, D]`, and
/// counts wrong elements.
const HARNESS: &str = r#"
#include <cstdint>
#include <cstdio>
#include <vector>
struct Shape { int v[4]; int operator[](int i) const { return v[i]; } };
struct Strides { int64_t v[4]; int64_t operator[](int i) const { return v[i]; } };
struct Dim { unsigned x; };

template <typename W>
void kern(Dim blockIdx, Dim blockDim, Dim threadIdx, const W* ks, Strides ks_strides, const W* vs,
          Strides vs_strides, const W* k, Shape k_shape, Strides k_strides, const W* v, Shape v_shape,
          Strides v_strides, const W* q, Shape q_shape, Strides q_strides, const int* column, W* qo,
          unsigned* done) {
BODY
}

template <typename W>
int check(int B, int H, int C, int DK, int DV, int L, int HQ, int DQ, int column) {
    const int BS = B + 1;
    std::vector<W> ks(BS * H * C * DK, 0), vs(BS * H * C * DV, 0), qo(B * HQ * L * DQ, 0);
    std::vector<W> k(B * L * H * DK), v(B * L * H * DV), q(B * L * HQ * DQ);
    for (size_t x = 0; x < k.size(); ++x) k[x] = W(1 + x % 97);
    for (size_t x = 0; x < v.size(); ++x) v[x] = W(2 + x % 89);
    for (size_t x = 0; x < q.size(); ++x) q[x] = W(3 + x % 83);
    const Strides kst{{(int64_t)L * H * DK, DK, (int64_t)H * DK, 1}};
    const Strides vst{{(int64_t)L * H * DV, DV, (int64_t)H * DV, 1}};
    const Strides qst{{(int64_t)L * HQ * DQ, DQ, (int64_t)HQ * DQ, 1}};
    const Strides kss{{(int64_t)H * C * DK, (int64_t)C * DK, DK, 1}};
    const Strides vss{{(int64_t)H * C * DV, (int64_t)C * DV, DV, 1}};
    const int col[1] = {column};
    unsigned done[1] = {0};
    const unsigned threads = 64, total = B * H * L * (DK + DV) + B * HQ * L * DQ;
    for (unsigned blk = 0; blk <= total / threads + 1; ++blk)
        for (unsigned t = 0; t < threads; ++t)
            kern<W>({blk}, {threads}, {t}, ks.data(), kss, vs.data(), vss, k.data(), Shape{{B, H, L, DK}}, kst,
                    v.data(), Shape{{B, H, L, DV}}, vst, q.data(), Shape{{B, HQ, L, DQ}}, qst, col, qo.data(), done);
    int bad = done[0] != 1;
    for (int b = 0; b < BS; ++b)
        for (int h = 0; h < H; ++h)
            for (int c = 0; c < C; ++c) {
                const int l = c - column;
                const bool in = b < B && l >= 0 && l < L;
                for (int d = 0; d < DK; ++d)
                    bad += ks[((b * H + h) * C + c) * DK + d] != (in ? k[((b * L + l) * H + h) * DK + d] : W(0));
                for (int d = 0; d < DV; ++d)
                    bad += vs[((b * H + h) * C + c) * DV + d] != (in ? v[((b * L + l) * H + h) * DV + d] : W(0));
            }
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < HQ; ++h)
            for (int l = 0; l < L; ++l)
                for (int d = 0; d < DQ; ++d)
                    bad += qo[((b * HQ + h) * L + l) * DQ + d] != q[((b * L + l) * HQ + h) * DQ + d];
    return bad;
}

int main() {
    int bad = 0;
    // (B, H, C, DK, DV, L, HQ, DQ, column): a decode step, a 3-token
    // verify at the end of the capacity, keys and values of other widths.
    bad += check<unsigned short>(2, 3, 10, 8, 8, 1, 6, 8, 4);
    bad += check<unsigned short>(2, 2, 9, 4, 4, 3, 4, 4, 6);
    bad += check<unsigned char>(1, 2, 7, 6, 10, 2, 5, 6, 0);
    bad += check<unsigned int>(3, 1, 5, 4, 2, 1, 3, 4, 4);
    printf("wrong elements: %d\n", bad);
    return bad != 0;
}
"#;

#[test]
fn the_kv_write_kernel_body_writes_each_element_where_it_belongs() {
    let (ok, said) = compile_and_run("kv-write-on-host", &HARNESS.replace("BODY", SOURCE));
    assert!(ok && said.contains("wrong elements: 0"), "{said}");
}
