// Registers one build of csrc/pos_encoding_kernels.cu under its own operator
// namespace, so that several builds can be loaded into one process.
// ROPE_NS is set per build (-DROPE_NS=...); the kernel file's host function
// is renamed per build as well (-Drotary_embedding=...), see rope_ext.py.
#include <optional>

#include <torch/all.h>
#include <torch/library.h>

void rotary_embedding(torch::Tensor& positions, torch::Tensor& query,
                      std::optional<torch::Tensor> key, int64_t head_size,
                      torch::Tensor& cos_sin_cache, bool is_neox,
                      int64_t rope_dim_offset, bool inverse);

#define ROPE_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)

ROPE_LIBRARY(ROPE_NS, m) {
  // Same schema as vLLM's _C::rotary_embedding.
  m.def(
      "rotary_embedding(Tensor positions, Tensor! query, Tensor!? key, "
      "int head_size, Tensor cos_sin_cache, bool is_neox, "
      "int rope_dim_offset=0, bool inverse=False) -> ()");
  m.impl("rotary_embedding", torch::kCUDA, &rotary_embedding);
}
