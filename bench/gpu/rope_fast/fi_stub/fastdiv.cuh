// Stand-in for FlashInfer's fastdiv.cuh, found before nothing else on the
// include path of the FlashInfer build (fi_ext.py): the real one needs
// cuda::fast_mod_div from a newer CCCL than CUDA 13.0 ships. page.cuh (which
// pos_enc.cuh includes) names uint_fastdiv; the rope kernels never divide
// with it, so a plain divider stands in.
#ifndef FLASHINFER_FASTDIV_CUH_
#define FLASHINFER_FASTDIV_CUH_
#include <cstdint>

namespace flashinfer {

struct uint_fastdiv {
  uint32_t d_ = 1;
  __host__ __device__ uint_fastdiv() {}
  __host__ uint_fastdiv(uint32_t d) : d_(d) {}
  __host__ __device__ operator unsigned int() const { return d_; }
  __host__ __device__ void divmod(uint32_t n, uint32_t& q, uint32_t& r) const {
    q = n / d_;
    r = n - q * d_;
  }
};

__host__ __device__ inline uint32_t operator/(uint32_t n, const uint_fastdiv& d) {
  return n / d.d_;
}
__host__ __device__ inline uint32_t operator%(uint32_t n, const uint_fastdiv& d) {
  return n % d.d_;
}

}  // namespace flashinfer

#endif  // FLASHINFER_FASTDIV_CUH_
