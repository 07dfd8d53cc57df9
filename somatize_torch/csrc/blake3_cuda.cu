// CUDA BLAKE3 over device memory: one digest per buffer or per row of a
// contiguous batch, with the C ABI declared in blake3_cuda.h. The kernels and
// the pass plan are in blake3_kernels.cuh (see there for the design); this
// file only launches them.

#include <cuda_runtime.h>
#include <stdint.h>

#include "blake3_cuda.h"
#include "blake3_kernels.cuh"

namespace {

namespace k = smz::blake3_kernels;

struct CudaLauncher {
  cudaStream_t stream;

  template <int V>
  int leaf(unsigned blocks, const k::LeafParams& p) {
    k::leaf_kernel<V><<<blocks, k::kThreads, 0, stream>>>(p);
    return static_cast<int>(cudaGetLastError());
  }

  int reduce(unsigned blocks, const k::ReduceParams& p) {
    k::reduce_kernel<<<blocks, k::kThreads, 0, stream>>>(p);
    return static_cast<int>(cudaGetLastError());
  }
};

}  // namespace

extern "C" {

uint64_t smz_blake3_cuda_scratch_bytes(uint64_t rows, uint64_t row_bytes) {
  return k::scratch_bytes(rows, row_bytes);
}

int smz_blake3_cuda_rows_async(const void* data, uint64_t rows, uint64_t row_bytes, void* scratch,
                               uint64_t scratch_bytes, void* out_dev, void* stream) {
  CudaLauncher launcher{static_cast<cudaStream_t>(stream)};
  return k::run_rows(launcher, data, rows, row_bytes, scratch, scratch_bytes, out_dev);
}

int smz_blake3_cuda_rows(const void* dev_ptr, uint64_t rows, uint64_t row_bytes,
                         uint8_t* out_host, void* stream) {
  if (rows == 0) return 0;
  if (out_host == nullptr) return SMZ_B3_EINVAL;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const uint64_t scratch_bytes = smz_blake3_cuda_scratch_bytes(rows, row_bytes);
  const uint64_t out_bytes = rows * 32u;
  const uint64_t total = scratch_bytes + out_bytes;  // both multiples of 32
  void* mem = nullptr;
  bool pooled = true;
  cudaError_t err = cudaMallocAsync(&mem, total, s);
  if (err == cudaErrorNotSupported) {
    (void)cudaGetLastError();
    pooled = false;
    err = cudaMalloc(&mem, total);
  }
  if (err != cudaSuccess) return static_cast<int>(err);
  uint8_t* base = static_cast<uint8_t*>(mem);
  int rc = smz_blake3_cuda_rows_async(dev_ptr, rows, row_bytes, scratch_bytes ? base : nullptr,
                                      scratch_bytes, base + scratch_bytes, stream);
  if (rc == 0) {
    rc = static_cast<int>(
        cudaMemcpyAsync(out_host, base + scratch_bytes, out_bytes, cudaMemcpyDeviceToHost, s));
  }
  const cudaError_t free_err = pooled ? cudaFreeAsync(mem, s) : cudaSuccess;
  const cudaError_t sync_err = cudaStreamSynchronize(s);
  if (!pooled) {
    const cudaError_t e = cudaFree(mem);
    if (rc == 0) rc = static_cast<int>(e);
  }
  if (rc == 0) rc = static_cast<int>(free_err);
  if (rc == 0) rc = static_cast<int>(sync_err);
  return rc;
}

int smz_blake3_cuda(const void* dev_ptr, uint64_t len, uint8_t out_host[32], void* stream) {
  return smz_blake3_cuda_rows(dev_ptr, 1, len, out_host, stream);
}

const char* smz_blake3_cuda_strerror(int code) {
  switch (code) {
    case 0: return "success";
    case SMZ_B3_EINVAL: return "invalid argument (null or misaligned pointer)";
    case SMZ_B3_ESCRATCH: return "scratch buffer too small";
    case SMZ_B3_ETOOBIG: return "input too large for one launch grid";
    default: break;
  }
  if (code > 0) return cudaGetErrorString(static_cast<cudaError_t>(code));
  return "unknown error";
}

}  // extern "C"
