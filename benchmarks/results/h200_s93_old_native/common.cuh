// Helpers shared by the kvarn CUDA kernels: element loads of the three input
// dtypes, record field offsets, and the few PTX instructions we use (bulk
// copy into shared memory completing on an mbarrier, fp16 tensor-core mma).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "kvarn_cuda.h"
#include "layout.h"

namespace kvarn_cuda {


struct Strided4 {
    const void* ptr;
    int dtype;
    int64_t shape[4];
    int64_t stride[4];
};

inline Strided4 as_strided4(const kvarn_cuda_tensor& t)
{
    Strided4 s;
    s.ptr = reinterpret_cast<const void*>(t.ptr);
    s.dtype = t.dtype;
    for (int i = 0; i < 4; ++i) {
        // Leading dims of fewer-than-4-D tensors are 1.
        int src = i - (4 - t.ndim);
        s.shape[i] = src >= 0 ? t.shape[src] : 1;
        s.stride[i] = src >= 0 ? t.stride[src] : 0;
    }
    return s;
}

__device__ __forceinline__ float load_elem(const void* base, int dtype, int64_t idx)
{
    if (dtype == KVARN_F32) return static_cast<const float*>(base)[idx];
    if (dtype == KVARN_F16) return __half2float(static_cast<const __half*>(base)[idx]);
    return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[idx]);
}

__device__ __forceinline__ void store_elem(void* base, int dtype, int64_t idx, float x)
{
    if (dtype == KVARN_F32)
        static_cast<float*>(base)[idx] = x;
    else if (dtype == KVARN_F16)
        static_cast<__half*>(base)[idx] = __float2half_rn(x);
    else
        static_cast<__nv_bfloat16*>(base)[idx] = __float2bfloat16_rn(x);
}

__device__ __forceinline__ uint32_t smem_u32(const void* p)
{
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarrier + bulk copy (sm_90) ------------------------------------------------
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity)
{
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "KVARN_WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        "@!p bra KVARN_WAIT_%=;\n"
        "}\n" ::"r"(smem_u32(bar)),
        "r"(parity)
        : "memory");
}

// One contiguous record (bytes % 16 == 0, both addresses 16-byte aligned) into shared memory.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar)
{
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
            smem_u32(dst)),
        "l"(src), "r"(bytes), "r"(smem_u32(bar))
        : "memory");
}

__device__ __forceinline__ void fence_proxy_async()
{
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// ---- tensor-core mma: D = A(16x16, fp16, row) * B(16x8, fp16, col) + C (fp32) --------
__device__ __forceinline__ void mma_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint32_t b0, uint32_t b1)
{
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_half2(__half lo, __half hi)
{
    return (uint32_t)__half_as_ushort(lo) | ((uint32_t)__half_as_ushort(hi) << 16);
}

// x (fp32) as hi + lo fp16 parts: hi + lo carries ~22 bits of x.
__device__ __forceinline__ void split_f16(float x, __half& hi, __half& lo)
{
    hi = __float2half_rn(x);
    lo = __float2half_rn(x - __half2float(hi));
}

__device__ __forceinline__ float warp_max(float x)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

// 2^e as a float for e in [-126, 127].
__device__ __forceinline__ float exp2i(int e)
{
    return __uint_as_float((uint32_t)(e + 127) << 23);
}

// Largest power of two dividing n: the block of the block-diagonal Hadamard (SPEC §2,
// format.h's kvarn_hadamard_block).
__host__ __device__ __forceinline__ int hadamard_block(int n) { return n & (-n); }

void set_error(const char* what, cudaError_t err);  // api.cu

}  // namespace kvarn_cuda

#define KVARN_CUDA_TRY(call, what)                                     \
    do {                                                               \
        cudaError_t kvarn_err_ = (call);                               \
        if (kvarn_err_ != cudaSuccess) {                               \
            ::kvarn_cuda::set_error(what, kvarn_err_);                 \
            /* else the next launch check reports it again (sticky    \
               errors stay: the runtime returns them on every call) */ \
            (void)cudaGetLastError();                                  \
            return KVARN_CUDA_ERR_CUDA;                                \
        }                                                              \
    } while (0)
