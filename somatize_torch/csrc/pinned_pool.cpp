// Page-locked host buffers at exact size, for the staging pool in
// somatize_torch/_native.py (which does the bounding, reuse, side-stream
// copies and events).
//
// torch's own pinned allocator (torch.empty(..., pin_memory=True)) caches
// blocks rounded up to a power of two, so a 2.1 GB staging buffer would pin
// 4 GB; cudaHostAlloc here pins exactly what is asked for. The memory is
// returned with cudaFreeHost when the last tensor referring to it goes away.

#include <cuda_runtime.h>
#include <torch/extension.h>

at::Tensor smz_pinned_empty(int64_t nbytes) {
  TORCH_CHECK(nbytes >= 0, "pinned_empty: negative size ", nbytes);
  const auto options = at::TensorOptions().dtype(at::kByte).device(at::kCPU);
  if (nbytes == 0) return at::empty({0}, options);
  void* ptr = nullptr;
  const cudaError_t err = cudaHostAlloc(&ptr, static_cast<size_t>(nbytes), cudaHostAllocDefault);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    TORCH_CHECK(false, "cudaHostAlloc(", nbytes, " bytes) failed: ", cudaGetErrorString(err));
  }
  return torch::from_blob(
      ptr, {nbytes}, [](void* p) { (void)cudaFreeHost(p); }, options);
}
