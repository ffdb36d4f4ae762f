// Host side of the C ABI: device queries, memory, and the attention driver
// (attend kernel over tiles + full-precision part, then the split merge).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "attend.cuh"

namespace kvarn_cuda {

namespace {
thread_local std::string g_last_error;
}

void set_error(const char* what, cudaError_t err)
{
    g_last_error = std::string(what) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
}

namespace {

struct MergeArgs {
    const float* states;
    int num_q_heads, splits, head_dim, q_tokens;
    Strided4 out;  // [B, T, Hq, D] (AttendArgs::out)
};

// One block per (query head, sequence), one thread per channel: weights of the
// programs' two states each, tile part rotated back with the Hadamard, plus the
// full-precision (sink + tail) part.
__global__ void merge_kernel(MergeArgs a)
{
    extern __shared__ float rot[];
    const int hq = blockIdx.x, b = blockIdx.y, d = threadIdx.x, D = a.head_dim;
    const int n = 2 * a.splits;  // slots [0, splits): tiles (Hadamard frame); [splits, 2 splits): sink/tail
    const float* st = a.states + ((size_t)b * a.num_q_heads + hq) * n * (D + 2);
    float M = -CUDART_INF_F;
    for (int s = 0; s < n; ++s)
        if (st[s * (D + 2) + 1] > 0.0f) M = fmaxf(M, st[s * (D + 2)]);
    float L = 0.0f, tile_part = 0.0f, dense_part = 0.0f;
    for (int s = 0; s < n; ++s) {
        const float l = st[s * (D + 2) + 1];
        if (l == 0.0f) continue;  // this split saw no tokens
        const float w = exp2f(st[s * (D + 2)] - M);
        L = fmaf(w, l, L);
        const float x = w * st[s * (D + 2) + 2 + d];
        if (s < a.splits)
            tile_part += x;
        else
            dense_part += x;
    }
    rot[d] = tile_part;
    __syncthreads();
    const int blk = hadamard_block(D);
    for (int hh = 1; hh < blk; hh <<= 1) {
        float x0 = 0.0f, x1 = 0.0f;
        const bool lower = (d & hh) == 0;
        if (lower) {
            x0 = rot[d];
            x1 = rot[d + hh];
        }
        __syncthreads();
        if (lower) {
            rot[d] = x0 + x1;
            rot[d + hh] = x0 - x1;
        }
        __syncthreads();
    }
    const float y = (rot[d] * rsqrtf((float)blk) + dense_part) / L;
    store_elem(const_cast<void*>(a.out.ptr), a.out.dtype, row_offset(a.out, b, a.q_tokens) + hq * a.out.stride[2] + d * a.out.stride[3],
               y);
}

// q or out [B, Hq, D] (one token per sequence) or [B, T, Hq, D] (T tokens per sequence) as the
// kernels' [B, T, Hq, D]; false for any other rank.
bool as_batch_tokens(const kvarn_cuda_tensor& t, Strided4& s)
{
    if (t.ndim != 3 && t.ndim != 4) return false;
    s = as_strided4(t);
    if (t.ndim == 3) {
        s.shape[0] = t.shape[0];
        s.stride[0] = t.stride[0];
        s.shape[1] = 1;
        s.stride[1] = 0;
    }
    return true;
}

int max_dynamic_smem(int& out)
{
    int dev = 0;
    KVARN_CUDA_TRY(cudaGetDevice(&dev), "cudaGetDevice");
    KVARN_CUDA_TRY(cudaDeviceGetAttribute(&out, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
                   "cudaDeviceGetAttribute");
    return KVARN_CUDA_OK;
}

}  // namespace
}  // namespace kvarn_cuda

using namespace kvarn_cuda;

extern "C" {

const char* kvarn_cuda_last_error(void) { return g_last_error.c_str(); }

int kvarn_cuda_device_count(int32_t* count)
{
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();  // no driver / no device is an answer, not a sticky error
        set_error("cudaGetDeviceCount", err);
        *count = 0;
        return KVARN_CUDA_ERR_CUDA;
    }
    *count = n;
    return KVARN_CUDA_OK;
}

int kvarn_cuda_device_props(int32_t device, int64_t props[5])
{
    cudaDeviceProp p;
    KVARN_CUDA_TRY(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties");
    props[0] = p.multiProcessorCount;
    props[1] = p.major;
    props[2] = p.minor;
    props[3] = (int64_t)p.sharedMemPerBlockOptin;
    props[4] = p.l2CacheSize;
    return KVARN_CUDA_OK;
}

int kvarn_cuda_set_device(int32_t device)
{
    KVARN_CUDA_TRY(cudaSetDevice(device), "cudaSetDevice");
    return KVARN_CUDA_OK;
}

int kvarn_cuda_get_device(int32_t* device)
{
    int d = 0;
    KVARN_CUDA_TRY(cudaGetDevice(&d), "cudaGetDevice");
    *device = d;
    return KVARN_CUDA_OK;
}

int kvarn_cuda_malloc(uintptr_t* ptr, size_t bytes)
{
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, bytes ? bytes : 1);
    if (err != cudaSuccess) {
        // A refused allocation is an answer (Python raises MemoryError), not an error that the next
        // kernel launch's cudaGetLastError() should report: clear it (it is not sticky).
        (void)cudaGetLastError();
        ::kvarn_cuda::set_error("cudaMalloc", err);
        return KVARN_CUDA_ERR_CUDA;
    }
    *ptr = reinterpret_cast<uintptr_t>(p);
    return KVARN_CUDA_OK;
}

int kvarn_cuda_free(uintptr_t ptr)
{
    KVARN_CUDA_TRY(cudaFree(reinterpret_cast<void*>(ptr)), "cudaFree");
    return KVARN_CUDA_OK;
}

int kvarn_cuda_memset(uintptr_t ptr, int value, size_t bytes, uintptr_t stream)
{
    KVARN_CUDA_TRY(cudaMemsetAsync(reinterpret_cast<void*>(ptr), value, bytes, (cudaStream_t)stream), "cudaMemsetAsync");
    return KVARN_CUDA_OK;
}

int kvarn_cuda_memcpy_htod(uintptr_t dst, const void* src, size_t bytes, uintptr_t stream)
{
    // Pageable source: the runtime stages it before returning, so the caller may reuse it at once.
    KVARN_CUDA_TRY(cudaMemcpyAsync(reinterpret_cast<void*>(dst), src, bytes, cudaMemcpyHostToDevice,
                                   (cudaStream_t)stream),
                   "cudaMemcpyAsync (host to device)");
    return KVARN_CUDA_OK;
}

int kvarn_cuda_memcpy_dtoh(void* dst, uintptr_t src, size_t bytes, uintptr_t stream)
{
    KVARN_CUDA_TRY(cudaMemcpyAsync(dst, reinterpret_cast<const void*>(src), bytes, cudaMemcpyDeviceToHost,
                                   (cudaStream_t)stream),
                   "cudaMemcpyAsync (device to host)");
    KVARN_CUDA_TRY(cudaStreamSynchronize((cudaStream_t)stream), "cudaStreamSynchronize");
    return KVARN_CUDA_OK;
}

int kvarn_cuda_memcpy_dtod(uintptr_t dst, uintptr_t src, size_t bytes, uintptr_t stream)
{
    KVARN_CUDA_TRY(cudaMemcpyAsync(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes,
                                   cudaMemcpyDeviceToDevice, (cudaStream_t)stream),
                   "cudaMemcpyAsync (device to device)");
    return KVARN_CUDA_OK;
}

int kvarn_cuda_memcpy_2d_dtod(uintptr_t dst, size_t dpitch, uintptr_t src, size_t spitch, size_t width, size_t height,
                              uintptr_t stream)
{
    KVARN_CUDA_TRY(cudaMemcpy2DAsync(reinterpret_cast<void*>(dst), dpitch, reinterpret_cast<const void*>(src), spitch,
                                     width, height, cudaMemcpyDeviceToDevice, (cudaStream_t)stream),
                   "cudaMemcpy2DAsync (device to device)");
    return KVARN_CUDA_OK;
}

int kvarn_cuda_stream_sync(uintptr_t stream)
{
    KVARN_CUDA_TRY(cudaStreamSynchronize((cudaStream_t)stream), "cudaStreamSynchronize");
    return KVARN_CUDA_OK;
}

size_t kvarn_cuda_attend_scratch(int32_t batch, int32_t num_q_heads, int32_t head_dim, int32_t splits)
{
    return sizeof(float) * (size_t)batch * num_q_heads * (size_t)(2 * splits) * (head_dim + 2);
}

int kvarn_cuda_attend(const kvarn_cuda_cache* c, int32_t layer, uintptr_t meta, int32_t batch,
                      const kvarn_cuda_tensor* q, int32_t num_q_heads, float scale, const kvarn_cuda_tensor* out,
                      uintptr_t scratch, int32_t splits, int32_t tiles_per_split, int32_t q_rows,
                      uintptr_t stream)
{
    if (!c || !q || !out || !meta || !scratch || batch <= 0 || splits < 1 || tiles_per_split < 1 ||
        (q_rows != 4 && q_rows != 8))
        return KVARN_CUDA_ERR_ARGUMENT;
    if (!kvarn_cuda_format_supported(c->kbits, c->vbits, c->group, c->head_dim)) return KVARN_CUDA_ERR_ARGUMENT;
    if (c->num_kv_heads <= 0 || num_q_heads % c->num_kv_heads != 0 || layer < 0 || layer >= c->num_layers)
        return KVARN_CUDA_ERR_ARGUMENT;
    int max_smem = 0;
    if (int rc = max_dynamic_smem(max_smem)) return rc;

    AttendArgs a;
    a.c = *c;
    a.L = record_layout(c->kbits, c->vbits, c->group, c->head_dim);
    a.layer = layer;
    a.meta = reinterpret_cast<const int*>(meta);
    if (!as_batch_tokens(*q, a.q) || !as_batch_tokens(*out, a.out)) return KVARN_CUDA_ERR_ARGUMENT;
    // meta has a row per token of each sequence: batch = B x T
    if (a.q.shape[1] < 1 || a.q.shape[0] * a.q.shape[1] != batch || a.q.shape[2] != num_q_heads ||
        a.q.shape[3] != c->head_dim)
        return KVARN_CUDA_ERR_ARGUMENT;
    for (int i = 0; i < 4; ++i)
        if (a.out.shape[i] != a.q.shape[i]) return KVARN_CUDA_ERR_ARGUMENT;
    a.q_tokens = (int)a.q.shape[1];
    a.num_q_heads = num_q_heads;
    a.scale = scale;
    a.states = reinterpret_cast<float*>(scratch);
    a.splits = splits;
    a.tiles_per_split = tiles_per_split;
    const int group_q = num_q_heads / c->num_kv_heads;
    a.q_rows = q_rows;
    a.q_chunks = (group_q + q_rows - 1) / q_rows;
    a.stages_per_warp = 1;
    // Direct path (splits <= 8: one cluster per head group merges in shared memory, no merge
    // kernel). With one split only for short splits: s5 A/B, 4K x 32 (31 tiles) 81.7 -> 80.6 us,
    // but 32K x 32 (255 tiles) 288.4 -> 291.6 and 128K x 32 969 -> 973 / 998 (cause not found).
    // KVARN_ATTEND_DIRECT (read once): 0 off, 2 also for long single splits (A/B timings).
    static const int direct_mode = [] {
        const char* e = std::getenv("KVARN_ATTEND_DIRECT");
        return e ? std::atoi(e) : 1;
    }();
    a.direct = direct_mode != 0 && splits <= 8 && (splits > 1 || tiles_per_split <= 64 || direct_mode == 2) ? 1 : 0;
    cudaStream_t s = (cudaStream_t)stream;
    int rc;
    switch (c->head_dim) {
    case 64: rc = launch_attend_d64(c->kbits, c->vbits, c->group, a, batch, max_smem, s); break;
    case 128: rc = launch_attend_d128(c->kbits, c->vbits, c->group, a, batch, max_smem, s); break;
    case 256: rc = launch_attend_d256(c->kbits, c->vbits, c->group, a, batch, max_smem, s); break;
    default: return KVARN_CUDA_ERR_ARGUMENT;
    }
    if (rc) return rc;
    if (a.direct) return KVARN_CUDA_OK;  // the attend launch wrote out

    MergeArgs m;
    m.states = a.states;
    m.num_q_heads = num_q_heads;
    m.splits = splits;
    m.head_dim = c->head_dim;
    m.out = a.out;
    m.q_tokens = a.q_tokens;
    merge_kernel<<<dim3((unsigned)num_q_heads, (unsigned)batch), c->head_dim, c->head_dim * sizeof(float), s>>>(m);
    KVARN_CUDA_TRY(cudaGetLastError(), "merge kernel launch");
    return KVARN_CUDA_OK;
}

}  // extern "C"
