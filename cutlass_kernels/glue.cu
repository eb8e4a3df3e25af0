// Project-owned C API over the generated CUTLASS kernels (libbass_cutlass.so).
//
// Plain extern "C" functions taking pointers, leading dimensions and batch strides (in
// elements), problem sizes, alpha and a CUDA stream as void*: no C++ ABI tie to any torch
// version, and the library is linked with a static cudart, so ctypes can load it on a
// machine without a GPU (nothing touches CUDA until a function is called).
//
// Every function returns 0 on success or a BassStatus code (launch.h); the message of the
// last failure on the calling thread is bass_cutlass_last_error(). Nothing here allocates
// device memory or synchronises: buffers and workspaces come from the caller (torch).
//
// Compile with -DBASS_CUTLASS_ARCH=90 (pad uses the CUTLASS 3.x sm90 kernels) or 80
// (pad uses the 2.x sm80 kernels); split's grouped kernels are the same in both.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "generated/kernels.h"
#include "launch.h"

#ifndef BASS_CUTLASS_ARCH
#define BASS_CUTLASS_ARCH 90
#endif

#define BASS_CUTLASS_ABI_VERSION 1

namespace bass_cutlass {

namespace {
thread_local std::string g_last_error;
}  // namespace

void set_error(const char* message) { g_last_error = message; }

int sm_count(int device) {
  static int cached[64] = {0};
  if (device < 0 || device >= 64) return 0;
  if (cached[device] <= 0) {
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      cudaGetLastError();  // clear the (non-sticky) error
      return 0;
    }
    cached[device] = n;
  }
  return cached[device];
}

namespace {

using BatchedFn = int (*)(const BatchedArgs&);
using GroupedFn = int (*)(const GroupedArgs&);

// [product][dtype]: product 0 = qk (scores^T = k q^T), 1 = pv (out = P v); dtype 0 = f16,
// 1 = bf16.
#if BASS_CUTLASS_ARCH >= 90
const BatchedFn kBatched[2][2] = {{sm90_pad_qk_f16, sm90_pad_qk_bf16},
                                  {sm90_pad_pv_f16, sm90_pad_pv_bf16}};
const char* const kArchName = "sm_90a";
#else
const BatchedFn kBatched[2][2] = {{sm80_pad_qk_f16, sm80_pad_qk_bf16},
                                  {sm80_pad_pv_f16, sm80_pad_pv_bf16}};
const char* const kArchName = "sm_80";
#endif
const GroupedFn kGrouped[2][2] = {{grouped_qk_f16, grouped_qk_bf16},
                                  {grouped_pv_f16, grouped_pv_bf16}};

bool valid_selector(int product, int dtype) {
  return (product == 0 || product == 1) && (dtype == 0 || dtype == 1);
}

// ------------------------------------------------------------------ split's device setup

// Workspace of a split call with P problems: two GemmCoord arrays (qk, pv), then six
// pointer arrays and six leading-dimension arrays (a, b, d for qk, then for pv).
struct SplitLayout {
  size_t sizes[2];
  size_t ptr[6];
  size_t ld[6];
  size_t total;
  explicit SplitLayout(int p) {
    size_t off = 0;
    const size_t n = static_cast<size_t>(p > 0 ? p : 0);
    for (int i = 0; i < 2; ++i) {
      sizes[i] = off;
      off += n * 3 * sizeof(int);
    }
    off = (off + 15) / 16 * 16;
    for (int i = 0; i < 6; ++i) {
      ptr[i] = off;
      off += n * sizeof(void*);
    }
    for (int i = 0; i < 6; ++i) {
      ld[i] = off;
      off += n * sizeof(int64_t);
    }
    total = (off + 15) / 16 * 16;
  }
};

struct SplitSetup {
  int batch, heads_kv, group, q_rows, head_dim, cache_len, elem_bytes;
  const int* q_lens;
  const int* kv_lens;
  const char* q;
  int64_t q_sb, q_sh, ldq;
  const char* k;
  int64_t k_sb, k_sh, ldk;
  const char* v;
  int64_t v_sb, v_sh, ldv;
  char* scores;  // float32
  char* probs;   // input dtype
  int64_t sp_slab, ld_sp;
  char* out;  // input dtype
  int64_t out_slab, ld_out;
  char* ws;
  SplitLayout layout;
};

// One thread per problem p = b * heads_kv + h: the query rows of kv head h are the G*T
// rows r = g*T + t (q viewed [B*Hkv, G*T, D]); problem p covers rows r < M_b =
// (G-1)*T + q_len (every valid row, and padding rows in between, whose softmax is 0).
// Lengths are clamped into range so a bad length cannot read outside the tensors.
__global__ void split_setup_kernel(SplitSetup s) {
  const int p = blockIdx.x * blockDim.x + threadIdx.x;
  const int problems = s.batch * s.heads_kv;
  if (p >= problems) return;
  const int b = p / s.heads_kv;
  const int h = p % s.heads_kv;
  int kl = s.kv_lens[b];
  kl = kl < 0 ? 0 : (kl > s.cache_len ? s.cache_len : kl);
  int ql = s.q_lens[b];
  const int ql_max = s.q_rows < kl ? s.q_rows : kl;
  ql = ql < 0 ? 0 : (ql > ql_max ? ql_max : ql);
  const int mb = ql > 0 ? (s.group - 1) * s.q_rows + ql : 0;
  const int eb = s.elem_bytes;

  int* qk = reinterpret_cast<int*>(s.ws + s.layout.sizes[0]) + 3 * p;
  int* pv = reinterpret_cast<int*>(s.ws + s.layout.sizes[1]) + 3 * p;
  qk[0] = mb > 0 ? kl : 0;  // M = keys
  qk[1] = mb;               // N = query rows
  qk[2] = s.head_dim;       // K = head dim
  pv[0] = mb;               // M = query rows
  pv[1] = mb > 0 ? s.head_dim : 0;
  pv[2] = kl;  // K = keys

  const void* ptrs[6] = {
      s.k + (b * s.k_sb + h * s.k_sh) * eb,         // qk A = k
      s.q + (b * s.q_sb + h * s.q_sh) * eb,         // qk B = q rows
      s.scores + p * s.sp_slab * 4,                 // qk D = scores^T (float32)
      s.probs + p * s.sp_slab * eb,                 // pv A = P (P^T row-major)
      s.v + (b * s.v_sb + h * s.v_sh) * eb,         // pv B = v
      s.out + p * s.out_slab * eb,                  // pv D = out
  };
  const int64_t lds[6] = {s.ldk, s.ldq, s.ld_sp, s.ld_sp, s.ldv, s.ld_out};
  for (int i = 0; i < 6; ++i) {
    reinterpret_cast<const void**>(s.ws + s.layout.ptr[i])[p] = ptrs[i];
    reinterpret_cast<int64_t*>(s.ws + s.layout.ld[i])[p] = lds[i];
  }
}

}  // namespace
}  // namespace bass_cutlass

using namespace bass_cutlass;

extern "C" {

/// ABI version of this C API; the Python loader refuses a library of another version.
int bass_cutlass_abi_version(void) { return BASS_CUTLASS_ABI_VERSION; }

/// "arch=sm_90a abi=1": what this library was built for.
const char* bass_cutlass_build_info(void) {
  static std::string info =
      std::string("arch=") + kArchName + " abi=" + std::to_string(BASS_CUTLASS_ABI_VERSION);
  return info.c_str();
}

/// Message of the last failure on this thread ("" if none yet).
const char* bass_cutlass_last_error(void) { return g_last_error.c_str(); }

/// Batched GEMM (pad): D[l] = alpha * A[l] @ B[l], l < batch, fp32 accumulation.
/// product 0 (qk): A row-major [m, k] (lda), B given as its n rows of k elements (ldb),
///   D float32 row-major [m, n] (ldd).
/// product 1 (pv): A column-major [m, k] (element (i, j) at j * lda + i), B row-major
///   [k, n] (ldb), D row-major [m, n] (ldd) in the input dtype.
/// dtype 0 = float16, 1 = bfloat16. Strides in elements; `stream` is a cudaStream_t.
int bass_cutlass_gemm_batched(int product, int dtype, int m, int n, int k, int batch,
                              const void* a, int64_t lda, int64_t stride_a, const void* b,
                              int64_t ldb, int64_t stride_b, void* d, int64_t ldd,
                              int64_t stride_d, float alpha, int device, void* stream) {
  if (!valid_selector(product, dtype)) {
    return fail(kInvalidArgument, "gemm_batched: bad product %d or dtype %d", product, dtype);
  }
  if (m < 0 || n < 0 || k < 0 || batch < 0) {
    return fail(kInvalidArgument, "gemm_batched: negative size m=%d n=%d k=%d batch=%d", m, n,
                k, batch);
  }
  if (m == 0 || n == 0 || batch == 0) return kOk;
  if (k == 0) return fail(kInvalidArgument, "gemm_batched: k == 0 with a non-empty output");
  if (!a || !b || !d) return fail(kInvalidArgument, "gemm_batched: null pointer");
  BatchedArgs args{m,   n,      k,     batch,    a,
                   lda, stride_a, b,   ldb,      stride_b,
                   d,   ldd,    stride_d, alpha, device,
                   static_cast<cudaStream_t>(stream)};
  return kBatched[product][dtype](args);
}

/// Grouped GEMM: one problem per entry of the device arrays (see GroupedArgs in launch.h).
/// Layouts as for bass_cutlass_gemm_batched's `product`. Problem sizes may differ and
/// may be zero; contiguous extents need no alignment, leading dimensions must be
/// multiples of 8 (16-bit) / 4 (fp32) and pointers 16-byte aligned.
int bass_cutlass_gemm_grouped(int product, int dtype, int problem_count, void* problem_sizes,
                              void** ptr_a, void** ptr_b, void** ptr_d, int64_t* lda,
                              int64_t* ldb, int64_t* ldd, float alpha, int device,
                              void* stream) {
  if (!valid_selector(product, dtype)) {
    return fail(kInvalidArgument, "gemm_grouped: bad product %d or dtype %d", product, dtype);
  }
  if (problem_count < 0) return fail(kInvalidArgument, "gemm_grouped: negative count");
  if (problem_count == 0) return kOk;
  GroupedArgs args{problem_count, problem_sizes, ptr_a, ptr_b, ptr_d, lda, ldb, ldd,
                   alpha,         device,        static_cast<cudaStream_t>(stream)};
  return kGrouped[product][dtype](args);
}

/// Bytes of device workspace bass_cutlass_split_setup needs for `problem_count` problems.
size_t bass_cutlass_split_workspace_bytes(int problem_count) {
  return SplitLayout(problem_count).total;
}

/// Fill a split workspace on the device (one tiny kernel, no host read of the lengths):
/// problem sizes, pointers and leading dimensions of both grouped GEMMs, one problem per
/// (row b, kv head h). q is [B, Hkv*G, T, D] with kv head h's rows at q + b*q_sb + h*q_sh
/// (row stride ldq); k/v rows of (b, h) at k + b*k_sb + h*k_sh (row stride ldk). scores
/// (float32) and probs (dtype) are [B*Hkv, rows, ld_sp] slabs of sp_slab elements; out is
/// [B*Hkv, G*T, ld_out] slabs of out_slab elements. q_lens/kv_lens: int32 device arrays.
int bass_cutlass_split_setup(int dtype, int batch, int heads_kv, int group, int q_rows,
                             int head_dim, int cache_len, const int* q_lens,
                             const int* kv_lens, const void* q, int64_t q_sb, int64_t q_sh,
                             int64_t ldq, const void* k, int64_t k_sb, int64_t k_sh,
                             int64_t ldk, const void* v, int64_t v_sb, int64_t v_sh,
                             int64_t ldv, void* scores, void* probs, int64_t sp_slab,
                             int64_t ld_sp, void* out, int64_t out_slab, int64_t ld_out,
                             void* workspace, void* stream) {
  if (dtype != 0 && dtype != 1) return fail(kInvalidArgument, "split_setup: bad dtype %d", dtype);
  if (batch < 0 || heads_kv <= 0 || group <= 0 || q_rows < 0 || head_dim <= 0) {
    return fail(kInvalidArgument, "split_setup: bad shape B=%d Hkv=%d G=%d T=%d D=%d", batch,
                heads_kv, group, q_rows, head_dim);
  }
  const int problems = batch * heads_kv;
  if (problems == 0) return kOk;
  if (!workspace || !q_lens || !kv_lens) {
    return fail(kInvalidArgument, "split_setup: null workspace or lengths");
  }
  SplitSetup s{batch,   heads_kv,
               group,   q_rows,
               head_dim, cache_len,
               2,       q_lens,
               kv_lens, static_cast<const char*>(q),
               q_sb,    q_sh,
               ldq,     static_cast<const char*>(k),
               k_sb,    k_sh,
               ldk,     static_cast<const char*>(v),
               v_sb,    v_sh,
               ldv,     static_cast<char*>(scores),
               static_cast<char*>(probs), sp_slab,
               ld_sp,   static_cast<char*>(out),
               out_slab, ld_out,
               static_cast<char*>(workspace), SplitLayout(problems)};
  const int threads = 128;
  split_setup_kernel<<<(problems + threads - 1) / threads, threads, 0,
                       static_cast<cudaStream_t>(stream)>>>(s);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return fail(kLaunchFailed, "split_setup: launch failed: %s", cudaGetErrorString(err));
  }
  return kOk;
}

/// Run split's grouped GEMM `product` (0 = qk, 1 = pv) over a workspace that
/// bass_cutlass_split_setup filled for `problem_count` problems.
int bass_cutlass_split_gemm(int product, int dtype, int problem_count, void* workspace,
                            float alpha, int device, void* stream) {
  if (!valid_selector(product, dtype)) {
    return fail(kInvalidArgument, "split_gemm: bad product %d or dtype %d", product, dtype);
  }
  if (problem_count <= 0) return kOk;
  if (!workspace) return fail(kInvalidArgument, "split_gemm: null workspace");
  const SplitLayout L(problem_count);
  char* ws = static_cast<char*>(workspace);
  const int base = 3 * product;
  return bass_cutlass_gemm_grouped(
      product, dtype, problem_count, ws + L.sizes[product],
      reinterpret_cast<void**>(ws + L.ptr[base]), reinterpret_cast<void**>(ws + L.ptr[base + 1]),
      reinterpret_cast<void**>(ws + L.ptr[base + 2]),
      reinterpret_cast<int64_t*>(ws + L.ld[base]), reinterpret_cast<int64_t*>(ws + L.ld[base + 1]),
      reinterpret_cast<int64_t*>(ws + L.ld[base + 2]), alpha, device, stream);
}

}  // extern "C"
