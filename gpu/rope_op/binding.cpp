// Registers vLLM's csrc/pos_encoding_kernels.cu, built alone, as
// torch.ops._C.rotary_embedding with vLLM's schema, so that vLLM's Python code
// and tests reach it as they reach vLLM's own extension. Only for trees whose
// kernel uses the torch::Tensor API (not the stable libtorch ABI).
#include <optional>

#include <torch/all.h>
#include <torch/library.h>

void rotary_embedding(torch::Tensor& positions, torch::Tensor& query,
                      std::optional<torch::Tensor> key, int64_t head_size,
                      torch::Tensor& cos_sin_cache, bool is_neox,
                      int64_t rope_dim_offset, bool inverse);

TORCH_LIBRARY(_C, m) {
  m.def(
      "rotary_embedding(Tensor positions, Tensor! query, Tensor!? key, "
      "int head_size, Tensor cos_sin_cache, bool is_neox, "
      "int rope_dim_offset=0, bool inverse=False) -> ()");
  m.impl("rotary_embedding", torch::kCUDA, &rotary_embedding);
}
