// torch bindings of the CUDA BLAKE3 kernels and the exact-size pinned
// allocator. Built on first use by somatize_torch._native.cuda_extension()
// (torch.utils.cpp_extension.load) together with blake3_cuda.cu and
// pinned_pool.cpp.
//
//   blake3_digest(x)              x: CUDA uint8, 1-D     -> CPU uint8 [32]
//   blake3_digest_rows(x)         x: CUDA uint8, 2-D     -> CPU uint8 [rows, 32]
//   blake3_digest_rows_async(x)   x: CUDA uint8, 2-D     -> CUDA uint8 [rows, 32]
//                                 (enqueued on the current stream, no sync)
//   blake3_digest_rows_unaligned(x)  like blake3_digest_rows, but a misaligned
//                                 input is digested in place by the narrow-load
//                                 kernels instead of being copied (for tests)
//   pinned_empty(nbytes)          -> CPU uint8 [nbytes], page-locked, exact size
//
// All kernels run on the current CUDA stream of x's device.

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <cstdint>

#include "blake3_cuda.h"

at::Tensor smz_pinned_empty(int64_t nbytes);  // pinned_pool.cpp

namespace {

at::Tensor prepare(const at::Tensor& x, int64_t dim, const char* what, bool realign = true) {
  TORCH_CHECK(x.is_cuda(), what, ": expected a CUDA tensor, got ", x.device());
  TORCH_CHECK(x.scalar_type() == at::kByte, what, ": expected a uint8 tensor, got ",
              x.scalar_type());
  TORCH_CHECK(x.dim() == dim, what, ": expected ", dim, " dimension(s), got ", x.dim());
  at::Tensor c = x.contiguous();
  // The fast kernel path wants 16-byte aligned rows; a sliced view may start
  // anywhere. A device copy costs far less than digesting through the
  // narrow-load path.
  if (realign && c.numel() > 0 && (reinterpret_cast<uintptr_t>(c.data_ptr()) & 15u) != 0) {
    c = c.clone();
  }
  return c;
}

at::Tensor digest_rows_device(const at::Tensor& x2d) {
  const c10::cuda::CUDAGuard guard(x2d.device());
  const int64_t rows = x2d.size(0);
  const int64_t row_bytes = x2d.size(1);
  at::Tensor out = at::empty({rows, 32}, x2d.options());
  if (rows == 0) return out;
  const uint64_t scratch_bytes =
      smz_blake3_cuda_scratch_bytes(static_cast<uint64_t>(rows), static_cast<uint64_t>(row_bytes));
  at::Tensor scratch = at::empty({static_cast<int64_t>(scratch_bytes)}, x2d.options());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x2d.device().index()).stream();
  const int rc = smz_blake3_cuda_rows_async(
      x2d.numel() > 0 ? x2d.data_ptr() : nullptr, static_cast<uint64_t>(rows),
      static_cast<uint64_t>(row_bytes), scratch_bytes > 0 ? scratch.data_ptr() : nullptr,
      scratch_bytes, out.data_ptr(), stream);
  TORCH_CHECK(rc == 0, "blake3 kernels failed: ", smz_blake3_cuda_strerror(rc));
  return out;
}

at::Tensor blake3_digest(const at::Tensor& x) {
  const at::Tensor c = prepare(x, 1, "blake3_digest");
  return digest_rows_device(c.view({1, c.size(0)})).view({32}).cpu();
}

at::Tensor blake3_digest_rows(const at::Tensor& x) {
  return digest_rows_device(prepare(x, 2, "blake3_digest_rows")).cpu();
}

at::Tensor blake3_digest_rows_async(const at::Tensor& x) {
  return digest_rows_device(prepare(x, 2, "blake3_digest_rows_async"));
}

at::Tensor blake3_digest_rows_unaligned(const at::Tensor& x) {
  return digest_rows_device(prepare(x, 2, "blake3_digest_rows_unaligned", false)).cpu();
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "somatize native CUDA ops: BLAKE3 over device memory, exact-size pinned buffers";
  m.def("blake3_digest", &blake3_digest, "BLAKE3 digest of a 1-D CUDA uint8 tensor (CPU [32])");
  m.def("blake3_digest_rows", &blake3_digest_rows,
        "BLAKE3 digest of each row of a 2-D CUDA uint8 tensor (CPU [rows, 32])");
  m.def("blake3_digest_rows_async", &blake3_digest_rows_async,
        "Like blake3_digest_rows, but returns the digests on the device without waiting");
  m.def("blake3_digest_rows_unaligned", &blake3_digest_rows_unaligned,
        "Like blake3_digest_rows, without copying a misaligned input (tests the narrow loads)");
  m.def("pinned_empty", &smz_pinned_empty, "Exact-size page-locked uint8 CPU tensor");
  m.attr("ABI_VERSION") = 1;
}
