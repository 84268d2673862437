// Wraps FlashInfer's BatchQKApplyRotaryPosIdsCosSinCache (pos_enc.cuh of the
// flashinfer-python wheel that prepare.sh staged) as the torch op
// rope_flashinfer::apply, in place on q and k, for the benchmark.
#include <cstdint>

#include <ATen/cuda/CUDAContext.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <torch/all.h>
#include <torch/library.h>

// page.cuh (included by pos_enc.cuh) includes fastdiv.cuh; fi_stub/ holds
// a stand-in for it, first on the include path (see fi_ext.py).
#include <flashinfer/pos_enc.cuh>

template <typename T>
void apply_typed(torch::Tensor& positions, torch::Tensor& q, torch::Tensor& k,
                 int64_t head_size, torch::Tensor& cache, bool is_neox) {
  const uint32_t nnz = q.size(0);
  const uint32_t num_q = q.size(1) / head_size;
  const uint32_t num_k = k.size(1) / head_size;
  const uint32_t rot_dim = cache.size(1);
  T* qp = reinterpret_cast<T*>(q.data_ptr());
  T* kp = reinterpret_cast<T*>(k.data_ptr());
  const size_t qn = q.stride(0), kn = k.stride(0), h = head_size;
  cudaError_t err = flashinfer::BatchQKApplyRotaryPosIdsCosSinCache<T, int64_t>(
      qp, kp, qp, kp, cache.data_ptr<float>(), positions.data_ptr<int64_t>(),
      nnz, num_q, num_k, rot_dim, head_size, qn, h, kn, h, qn, h, kn, h,
      /*interleave=*/!is_neox, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "flashinfer rope: ", cudaGetErrorString(err));
}

void apply(torch::Tensor& positions, torch::Tensor& q, torch::Tensor& k,
           int64_t head_size, torch::Tensor& cache, bool is_neox) {
  TORCH_CHECK(cache.scalar_type() == at::kFloat, "FlashInfer needs a float32 cache");
  TORCH_CHECK(q.dim() == 2 && k.dim() == 2, "q, k: [tokens, heads * head_size]");
  if (q.scalar_type() == at::kBFloat16) {
    apply_typed<__nv_bfloat16>(positions, q, k, head_size, cache, is_neox);
  } else if (q.scalar_type() == at::kHalf) {
    apply_typed<__half>(positions, q, k, head_size, cache, is_neox);
  } else {
    TORCH_CHECK(false, "FlashInfer rope: bf16 or fp16 query");
  }
}

TORCH_LIBRARY(rope_flashinfer, m) {
  m.def(
      "apply(Tensor positions, Tensor! q, Tensor! k, int head_size, "
      "Tensor cache, bool is_neox) -> ()");
  m.impl("apply", torch::kCUDA, &apply);
}
