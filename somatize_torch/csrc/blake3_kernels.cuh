// The BLAKE3 CUDA kernels and the host-side plan that sequences them.
//
// Included by blake3_cuda.cu (compiled by nvcc) and by blake3_kernel_emu.cpp,
// which compiles the very same code with g++ against a small emulation of the
// CUDA built-ins it uses (threads, barriers, warp shuffles, shared memory) so
// that the host test suite runs these kernels too. Keep the device code to
// that subset: threadIdx.x, blockIdx.x, __syncthreads, __syncwarp,
// __shfl_sync, __shfl_xor_sync, __ldg, uint2/uint4/make_uint4 and
// __shared__ arrays declared at the top of a kernel. Include it in one
// translation unit per library (it defines kernels).
//
// Work decomposition (for a single buffer, rows = 1):
//
//   leaf pass     one thread per 1 KiB chunk of every row. Threads of a warp
//                 stage each 64-byte block of their 32 chunks through shared
//                 memory so that global loads are 16-byte vectors over
//                 contiguous 64-byte runs, and prefetch block b + 1 while
//                 compressing block b. The chunks of a row are grouped in
//                 aligned tiles of 2^t chunks (t from leaf_tile_log2); each
//                 tile is reduced level by level in shared memory to one node.
//   reduce passes the tile nodes of a row are again grouped in tiles of up to
//                 256 and reduced in shared memory, until one node per row is
//                 left. The merge that produces a row's last node carries ROOT.
//
// A 19 MiB buffer is one leaf launch (76 tile nodes) and one reduce launch;
// 256 MiB and 4 GiB take two reduce launches (1,024 then 4 nodes; 16,384 then
// 64). Rows of at most 1 KiB finish in the leaf launch.
// Rows whose start is not 16-byte aligned (misaligned base pointer, or
// row_bytes not a multiple of 16) take a slower path with per-thread 8-, 4-
// or 1-byte loads.

#ifndef SMZ_BLAKE3_KERNELS_CUH
#define SMZ_BLAKE3_KERNELS_CUH

#include <stdint.h>

#include "blake3_cuda.h"
#include "blake3_tree.h"

namespace smz {
namespace blake3_kernels {

namespace b3 = smz::blake3;

constexpr uint32_t kThreads = 256;
constexpr uint32_t kWarps = kThreads / 32;
constexpr uint32_t kFullMask = 0xffffffffu;

struct LeafParams {
  const uint8_t* data;
  uint64_t rows;
  uint64_t row_bytes;
  uint64_t chunks_per_row;
  uint64_t tiles_per_row;
  uint32_t tile_log2;
  uint32_t final_pass;  // tiles_per_row == 1: outputs are the digests
  uint32_t* out;        // (rows * tiles_per_row) nodes of 8 words
};

struct ReduceParams {
  const uint32_t* in;  // rows * count nodes
  uint64_t rows;
  uint64_t count;
  uint64_t tiles_per_row;
  uint32_t tile_log2;
  uint32_t final_pass;
  uint32_t* out;  // rows * tiles_per_row nodes
};

// Bytes [p + off, p + off + 4) that lie below p + rem, as a little-endian
// word with zeros for the rest. Reads nothing at or beyond p + rem.
__device__ __forceinline__ uint32_t word_partial(const uint8_t* p, int64_t off, int64_t rem) {
  uint32_t w = 0u;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if (off + j < rem) w |= static_cast<uint32_t>(__ldg(p + off + j)) << (8 * j);
  }
  return w;
}

// Bytes [p, p + min(rem, 16)) as four little-endian words, zero-padded. The
// vector load is used only when all 16 bytes belong to the input (p is then
// 16-byte aligned by construction).
__device__ __forceinline__ uint4 load16(const uint8_t* p, int64_t rem) {
  if (rem >= 16) return __ldg(reinterpret_cast<const uint4*>(p));
  if (rem <= 0) return make_uint4(0u, 0u, 0u, 0u);
  return make_uint4(word_partial(p, 0, rem), word_partial(p, 4, rem), word_partial(p, 8, rem),
                    word_partial(p, 12, rem));
}

// One 64-byte block for one thread, with loads of V bytes (V in {1, 4, 8}),
// zero-padded past p + rem.
template <int V>
__device__ __forceinline__ void load_block_direct(const uint8_t* p, int64_t rem, uint32_t m[16]) {
  if constexpr (V == 8) {
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int64_t off = 8 * u;
      if (off + 8 <= rem) {
        const uint2 x = __ldg(reinterpret_cast<const uint2*>(p + off));
        m[2 * u] = x.x;
        m[2 * u + 1] = x.y;
      } else {
        m[2 * u] = word_partial(p, off, rem);
        m[2 * u + 1] = word_partial(p, off + 4, rem);
      }
    }
  } else if constexpr (V == 4) {
#pragma unroll
    for (int u = 0; u < 16; ++u) {
      const int64_t off = 4 * u;
      m[u] = off + 4 <= rem ? __ldg(reinterpret_cast<const uint32_t*>(p + off))
                            : word_partial(p, off, rem);
    }
  } else {
#pragma unroll
    for (int u = 0; u < 16; ++u) m[u] = word_partial(p, 4 * u, rem);
  }
}

__device__ __forceinline__ void compress_chunk_block(uint32_t cv[8], const uint32_t m[16],
                                                     uint64_t chunk, uint32_t b, uint32_t nblocks,
                                                     uint32_t clen, uint32_t root_flag) {
  const bool last = b + 1 == nblocks;
  const uint32_t block_len = last ? clen - b * b3::BLOCK_LEN : b3::BLOCK_LEN;
  uint32_t flags = b == 0 ? static_cast<uint32_t>(b3::CHUNK_START) : 0u;
  if (last) flags |= b3::CHUNK_END | root_flag;
  b3::compress(cv, m, chunk, block_len, flags, cv);
}

__device__ __forceinline__ void store_node(uint32_t* dst, const uint32_t w[8]) {
  uint4* d = reinterpret_cast<uint4*>(dst);
  d[0] = make_uint4(w[0], w[1], w[2], w[3]);
  d[1] = make_uint4(w[4], w[5], w[6], w[7]);
}

// Reduces the tile this thread belongs to (2^tile_log2 consecutive threads,
// nodes in `nodes`, 8 words per thread) level by level; the tile's first
// thread writes the result to `out_node`. m0 is the number of valid nodes in
// the tile (uniform within the tile, 0 for padding tiles). All threads of the
// block must call this (it synchronises the block).
__device__ __forceinline__ void tile_reduce_store(uint32_t* nodes, uint32_t tile_log2, uint64_t m0,
                                                  bool final_pass, uint32_t* out_node) {
  const uint32_t tid = threadIdx.x;
  const uint32_t k = tid & ((1u << tile_log2) - 1u);
  uint32_t* base = nodes + (tid - k) * 8u;
  uint64_t m = m0;
  for (uint32_t lvl = 0; lvl < tile_log2; ++lvl) {
    const uint64_t produced = (m + 1) >> 1;
    const bool work = k < produced;
    uint32_t tmp[8];
    if (work) b3::level_node(base, 8, m, k, final_pass, tmp);
    __syncthreads();
    if (work) store_node(base + k * 8u, tmp);
    __syncthreads();
    m = produced;
  }
  if (k == 0 && m0 > 0) {
    const uint4* s = reinterpret_cast<const uint4*>(base);
    uint4* d = reinterpret_cast<uint4*>(out_node);
    d[0] = s[0];
    d[1] = s[1];
  }
}

// Where one thread of a pass stands: threads are laid out as tiles of
// 2^tile_log2 slots, tiles_per_row tiles per row. `row` and `tir` (tile in row)
// name the tile, `k` the slot in it, `index` the node (or chunk) of the row the
// slot covers.
struct Slot {
  uint64_t row, tir, k, index;
};

__device__ __forceinline__ Slot slot_of(uint32_t tile_log2, uint64_t tiles_per_row) {
  const uint64_t slot = static_cast<uint64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const uint64_t tile = slot >> tile_log2;
  Slot s;
  s.k = slot & ((1ull << tile_log2) - 1ull);
  s.row = tile / tiles_per_row;
  s.tir = tile - s.row * tiles_per_row;
  s.index = (s.tir << tile_log2) + s.k;
  return s;
}

// Leaf pass. V = 16: rows are 16-byte aligned, warp-cooperative staged loads.
// V in {8, 4, 1}: per-thread loads of that width.
template <int V>
__global__ void __launch_bounds__(kThreads) leaf_kernel(LeafParams p) {
  // Staging for the cooperative loads (128 units of 16 bytes per warp), then
  // reused for the tile nodes (8 words per thread).
  __shared__ __align__(16) uint4 smem[kWarps * 128];
  static_assert(sizeof(uint4) * kWarps * 128 >= sizeof(uint32_t) * 8 * kThreads, "node area");

  const uint32_t tid = threadIdx.x;
  const Slot at = slot_of(p.tile_log2, p.tiles_per_row);
  const uint64_t row = at.row, tir = at.tir, chunk = at.index;
  const bool row_valid = row < p.rows;
  const bool active = row_valid && chunk < p.chunks_per_row;

  const uint8_t* cptr = p.data;
  uint32_t clen = 0;
  uint32_t nblocks = 0;
  if (active) {
    const uint64_t off = chunk * b3::CHUNK_LEN;
    const uint64_t left = p.row_bytes - off;  // row_bytes == 0 only with chunk == 0
    clen = static_cast<uint32_t>(left < b3::CHUNK_LEN ? left : uint64_t{b3::CHUNK_LEN});
    cptr = p.data + row * p.row_bytes + off;
    nblocks = clen == 0 ? 1u : (clen + b3::BLOCK_LEN - 1) / b3::BLOCK_LEN;
  }
  const uint32_t root_flag = p.chunks_per_row == 1 ? static_cast<uint32_t>(b3::ROOT) : 0u;

  uint32_t cv[8];
  b3::load_iv(cv);

  if constexpr (V == 16) {
    const uint32_t lane = tid & 31u;
    uint4* stage = smem + (tid >> 5) * 128u;
    // Pointers and lengths of the jobs whose units this lane fetches.
    const uint8_t* jptr[4];
    int64_t jlen[4];
#pragma unroll
    for (uint32_t i = 0; i < 4; ++i) {
      const int src = static_cast<int>(b3::coop_job(lane, i));
      jptr[i] = reinterpret_cast<const uint8_t*>(
          __shfl_sync(kFullMask, reinterpret_cast<unsigned long long>(cptr), src));
      jlen[i] = static_cast<int64_t>(__shfl_sync(kFullMask, clen, src));
    }
    uint32_t warp_blocks = nblocks;
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) {
      const uint32_t other = __shfl_xor_sync(kFullMask, warp_blocks, s);
      warp_blocks = other > warp_blocks ? other : warp_blocks;
    }

    uint4 pre[4];
#pragma unroll
    for (uint32_t i = 0; i < 4; ++i) {
      const int64_t off = 16 * b3::coop_unit(lane, i);
      pre[i] = load16(jptr[i] + off, jlen[i] - off);
    }
    for (uint32_t b = 0; b < warp_blocks; ++b) {
      __syncwarp();
#pragma unroll
      for (uint32_t i = 0; i < 4; ++i) {
        stage[b3::coop_slot(b3::coop_job(lane, i), b3::coop_unit(lane, i))] = pre[i];
      }
      __syncwarp();
      uint32_t m[16];
#pragma unroll
      for (uint32_t q = 0; q < 4; ++q) {
        const uint4 x = stage[b3::coop_slot(lane, q)];
        m[4 * q + 0] = x.x;
        m[4 * q + 1] = x.y;
        m[4 * q + 2] = x.z;
        m[4 * q + 3] = x.w;
      }
      if (b + 1 < warp_blocks) {
        // Next block's loads are in flight while this one is compressed.
#pragma unroll
        for (uint32_t i = 0; i < 4; ++i) {
          const int64_t off = static_cast<int64_t>(b + 1) * b3::BLOCK_LEN + 16 * b3::coop_unit(lane, i);
          pre[i] = load16(jptr[i] + off, jlen[i] - off);
        }
      }
      if (b < nblocks) compress_chunk_block(cv, m, chunk, b, nblocks, clen, root_flag);
    }
  } else {
    for (uint32_t b = 0; b < nblocks; ++b) {
      uint32_t m[16];
      const int64_t off = static_cast<int64_t>(b) * b3::BLOCK_LEN;
      load_block_direct<V>(cptr + off, static_cast<int64_t>(clen) - off, m);
      compress_chunk_block(cv, m, chunk, b, nblocks, clen, root_flag);
    }
  }

  uint32_t* out_node = p.out + (row * p.tiles_per_row + tir) * 8u;
  if (p.tile_log2 == 0) {
    if (active) store_node(out_node, cv);
    return;
  }
  uint32_t* nodes = reinterpret_cast<uint32_t*>(smem);
  __syncthreads();  // every warp is done with its staging area
  store_node(nodes + tid * 8u, cv);
  __syncthreads();
  uint64_t m0 = 0;
  if (row_valid) {
    const uint64_t first = tir << p.tile_log2;
    const uint64_t left = p.chunks_per_row - first;
    m0 = left < (1ull << p.tile_log2) ? left : (1ull << p.tile_log2);
  }
  tile_reduce_store(nodes, p.tile_log2, m0, p.final_pass != 0, out_node);
}

__global__ void __launch_bounds__(kThreads) reduce_kernel(ReduceParams p) {
  __shared__ __align__(16) uint32_t nodes[kThreads * 8];
  const uint32_t tid = threadIdx.x;
  const Slot at = slot_of(p.tile_log2, p.tiles_per_row);
  const uint64_t row = at.row, tir = at.tir, idx = at.index;
  const bool row_valid = row < p.rows;
  if (row_valid && idx < p.count) {
    const uint4* s = reinterpret_cast<const uint4*>(p.in + (row * p.count + idx) * 8u);
    uint4* d = reinterpret_cast<uint4*>(nodes + tid * 8u);
    d[0] = __ldg(s);
    d[1] = __ldg(s + 1);
  }
  __syncthreads();
  uint64_t m0 = 0;
  if (row_valid) {
    const uint64_t left = p.count - (tir << p.tile_log2);
    m0 = left < (1ull << p.tile_log2) ? left : (1ull << p.tile_log2);
  }
  tile_reduce_store(nodes, p.tile_log2, m0, p.final_pass != 0,
                    p.out + (row * p.tiles_per_row + tir) * 8u);
}

// Scratch layout: pass outputs alternate between area A (leaf, 2nd reduce,
// ...) and area B (1st reduce, 3rd reduce, ...); the last pass writes to the
// caller's output instead. Sizes in 32-byte nodes.
inline void plan_scratch(uint64_t rows, uint64_t row_bytes, uint32_t max_tile_log2,
                         uint64_t* a_nodes, uint64_t* b_nodes) {
  *a_nodes = 0;
  *b_nodes = 0;
  const uint64_t cpr = b3::chunk_count(row_bytes);
  uint64_t count = b3::ceil_div_pow2(cpr, b3::leaf_tile_log2(cpr, max_tile_log2));
  bool to_a = true;
  while (count > 1) {
    uint64_t* area = to_a ? a_nodes : b_nodes;
    if (rows * count > *area) *area = rows * count;
    to_a = !to_a;
    count = b3::ceil_div_pow2(count, b3::reduce_tile_log2(count, max_tile_log2));
  }
}

inline bool grid_for(uint64_t rows, uint64_t tiles_per_row, uint32_t tile_log2, unsigned* blocks) {
  const uint64_t slots = rows * (tiles_per_row << tile_log2);
  const uint64_t n = (slots + kThreads - 1) / kThreads;
  if (n == 0 || n > 0x7fffffffull) return false;
  *blocks = static_cast<unsigned>(n);
  return true;
}

// Sequences the passes for a row batch. `Launcher` provides
//   template <int V> int leaf(unsigned blocks, const LeafParams&);
//   int reduce(unsigned blocks, const ReduceParams&);
// returning 0 or an error code; the CUDA build enqueues kernels on a stream,
// the emulation runs them on host threads. max_tile_log2 (at most 8) caps
// the tile size; the CUDA build always uses 8.
template <class Launcher>
int run_rows(Launcher& launcher, const void* data, uint64_t rows, uint64_t row_bytes,
             void* scratch, uint64_t scratch_bytes, void* out_dev, uint32_t max_tile_log2 = 8) {
  if (rows == 0) return 0;
  if ((data == nullptr && row_bytes != 0) || out_dev == nullptr) return SMZ_B3_EINVAL;
  if ((reinterpret_cast<uintptr_t>(out_dev) & 15u) != 0) return SMZ_B3_EINVAL;
  if (max_tile_log2 > 8) return SMZ_B3_EINVAL;
  uint64_t a_nodes = 0, b_nodes = 0;
  plan_scratch(rows, row_bytes, max_tile_log2, &a_nodes, &b_nodes);
  if ((a_nodes + b_nodes) * 32u > scratch_bytes) return SMZ_B3_ESCRATCH;
  if (a_nodes + b_nodes > 0 &&
      (scratch == nullptr || (reinterpret_cast<uintptr_t>(scratch) & 15u) != 0)) {
    return SMZ_B3_EINVAL;
  }
  uint32_t* area_a = static_cast<uint32_t*>(scratch);
  uint32_t* area_b = area_a + a_nodes * 8u;
  uint32_t* out = static_cast<uint32_t*>(out_dev);

  const uint64_t cpr = b3::chunk_count(row_bytes);
  LeafParams lp;
  lp.data = static_cast<const uint8_t*>(data);
  lp.rows = rows;
  lp.row_bytes = row_bytes;
  lp.chunks_per_row = cpr;
  lp.tile_log2 = b3::leaf_tile_log2(cpr, max_tile_log2);
  lp.tiles_per_row = b3::ceil_div_pow2(cpr, lp.tile_log2);
  lp.final_pass = lp.tiles_per_row == 1 ? 1u : 0u;
  lp.out = lp.final_pass ? out : area_a;
  unsigned blocks = 0;
  if (!grid_for(rows, lp.tiles_per_row, lp.tile_log2, &blocks)) return SMZ_B3_ETOOBIG;
  // Every chunk of every row starts at data + row * row_bytes + chunk * 1024.
  const uintptr_t addr = reinterpret_cast<uintptr_t>(data) | (rows > 1 ? row_bytes : 0);
  int rc;
  if ((addr & 15u) == 0) {
    rc = launcher.template leaf<16>(blocks, lp);
  } else if ((addr & 7u) == 0) {
    rc = launcher.template leaf<8>(blocks, lp);
  } else if ((addr & 3u) == 0) {
    rc = launcher.template leaf<4>(blocks, lp);
  } else {
    rc = launcher.template leaf<1>(blocks, lp);
  }
  if (rc != 0) return rc;

  uint64_t count = lp.tiles_per_row;
  uint32_t* cur = area_a;
  uint32_t* other = area_b;
  bool final_pass = lp.final_pass != 0;
  while (!final_pass) {
    ReduceParams rp;
    rp.in = cur;
    rp.rows = rows;
    rp.count = count;
    rp.tile_log2 = b3::reduce_tile_log2(count, max_tile_log2);
    rp.tiles_per_row = b3::ceil_div_pow2(count, rp.tile_log2);
    final_pass = rp.tiles_per_row == 1;
    rp.final_pass = final_pass ? 1u : 0u;
    rp.out = final_pass ? out : other;
    if (!grid_for(rows, rp.tiles_per_row, rp.tile_log2, &blocks)) return SMZ_B3_ETOOBIG;
    rc = launcher.reduce(blocks, rp);
    if (rc != 0) return rc;
    other = cur;  // the area just read becomes the next output area
    cur = rp.out;
    count = rp.tiles_per_row;
  }
  return 0;
}

inline uint64_t scratch_bytes(uint64_t rows, uint64_t row_bytes, uint32_t max_tile_log2 = 8) {
  uint64_t a = 0, b = 0;
  plan_scratch(rows, row_bytes, max_tile_log2, &a, &b);
  return (a + b) * 32u;
}

}  // namespace blake3_kernels
}  // namespace smz

#endif  // SMZ_BLAKE3_KERNELS_CUH
