// Project-owned launch helpers shared by the generated kernel files and glue.cu.
//
// Each generated file (cutlass_kernels/generated/*.cu) defines one CUTLASS device-level
// operator type `DeviceKernel` and instantiates one of the runners below for it. The
// runners never allocate, never synchronise and launch on the caller's stream; they
// return a BassStatus and record a message readable with bass_cutlass_last_error().
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

namespace bass_cutlass {

enum BassStatus : int {
  kOk = 0,
  kInvalidArgument = 1,
  kNotImplementable = 2,  // CUTLASS can_implement() refused the problem
  kInitializeFailed = 3,  // CUTLASS initialize() failed (e.g. shared-memory attribute)
  kLaunchFailed = 4,      // the launch itself failed (cudaGetLastError)
  kNotBuilt = 5,          // no kernel for this dtype/arch in this build
  kCudaError = 6,         // another CUDA runtime call failed
};

// Records the message for bass_cutlass_last_error() (thread-local; defined in glue.cu).
void set_error(const char* message);

template <typename... Args>
int fail(int status, const char* fmt, Args... args) {
  char buf[512];
  std::snprintf(buf, sizeof(buf), fmt, args...);
  set_error(buf);
  return status;
}

// Multiprocessor count of `device`, cached (defined in glue.cu).
int sm_count(int device);

// D[l] = alpha * A[l] @ B[l] for l < batch; every operand has one leading dimension and
// one batch stride, in elements. The layouts are fixed by the kernel (see generate.py).
struct BatchedArgs {
  int m, n, k, batch;
  const void* a;
  int64_t lda, stride_a;
  const void* b;
  int64_t ldb, stride_b;
  void* d;
  int64_t ldd, stride_d;
  float alpha;
  int device;
  cudaStream_t stream;
};

// One GEMM per problem; every array lives in device memory, `problem_sizes` holds
// `problem_count` cutlass::gemm::GemmCoord ({m, n, k} as three ints).
struct GroupedArgs {
  int problem_count;
  void* problem_sizes;
  void** ptr_a;
  void** ptr_b;
  void** ptr_d;
  int64_t* lda;
  int64_t* ldb;
  int64_t* ldd;
  float alpha;
  int device;
  cudaStream_t stream;
};

// ---------------------------------------------------------------------------------------
// Runners: only the generated files see these, after including the CUTLASS headers their
// kernel needs (BASS_CUTLASS_KERNEL_TU for 2.x, plus BASS_CUTLASS_KERNEL_TU_3X for 3.x).
#ifdef BASS_CUTLASS_KERNEL_TU

inline int check_launch(const char* name) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return fail(kLaunchFailed, "%s: launch failed: %s", name, cudaGetErrorString(err));
  }
  return kOk;
}

#ifdef BASS_CUTLASS_KERNEL_TU_3X
// Stride for a 3.x operand: (ld, 1, batch) when the first mode is dynamic (K-major A or
// B, row-major C/D), (1, ld, batch) when it is the unit mode (M-/N-major).
template <class Stride>
Stride make_batched_stride(int64_t ld, int64_t batch) {
  Stride s{};
  using First = cute::remove_cvref_t<decltype(cute::get<0>(s))>;
  if constexpr (cute::is_static<First>::value) {
    cute::get<1>(s) = ld;
  } else {
    cute::get<0>(s) = ld;
  }
  cute::get<2>(s) = batch;
  return s;
}

template <class DeviceKernel>
int run_batched_3x(const BatchedArgs& a, const char* name) {
  using Kernel = typename DeviceKernel::GemmKernel;
  using ElementA = typename DeviceKernel::ElementA;
  using ElementB = typename DeviceKernel::ElementB;
  using ElementC = typename DeviceKernel::ElementC;
  using ElementD = typename DeviceKernel::ElementD;
  cutlass::KernelHardwareInfo hw;
  hw.device_id = a.device;
  hw.sm_count = sm_count(a.device);
  if (hw.sm_count <= 0) return fail(kCudaError, "%s: cannot read the SM count", name);
  auto sa = make_batched_stride<typename Kernel::StrideA>(a.lda, a.stride_a);
  auto sb = make_batched_stride<typename Kernel::StrideB>(a.ldb, a.stride_b);
  auto sd = make_batched_stride<typename Kernel::StrideD>(a.ldd, a.stride_d);
  auto sc = make_batched_stride<typename Kernel::StrideC>(a.ldd, a.stride_d);
  typename DeviceKernel::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {a.m, a.n, a.k, a.batch},
      {static_cast<const ElementA*>(a.a), sa, static_cast<const ElementB*>(a.b), sb},
      {{a.alpha, 0.0f},
       static_cast<const ElementC*>(a.d),  // beta == 0: C is never read
       sc,
       static_cast<ElementD*>(a.d),
       sd},
      hw};
  DeviceKernel op;
  if (op.can_implement(args) != cutlass::Status::kSuccess) {
    return fail(kNotImplementable,
                "%s: CUTLASS cannot implement m=%d n=%d k=%d batch=%d lda=%lld ldb=%lld "
                "ldd=%lld (16-bit operands need contiguous extents and strides that are "
                "multiples of 8, fp32 ones multiples of 4, 16-byte aligned pointers)",
                name, a.m, a.n, a.k, a.batch, (long long)a.lda, (long long)a.ldb,
                (long long)a.ldd);
  }
  if (DeviceKernel::get_workspace_size(args) != 0) {
    return fail(kNotImplementable, "%s: kernel unexpectedly needs a workspace", name);
  }
  cutlass::Status st = op.initialize(args, nullptr, a.stream);
  if (st != cutlass::Status::kSuccess) {
    return fail(kInitializeFailed, "%s: initialize failed: %s", name,
                cutlass::cutlassGetStatusString(st));
  }
  st = op.run(a.stream);
  if (st != cutlass::Status::kSuccess) {
    return fail(kLaunchFailed, "%s: run failed: %s", name, cutlass::cutlassGetStatusString(st));
  }
  return check_launch(name);
}
#endif  // BASS_CUTLASS_KERNEL_TU_3X

template <class DeviceKernel>
int run_batched_2x(const BatchedArgs& a, const char* name) {
  using ElementA = typename DeviceKernel::ElementA;
  using ElementB = typename DeviceKernel::ElementB;
  using ElementC = typename DeviceKernel::ElementC;
  typename DeviceKernel::Arguments args(
      cutlass::gemm::GemmUniversalMode::kBatched, {a.m, a.n, a.k}, a.batch, {a.alpha, 0.0f},
      static_cast<const ElementA*>(a.a), static_cast<const ElementB*>(a.b),
      static_cast<const ElementC*>(a.d), static_cast<ElementC*>(a.d), a.stride_a, a.stride_b,
      a.stride_d, a.stride_d, a.lda, a.ldb, a.ldd, a.ldd);
  DeviceKernel op;
  if (op.can_implement(args) != cutlass::Status::kSuccess) {
    return fail(kNotImplementable,
                "%s: CUTLASS cannot implement m=%d n=%d k=%d batch=%d lda=%lld ldb=%lld "
                "ldd=%lld",
                name, a.m, a.n, a.k, a.batch, (long long)a.lda, (long long)a.ldb,
                (long long)a.ldd);
  }
  if (DeviceKernel::get_workspace_size(args) != 0) {
    return fail(kNotImplementable, "%s: kernel unexpectedly needs a workspace", name);
  }
  cutlass::Status st = op.initialize(args, nullptr, a.stream);
  if (st != cutlass::Status::kSuccess) {
    return fail(kInitializeFailed, "%s: initialize failed: %s", name,
                cutlass::cutlassGetStatusString(st));
  }
  st = op.run(a.stream);
  if (st != cutlass::Status::kSuccess) {
    return fail(kLaunchFailed, "%s: run failed: %s", name, cutlass::cutlassGetStatusString(st));
  }
  return check_launch(name);
}

// Threadblocks for a grouped GEMM: one full wave at maximum occupancy, cached per device.
// `static` (internal linkage) keeps the cache a plain local symbol, not a GNU-unique one
// that the library would have to export.
template <class DeviceKernel>
static int grouped_threadblocks(int device) {
  static int cached[64] = {0};
  if (device < 0 || device >= 64) return 0;
  if (cached[device] == 0) {
    int blocks = DeviceKernel::maximum_active_blocks();
    cached[device] = blocks > 0 ? blocks * sm_count(device) : -1;
  }
  return cached[device];
}

template <class DeviceKernel>
int run_grouped_2x(const GroupedArgs& a, const char* name) {
  using ElementA = typename DeviceKernel::ElementA;
  using ElementB = typename DeviceKernel::ElementB;
  using ElementC = typename DeviceKernel::ElementC;
  using LdA = typename DeviceKernel::LayoutA::Stride::LongIndex;
  using LdB = typename DeviceKernel::LayoutB::Stride::LongIndex;
  using LdC = typename DeviceKernel::LayoutC::Stride::LongIndex;
  static_assert(sizeof(LdA) == sizeof(int64_t) && sizeof(LdB) == sizeof(int64_t) &&
                    sizeof(LdC) == sizeof(int64_t),
                "leading dimensions are int64_t arrays");
  static_assert(sizeof(cutlass::gemm::GemmCoord) == 3 * sizeof(int), "GemmCoord is 3 ints");
  if (a.problem_count <= 0) return kOk;
  int blocks = grouped_threadblocks<DeviceKernel>(a.device);
  if (blocks <= 0) return fail(kCudaError, "%s: cannot size the grid (occupancy query)", name);
  typename DeviceKernel::Arguments args(
      static_cast<cutlass::gemm::GemmCoord*>(a.problem_sizes), a.problem_count, blocks,
      {a.alpha, 0.0f}, reinterpret_cast<ElementA**>(a.ptr_a),
      reinterpret_cast<ElementB**>(a.ptr_b),
      reinterpret_cast<ElementC**>(a.ptr_d),  // beta == 0: C is never read
      reinterpret_cast<ElementC**>(a.ptr_d), reinterpret_cast<LdA*>(a.lda),
      reinterpret_cast<LdB*>(a.ldb), reinterpret_cast<LdC*>(a.ldd),
      reinterpret_cast<LdC*>(a.ldd));
  DeviceKernel op;
  // Device-side problem sizes: can_implement cannot see them (the caller guarantees the
  // alignment rules documented in cutlass_kernels/README.md).
  if (op.can_implement(args) != cutlass::Status::kSuccess) {
    return fail(kNotImplementable, "%s: CUTLASS cannot implement this grouped GEMM", name);
  }
  cutlass::Status st = op.initialize(args, nullptr, a.stream);
  if (st != cutlass::Status::kSuccess) {
    return fail(kInitializeFailed, "%s: initialize failed: %s", name,
                cutlass::cutlassGetStatusString(st));
  }
  st = op.run(a.stream);
  if (st != cutlass::Status::kSuccess) {
    return fail(kLaunchFailed, "%s: run failed: %s", name, cutlass::cutlassGetStatusString(st));
  }
  return check_launch(name);
}

#endif  // BASS_CUTLASS_KERNEL_TU

}  // namespace bass_cutlass
