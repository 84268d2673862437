// Memory probe for the RoPE benchmark: what the GPU gives for reading and
// writing back the first `touch_bytes` of every `row_bytes`-byte row (the
// rotated part of each head under partial rotary), in 16-byte vectors. No
// arithmetic but an xor with a runtime zero, so that the stores are not
// dropped. Each thread loads `ITEMS` vectors (a block's vectors are
// consecutive, `threads` apart per item) before storing any, so ITEMS sets
// how many loads a thread has in flight. Nothing depends on the warp size.
#include <torch/all.h>
#include <torch/library.h>
#include <ATen/cuda/CUDAContext.h>

#include <algorithm>
#include <cstdint>

namespace {

template <int ITEMS>
__global__ void touch_kernel(uint4* __restrict__ base, const int64_t vectors,
                             const int64_t touch_vecs, const int64_t row_vecs,
                             const unsigned key) {
  const int64_t first =
      static_cast<int64_t>(blockIdx.x) * blockDim.x * ITEMS + threadIdx.x;
  uint4 v[ITEMS];
  int64_t at[ITEMS];
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int64_t i = first + static_cast<int64_t>(k) * blockDim.x;
    at[k] = i < vectors ? (i / touch_vecs) * row_vecs + i % touch_vecs : -1;
    if (at[k] >= 0) {
      v[k] = base[at[k]];
    }
  }
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    if (at[k] >= 0) {
      v[k].x ^= key;
      v[k].y ^= key;
      v[k].z ^= key;
      v[k].w ^= key;
      base[at[k]] = v[k];
    }
  }
}

// The access pattern of a NeoX rotation in 16-byte pieces, one thread per
// pair of pieces: each thread reads and writes piece c of the first half of a
// row's touched part and piece c of its second half, as two accesses. With
// `alternate` unset, each access of a warp covers only first or only second
// halves; with it set, odd pieces take their second half first, so that each
// access covers pieces of both halves.
__global__ void touch_halves_kernel(uint4* __restrict__ base,
                                    const int64_t pairs,
                                    const int64_t half_vecs,
                                    const int64_t row_vecs, const bool alternate,
                                    const unsigned key) {
  const int64_t i =
      static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= pairs) {
    return;
  }
  const int64_t c = i % half_vecs;
  const bool swap = alternate && (c & 1);
  uint4* p = base + (i / half_vecs) * row_vecs + c + (swap ? half_vecs : 0);
  const int64_t other = swap ? -half_vecs : half_vecs;
  uint4 a = p[0], b = p[other];
  a.x ^= key, a.y ^= key, a.z ^= key, a.w ^= key;
  b.x ^= key, b.y ^= key, b.z ^= key, b.w ^= key;
  p[0] = a;
  p[other] = b;
}

// x: a contiguous tensor whose size in bytes is a multiple of row_bytes;
// row_bytes and touch_bytes multiples of 16.
void touch(torch::Tensor& x, int64_t row_bytes, int64_t touch_bytes,
           int64_t threads, int64_t items) {
  TORCH_CHECK(x.is_cuda() && x.is_contiguous(), "touch: contiguous CUDA tensor");
  const int64_t bytes = x.numel() * x.element_size();
  TORCH_CHECK(row_bytes % 16 == 0 && touch_bytes % 16 == 0 &&
                  touch_bytes <= row_bytes && bytes % row_bytes == 0,
              "touch: bad row/touch bytes");
  const int64_t touch_vecs = touch_bytes / 16, row_vecs = row_bytes / 16;
  const int64_t vectors = bytes / row_bytes * touch_vecs;
  const int64_t per_block = threads * std::max<int64_t>(items, 1);
  const dim3 grid(static_cast<unsigned>((vectors + per_block - 1) / per_block));
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  auto* base = reinterpret_cast<uint4*>(x.data_ptr());
  if (items <= 0) {  // the NeoX pattern: pairs of pieces, two accesses
    TORCH_CHECK(touch_vecs % 2 == 0, "touch: halves need an even piece count");
    const int64_t pairs = vectors / 2;
    const dim3 hgrid(static_cast<unsigned>((pairs + threads - 1) / threads));
    touch_halves_kernel<<<hgrid, static_cast<unsigned>(threads), 0, stream>>>(
        base, pairs, touch_vecs / 2, row_vecs, items < 0, 0u);
    return;
  }
  switch (items) {
#define TOUCH_CASE(n)                                                      \
  case n:                                                                  \
    touch_kernel<n><<<grid, static_cast<unsigned>(threads), 0, stream>>>( \
        base, vectors, touch_vecs, row_vecs, 0u);                          \
    break;
    TOUCH_CASE(1)
    TOUCH_CASE(2)
    TOUCH_CASE(4)
    TOUCH_CASE(8)
#undef TOUCH_CASE
    default:
      TORCH_CHECK(false, "touch: items must be -1, 0 (halves), 1, 2, 4 or 8");
  }
}

}  // namespace

TORCH_LIBRARY(rope_probe, m) {
  m.def("touch(Tensor! x, int row_bytes, int touch_bytes, int threads, int items) -> ()");
  m.impl("touch", torch::kCUDA, &touch);
}
