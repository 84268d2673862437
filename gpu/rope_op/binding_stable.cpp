// Registers vLLM's csrc/pos_encoding_kernels.cu, built alone, as
// torch.ops._C.rotary_embedding with vLLM's schema, for trees whose kernel
// uses the stable libtorch ABI (torch::stable::Tensor, as vLLM builds it into
// _C_stable_libtorch), so that vLLM's Python code and tests reach it as they
// reach vLLM's own extension.
#include <cstdint>
#include <optional>

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>

void rotary_embedding(torch::stable::Tensor& positions,
                      torch::stable::Tensor& query,
                      std::optional<torch::stable::Tensor> key,
                      int64_t head_size, torch::stable::Tensor& cos_sin_cache,
                      bool is_neox, int64_t rope_dim_offset, bool inverse);

STABLE_TORCH_LIBRARY(_C, m) {
  m.def(
      "rotary_embedding(Tensor positions, Tensor! query, Tensor!? key, "
      "int head_size, Tensor cos_sin_cache, bool is_neox, "
      "int rope_dim_offset=0, bool inverse=False) -> ()");
}

STABLE_TORCH_LIBRARY_IMPL(_C, CUDA, m) {
  m.impl("rotary_embedding", TORCH_BOX(&rotary_embedding));
}
