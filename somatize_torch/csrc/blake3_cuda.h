// C ABI of the CUDA BLAKE3 kernels (blake3_cuda.cu).
//
// All functions return 0 on success, a cudaError_t value (> 0) when a CUDA
// call failed, or one of the negative SMZ_B3_E* codes below.
// smz_blake3_cuda_strerror() turns either kind into a message.
//
// Digests are byte-identical to the reference BLAKE3 hash (32-byte output)
// of the same bytes. A row batch is `rows` inputs of `row_bytes` bytes each,
// stored back to back; row_bytes may be 0 (every row is the empty input).

#ifndef SMZ_BLAKE3_CUDA_H
#define SMZ_BLAKE3_CUDA_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
  SMZ_B3_EINVAL = -22,   // bad argument (null pointer with data, misaligned scratch/output)
  SMZ_B3_ESCRATCH = -28, // scratch smaller than smz_blake3_cuda_scratch_bytes()
  SMZ_B3_ETOOBIG = -27,  // the launch grid would exceed the device limits
};

// Device scratch (bytes) smz_blake3_cuda_rows_async needs for this shape.
uint64_t smz_blake3_cuda_scratch_bytes(uint64_t rows, uint64_t row_bytes);

// Enqueues the digests of a row batch on `stream` (a cudaStream_t, NULL for
// the default stream) and returns without waiting. `scratch` and `out_dev`
// are device memory, 16-byte aligned; `out_dev` receives rows * 32 bytes.
// Both must stay allocated until the stream has run the work.
int smz_blake3_cuda_rows_async(const void* data, uint64_t rows, uint64_t row_bytes, void* scratch,
                               uint64_t scratch_bytes, void* out_dev, void* stream);

// Synchronous conveniences: allocate scratch with cudaMallocAsync on
// `stream`, run, copy the digests to host memory and wait for the stream.
int smz_blake3_cuda(const void* dev_ptr, uint64_t len, uint8_t out_host[32], void* stream);
int smz_blake3_cuda_rows(const void* dev_ptr, uint64_t rows, uint64_t row_bytes,
                         uint8_t* out_host, void* stream);

const char* smz_blake3_cuda_strerror(int code);

#ifdef __cplusplus
}
#endif

#endif  // SMZ_BLAKE3_CUDA_H
