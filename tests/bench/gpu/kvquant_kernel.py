"""Prototype of a decode attention that reads quantized K/V codes in place
(one query per row; packed rows as plugin-api/kv-quant stores them), checked
against dequantize + MLX's fused attention and timed against bf16 K/V.
Usage: kvquant_kernel.py"""
import time

import mlx.core as mx

SOURCE = r"""
    constexpr int WARPS = 8;
    constexpr int DPL = D / 32;
    constexpr int NWS = D * BITS / 32 * 2;   // word slots (two 16-bit slots per word)
    constexpr int NG = D / GROUP;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int bh = blockIdx.x;
    const int b = bh / HKV;
    const int h = bh % HKV;
    const int T = k_shape[2];
    float qv[R][DPL];
    for (int r = 0; r < R; ++r)
        for (int i = 0; i < DPL; ++i)
            qv[r][i] = static_cast<float>(q[((size_t)bh * R + r) * D + lane * DPL + i]);
    float m[R], l[R], acc[R][DPL];
    for (int r = 0; r < R; ++r) {
        m[r] = -INFINITY; l[r] = 0.f;
        for (int i = 0; i < DPL; ++i) acc[r][i] = 0.f;
    }
    const size_t kb = (size_t)b * k_strides[0] + (size_t)h * k_strides[1];
    const size_t vb = (size_t)b * v_strides[0] + (size_t)h * v_strides[1];
    for (int t = warp; t < T; t += WARPS) {
        if (HAS_MASK && !mask[(size_t)b * T + t]) continue;
        const auto* krow = k + kb + (size_t)t * k_strides[2];
        const auto* vrow = v + vb + (size_t)t * v_strides[2];
        const uint32_t* kw = reinterpret_cast<const uint32_t*>(krow);
        const uint32_t* vw = reinterpret_cast<const uint32_t*>(vrow);
        float s[R];
        for (int r = 0; r < R; ++r) s[r] = 0.f;
        float vv[DPL];
        for (int i = 0; i < DPL; ++i) {
            const int d = lane * DPL + i;
            const int bo = d * BITS;
            const int g = d / GROUP;
            const float kq = (float)((kw[bo / 32] >> (bo % 32)) & ((1u << BITS) - 1));
            const float kval = static_cast<float>(krow[NWS + g]) * kq + static_cast<float>(krow[NWS + NG + g]);
            const float vq = (float)((vw[bo / 32] >> (bo % 32)) & ((1u << BITS) - 1));
            vv[i] = static_cast<float>(vrow[NWS + g]) * vq + static_cast<float>(vrow[NWS + NG + g]);
            for (int r = 0; r < R; ++r) s[r] += qv[r][i] * kval;
        }
        for (int r = 0; r < R; ++r) {
            for (int o = 16; o > 0; o >>= 1) s[r] += __shfl_xor_sync(0xffffffff, s[r], o);
            const float mn = fmaxf(m[r], s[r]);
            const float corr = __expf(m[r] - mn);
            const float p = __expf(s[r] - mn);
            l[r] = l[r] * corr + p;
            for (int i = 0; i < DPL; ++i) acc[r][i] = acc[r][i] * corr + p * vv[i];
            m[r] = mn;
        }
    }
    __shared__ float sm_m[WARPS][R];
    __shared__ float sm_l[WARPS][R];
    __shared__ float sm_acc[WARPS][R][D];
    for (int r = 0; r < R; ++r) {
        if (lane == 0) { sm_m[warp][r] = m[r]; sm_l[warp][r] = l[r]; }
        for (int i = 0; i < DPL; ++i) sm_acc[warp][r][lane * DPL + i] = acc[r][i];
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < R * D; idx += blockDim.x) {
        const int r = idx / D, d = idx % D;
        float M = -INFINITY;
        for (int w = 0; w < WARPS; ++w) M = fmaxf(M, sm_m[w][r]);
        float L = 0.f, A = 0.f;
        if (M > -INFINITY) {
            for (int w = 0; w < WARPS; ++w) {
                const float c = __expf(sm_m[w][r] - M);
                L += sm_l[w][r] * c;
                A += sm_acc[w][r][d] * c;
            }
        }
        out[((size_t)bh * R + r) * D + d] = static_cast<decltype(out[0])>(L > 0.f ? A / L : 0.f);
    }
"""

kernel = mx.fast.cuda_kernel(
    name="kv_codes_decode_attention",
    input_names=["q", "k", "v", "mask"],
    output_names=["out"],
    source=SOURCE,
    ensure_row_contiguous=False,
)

GROUP = 64


def pack(x, bits):
    w, s, b = mx.quantize(x, group_size=GROUP, bits=bits)
    return mx.concatenate([w.view(x.dtype), s.astype(x.dtype), b.astype(x.dtype)], axis=-1)


def unpack(p, d, bits):
    nws = d * bits // 32 * 2
    ng = d // GROUP
    w = p[..., :nws].view(mx.uint32)
    return mx.dequantize(w, p[..., nws:nws + ng], p[..., nws + ng:], group_size=GROUP, bits=bits).astype(p.dtype)


def attend(q, kp, vp, mask, bits, scale):
    B, HQ, _, D = q.shape
    HKV = kp.shape[1]
    qs = (q * scale).reshape(B, HQ, D)
    m = mask.reshape(B, -1) if mask is not None else mx.zeros((1,), dtype=mx.bool_)
    return kernel(
        inputs=[qs, kp, vp, m],
        template=[("BITS", bits), ("GROUP", GROUP), ("D", D), ("R", HQ // HKV), ("HKV", HKV), ("HAS_MASK", mask is not None)],
        grid=(B * HKV * 256, 1, 1),
        threadgroup=(256, 1, 1),
        output_shapes=[(B, HQ, 1, D)],
        output_dtypes=[q.dtype],
    )[0]


def timed(f, n=36):
    for _ in range(3):
        mx.eval(f())
    mx.synchronize()
    t = time.perf_counter()
    mx.eval([f() for _ in range(n)])
    mx.synchronize()
    return (time.perf_counter() - t) / n * 1e3


def main():
    mx.random.seed(0)
    scale = 128 ** -0.5
    print("| case | max abs diff vs dequantize + sdpa |\n|---|---|")
    for bits in (8, 4):
        for (B, HQ, HKV, T, CAP, masked) in [(2, 8, 2, 77, 96, False), (3, 32, 8, 300, 320, True)]:
            q = mx.random.normal((B, HQ, 1, 128)).astype(mx.bfloat16)
            buf_k = pack(mx.random.normal((B, HKV, CAP, 128)).astype(mx.bfloat16), bits)
            buf_v = pack(mx.random.normal((B, HKV, CAP, 128)).astype(mx.bfloat16), bits)
            kp, vp = buf_k[:, :, :T, :], buf_v[:, :, :T, :]
            mask = None
            if masked:
                lens = mx.array([T, T - 50, T - 120])
                mask = (mx.arange(T)[None, :] >= (T - lens)[:, None]).reshape(B, 1, 1, T)
            want = mx.fast.scaled_dot_product_attention(q, unpack(kp, 128, bits), unpack(vp, 128, bits), scale=scale, mask=mask)
            got = attend(q, kp, vp, mask, bits, scale)
            diff = mx.abs(got.astype(mx.float32) - want.astype(mx.float32)).max().item()
            print(f"| {bits}-bit B={B} Hq={HQ} Hkv={HKV} T={T} mask={masked} | {diff:.5f} |")
    print("\n| 16 rows, 8 K/V heads, 32 query heads | ms per layer call |\n|---|---|")
    for T in (2048, 8192, 32768 // 4):
        B, HQ, HKV = 16, 32, 8
        q = mx.random.normal((B, HQ, 1, 128)).astype(mx.bfloat16)
        k = mx.random.normal((B, HKV, T, 128)).astype(mx.bfloat16)
        v = mx.random.normal((B, HKV, T, 128)).astype(mx.bfloat16)
        mask = mx.ones((B, 1, 1, T), dtype=mx.bool_)
        mx.eval(q, k, v, mask)
        print(f"| T={T} bf16 fused sdpa | {timed(lambda: mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)):.3f} |")
        for bits in (8, 4):
            kp, vp = pack(k, bits), pack(v, bits)
            mx.eval(kp, vp)
            print(f"| T={T} {bits}-bit dequantize + sdpa | {timed(lambda: mx.fast.scaled_dot_product_attention(q, unpack(kp, 128, bits), unpack(vp, 128, bits), scale=scale, mask=mask)):.3f} |")
            print(f"| T={T} {bits}-bit codes in place (this kernel) | {timed(lambda: attend(q, kp, vp, mask, bits, scale)):.3f} |")
    for T in (32768,):
        B, HQ, HKV = 1, 32, 8
        q = mx.random.normal((B, HQ, 1, 128)).astype(mx.bfloat16)
        k = mx.random.normal((B, HKV, T, 128)).astype(mx.bfloat16)
        v = mx.random.normal((B, HKV, T, 128)).astype(mx.bfloat16)
        mx.eval(q, k, v)
        print(f"| 1 row T={T} bf16 fused sdpa | {timed(lambda: mx.fast.scaled_dot_product_attention(q, k, v, scale=scale)):.3f} |")
        for bits in (8, 4):
            kp, vp = pack(k, bits), pack(v, bits)
            mx.eval(kp, vp)
            print(f"| 1 row T={T} {bits}-bit codes in place (this kernel) | {timed(lambda: attend(q, kp, vp, None, bits, scale)):.3f} |")


main()
