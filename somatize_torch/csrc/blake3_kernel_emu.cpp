// Runs the CUDA kernels of blake3_kernels.cuh on host threads, for tests.
//
// The kernels are compiled unchanged against a minimal emulation of the CUDA
// built-ins they use: every block runs as kThreads std::threads that share
// the kernel's __shared__ arrays, __syncthreads is a block-wide barrier, and
// __syncwarp / __shfl_sync / __shfl_xor_sync go through a barrier and an
// exchange slot per warp of 32 threads. Blocks run one after another. It is
// slow (one OS thread per CUDA thread) and only meant for inputs of a few MiB,
// but it executes the same cooperative loads, partial-chunk handling, tile
// reductions and pass sequencing that run on the device.
//
//   smz_blake3_emu_rows(data, rows, row_bytes, offset, max_tile_log2, out, leaf_width)
//     copies the batch to `offset` bytes past a 64-byte aligned address (so
//     that every load-width path can be selected), runs the kernels with tiles
//     of at most 2^max_tile_log2 nodes (8 as on the device; smaller values make
//     small inputs take many passes) and writes rows * 32 digest bytes to
//     `out`. Returns 0 or an SMZ_B3_* / -1 code; *leaf_width (if not null)
//     receives the load width of the leaf pass (16, 8, 4 or 1).
//
// Build: g++ -O2 -std=c++20 -pthread -shared -fPIC blake3_kernel_emu.cpp

#include <stdint.h>
#include <string.h>

#include <barrier>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

// ---------------------------------------------------------------- CUDA subset

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

struct alignas(16) uint4 {
  uint32_t x, y, z, w;
};
struct alignas(8) uint2 {
  uint32_t x, y;
};
struct uint3 {
  uint32_t x, y, z;
};

inline uint4 make_uint4(uint32_t x, uint32_t y, uint32_t z, uint32_t w) { return {x, y, z, w}; }

template <class T>
inline T __ldg(const T* p) {
  return *p;
}

namespace smz_emu {

constexpr int kMaxThreads = 1024;

struct Warp {
  explicit Warp(int n) : barrier(n) {}
  std::barrier<> barrier;
  unsigned long long slot[32] = {};
};

struct Block {
  explicit Block(int threads) : barrier(threads) {
    for (int w = 0; w < (threads + 31) / 32; ++w) warps.push_back(std::make_unique<Warp>(32));
  }
  std::barrier<> barrier;
  std::vector<std::unique_ptr<Warp>> warps;
};

Block* g_block = nullptr;

}  // namespace smz_emu

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;

inline void __syncthreads() { smz_emu::g_block->barrier.arrive_and_wait(); }

inline void __syncwarp(unsigned = 0xffffffffu) {
  smz_emu::g_block->warps[threadIdx.x / 32]->barrier.arrive_and_wait();
}

template <class T>
inline T smz_emu_exchange(T value, unsigned src_lane) {
  smz_emu::Warp& w = *smz_emu::g_block->warps[threadIdx.x / 32];
  w.slot[threadIdx.x % 32] = static_cast<unsigned long long>(value);
  w.barrier.arrive_and_wait();
  const T got = static_cast<T>(w.slot[src_lane % 32]);
  w.barrier.arrive_and_wait();
  return got;
}

template <class T>
inline T __shfl_sync(unsigned, T value, int src_lane) {
  return smz_emu_exchange(value, static_cast<unsigned>(src_lane));
}

template <class T>
inline T __shfl_xor_sync(unsigned, T value, int lane_mask) {
  return smz_emu_exchange(value, (threadIdx.x % 32) ^ static_cast<unsigned>(lane_mask));
}

// ---------------------------------------------------------------- kernels

#include "blake3_kernels.cuh"

namespace {

namespace k = smz::blake3_kernels;

template <class Fn>
int run_grid(unsigned blocks, Fn&& kernel_body) {
  static_assert(k::kThreads % 32 == 0 && k::kThreads <= smz_emu::kMaxThreads, "block size");
  for (unsigned b = 0; b < blocks; ++b) {
    smz_emu::Block block(static_cast<int>(k::kThreads));
    smz_emu::g_block = &block;
    std::vector<std::thread> threads;
    threads.reserve(k::kThreads);
    for (uint32_t t = 0; t < k::kThreads; ++t) {
      threads.emplace_back([b, t, &kernel_body] {
        threadIdx = {t, 0, 0};
        blockIdx = {b, 0, 0};
        kernel_body();
      });
    }
    for (std::thread& th : threads) th.join();
    smz_emu::g_block = nullptr;
  }
  return 0;
}

struct EmuLauncher {
  int leaf_width = 0;  // load width of the last leaf pass, for tests

  template <int V>
  int leaf(unsigned blocks, const k::LeafParams& p) {
    leaf_width = V;
    return run_grid(blocks, [&p] { k::leaf_kernel<V>(p); });
  }

  int reduce(unsigned blocks, const k::ReduceParams& p) {
    return run_grid(blocks, [&p] { k::reduce_kernel(p); });
  }
};

std::mutex g_emu_mutex;  // the emulated blocks share one global context

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

}  // namespace

extern "C" {

int smz_blake3_emu_rows(const uint8_t* data, uint64_t rows, uint64_t row_bytes, uint64_t offset,
                        uint32_t max_tile_log2, uint8_t* out, int* leaf_width) {
  const std::lock_guard<std::mutex> guard(g_emu_mutex);
  const uint64_t nbytes = rows * row_bytes;
  const uint64_t padded = ((nbytes + offset + 63) / 64 + 1) * 64;
  std::unique_ptr<void, FreeDeleter> input(std::aligned_alloc(64, padded));
  if (!input) return -1;
  uint8_t* base = static_cast<uint8_t*>(input.get()) + offset;
  if (nbytes) memcpy(base, data, nbytes);
  if (max_tile_log2 > 8) return SMZ_B3_EINVAL;
  const uint64_t scratch_bytes = k::scratch_bytes(rows, row_bytes, max_tile_log2);
  std::vector<uint4> scratch((scratch_bytes + 15) / 16 + 1);
  std::vector<uint4> digests(2 * rows + 1);
  EmuLauncher launcher;
  const int rc = k::run_rows(launcher, nbytes ? base : nullptr, rows, row_bytes,
                             scratch_bytes ? scratch.data() : nullptr, scratch_bytes,
                             digests.data(), max_tile_log2);
  if (rc == 0 && rows) memcpy(out, digests.data(), rows * 32);
  if (leaf_width) *leaf_width = launcher.leaf_width;
  return rc;
}

}  // extern "C"
