// Wraps FlashInfer's BatchQKApplyRotaryPosIdsCosSinCache (pos_enc.cuh of the
// flashinfer-python wheel that prepare.sh staged) as the torch op
// ROPE_FI_NS::apply (rope_flashinfer unless the build names another, one per
// FlashInfer version), in place on q and k, for the benchmark.
#include <cstdint>

#include <ATen/cuda/CUDAContext.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <torch/all.h>
#include <torch/library.h>

// page.cuh (included by pos_enc.cuh) includes fastdiv.cuh; fi_stub/ holds
// a stand-in for it, first on the include path (see fi_ext.py).
#include <flashinfer/pos_enc.cuh>

// q and k: [tokens, heads * head_size] or views [tokens, heads, head_size]
// with any token and head stride (e.g. DeepSeek's q_pe / k_pe).
struct Layout {
  uint32_t heads;
  size_t stride_n, stride_h;
};

Layout layout_of(const torch::Tensor& x, int64_t head_size) {
  if (x.dim() == 3) {
    TORCH_CHECK(x.size(2) == head_size && x.stride(2) == 1, "bad [T, H, D] view");
    return {static_cast<uint32_t>(x.size(1)), static_cast<size_t>(x.stride(0)),
            static_cast<size_t>(x.stride(1))};
  }
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "q, k: [tokens, heads * head_size]");
  return {static_cast<uint32_t>(x.size(1) / head_size),
          static_cast<size_t>(x.stride(0)), static_cast<size_t>(head_size)};
}

template <typename T>
void apply_typed(torch::Tensor& positions, torch::Tensor& q, torch::Tensor& k,
                 int64_t head_size, torch::Tensor& cache, bool is_neox) {
  const uint32_t nnz = q.size(0);
  const Layout lq = layout_of(q, head_size), lk = layout_of(k, head_size);
  const uint32_t rot_dim = cache.size(1);
  T* qp = reinterpret_cast<T*>(q.data_ptr());
  T* kp = reinterpret_cast<T*>(k.data_ptr());
  cudaError_t err = flashinfer::BatchQKApplyRotaryPosIdsCosSinCache<T, int64_t>(
      qp, kp, qp, kp, cache.data_ptr<float>(), positions.data_ptr<int64_t>(),
      nnz, lq.heads, lk.heads, rot_dim, head_size, lq.stride_n, lq.stride_h,
      lk.stride_n, lk.stride_h, lq.stride_n, lq.stride_h, lk.stride_n,
      lk.stride_h, /*interleave=*/!is_neox, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "flashinfer rope: ", cudaGetErrorString(err));
}

void apply(torch::Tensor& positions, torch::Tensor& q, torch::Tensor& k,
           int64_t head_size, torch::Tensor& cache, bool is_neox) {
  TORCH_CHECK(cache.scalar_type() == at::kFloat, "FlashInfer needs a float32 cache");
  if (q.scalar_type() == at::kBFloat16) {
    apply_typed<__nv_bfloat16>(positions, q, k, head_size, cache, is_neox);
  } else if (q.scalar_type() == at::kHalf) {
    apply_typed<__half>(positions, q, k, head_size, cache, is_neox);
  } else {
    TORCH_CHECK(false, "FlashInfer rope: bf16 or fp16 query");
  }
}

#ifndef ROPE_FI_NS
#define ROPE_FI_NS rope_flashinfer
#endif
// One level more, so that ROPE_FI_NS is expanded before TORCH_LIBRARY pastes it.
#define ROPE_FI_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)

ROPE_FI_LIBRARY(ROPE_FI_NS, m) {
  m.def(
      "apply(Tensor positions, Tensor! q, Tensor! k, int head_size, "
      "Tensor cache, bool is_neox) -> ()");
  m.impl("apply", torch::kCUDA, &apply);
}
