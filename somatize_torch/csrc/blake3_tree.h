// BLAKE3 (hash mode only, 32-byte output) as header-only code that compiles
// for the host (g++ -std=c++17) and for the device (nvcc).
//
// Layout of this header:
//   * constants and the compression function;
//   * ChunkState, an incremental chunk hasher, plus chunk_cv() for one-shot chunks;
//   * parent_cv(), the parent-node compression;
//   * hash(), the whole-buffer digest with the reference tree shape;
//   * the level-wise formulation of the same tree (level_node()) and the tiling
//     plan (leaf_tile_log2(), reduce_tile_log2()) that the CUDA kernels use.
//     Both are plain functions so that the host build can run them too.
//
// Tree shape. The spec builds the tree over n chunks by giving the left
// subtree the largest power-of-two number of chunks strictly less than n.
// That tree is the same as merging chaining values pairwise, level by level,
// from the left, carrying an odd last node up unchanged:
//   for a power of two L < n <= 2L, the first L nodes of every level below
//   log2(L) pair up among themselves (L / 2^j is even), so they reduce to the
//   left subtree; the remaining n - L nodes start at an even index on every
//   such level, so they reduce exactly as they would on their own (induction
//   on n), reach a single node within log2(L) levels because n - L <= L, and
//   are carried as the odd last node until the final merge with the left
//   subtree. The final merge (two nodes -> one) is the root.
// The same argument shows that any aligned run of 2^t nodes of one level
// reduces, on its own, to the node the whole-tree reduction has at level t,
// including the last, partial run. That is what lets the kernels reduce
// fixed-size tiles independently and continue from the tile outputs.

#ifndef SMZ_BLAKE3_TREE_H
#define SMZ_BLAKE3_TREE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define SMZ_HD __host__ __device__
#define SMZ_HD_INLINE __host__ __device__ __forceinline__
#else
#define SMZ_HD
#define SMZ_HD_INLINE inline
#endif

namespace smz {
namespace blake3 {

enum : uint32_t {
  CHUNK_START = 1u << 0,
  CHUNK_END = 1u << 1,
  PARENT = 1u << 2,
  ROOT = 1u << 3,
};

enum : uint32_t {
  BLOCK_LEN = 64,
  CHUNK_LEN = 1024,
  OUT_LEN = 32,
  // Upper bound on the chaining-value stack of hash(): one entry per level
  // of a tree over 2^64 bytes.
  MAX_DEPTH = 64,
};

SMZ_HD_INLINE void load_iv(uint32_t cv[8]) {
  cv[0] = 0x6A09E667u;
  cv[1] = 0xBB67AE85u;
  cv[2] = 0x3C6EF372u;
  cv[3] = 0xA54FF53Au;
  cv[4] = 0x510E527Fu;
  cv[5] = 0x9B05688Cu;
  cv[6] = 0x1F83D9ABu;
  cv[7] = 0x5BE0CD19u;
}

SMZ_HD_INLINE uint32_t rotr32(uint32_t w, uint32_t c) {
#if defined(__CUDA_ARCH__)
  return __funnelshift_r(w, w, c);
#else
  return (w >> c) | (w << (32u - c));
#endif
}

#define SMZ_B3_G(a, b, c, d, x, y) \
  do {                             \
    a = a + b + (x);               \
    d = rotr32(d ^ a, 16);         \
    c = c + d;                     \
    b = rotr32(b ^ c, 12);         \
    a = a + b + (y);               \
    d = rotr32(d ^ a, 8);          \
    c = c + d;                     \
    b = rotr32(b ^ c, 7);          \
  } while (0)

// One round with the message words already permuted by the schedule.
#define SMZ_B3_ROUND(s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15) \
  do {                                                                                    \
    SMZ_B3_G(v0, v4, v8, v12, m[s0], m[s1]);                                              \
    SMZ_B3_G(v1, v5, v9, v13, m[s2], m[s3]);                                              \
    SMZ_B3_G(v2, v6, v10, v14, m[s4], m[s5]);                                             \
    SMZ_B3_G(v3, v7, v11, v15, m[s6], m[s7]);                                             \
    SMZ_B3_G(v0, v5, v10, v15, m[s8], m[s9]);                                             \
    SMZ_B3_G(v1, v6, v11, v12, m[s10], m[s11]);                                           \
    SMZ_B3_G(v2, v7, v8, v13, m[s12], m[s13]);                                            \
    SMZ_B3_G(v3, v4, v9, v14, m[s14], m[s15]);                                            \
  } while (0)

// The compression function, truncated to the 8 words a chaining value (or a
// 32-byte root output) needs. `out` may alias `cv`.
SMZ_HD_INLINE void compress(const uint32_t cv[8], const uint32_t m[16], uint64_t counter,
                            uint32_t block_len, uint32_t flags, uint32_t out[8]) {
  uint32_t v0 = cv[0], v1 = cv[1], v2 = cv[2], v3 = cv[3];
  uint32_t v4 = cv[4], v5 = cv[5], v6 = cv[6], v7 = cv[7];
  uint32_t v8 = 0x6A09E667u, v9 = 0xBB67AE85u, v10 = 0x3C6EF372u, v11 = 0xA54FF53Au;
  uint32_t v12 = (uint32_t)counter, v13 = (uint32_t)(counter >> 32), v14 = block_len, v15 = flags;
  SMZ_B3_ROUND(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  SMZ_B3_ROUND(2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8);
  SMZ_B3_ROUND(3, 4, 10, 12, 13, 2, 7, 14, 6, 5, 9, 0, 11, 15, 8, 1);
  SMZ_B3_ROUND(10, 7, 12, 9, 14, 3, 13, 15, 4, 0, 11, 2, 5, 8, 1, 6);
  SMZ_B3_ROUND(12, 13, 9, 11, 15, 10, 14, 8, 7, 2, 5, 3, 0, 1, 6, 4);
  SMZ_B3_ROUND(9, 14, 11, 5, 8, 12, 15, 1, 13, 3, 0, 10, 2, 6, 4, 7);
  SMZ_B3_ROUND(11, 15, 5, 0, 1, 9, 8, 6, 14, 10, 2, 12, 3, 4, 7, 13);
  out[0] = v0 ^ v8;
  out[1] = v1 ^ v9;
  out[2] = v2 ^ v10;
  out[3] = v3 ^ v11;
  out[4] = v4 ^ v12;
  out[5] = v5 ^ v13;
  out[6] = v6 ^ v14;
  out[7] = v7 ^ v15;
}

#undef SMZ_B3_ROUND
#undef SMZ_B3_G

// Little-endian words from up to 64 bytes, zero-padded.
SMZ_HD_INLINE void load_block_bytes(const uint8_t* p, uint32_t n, uint32_t m[16]) {
#if !defined(__CUDA_ARCH__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  if (n == BLOCK_LEN) {
    memcpy(m, p, BLOCK_LEN);
    return;
  }
#endif
  for (int i = 0; i < 16; ++i) m[i] = 0;
  for (uint32_t i = 0; i < n; ++i) m[i >> 2] |= (uint32_t)p[i] << (8u * (i & 3u));
}

SMZ_HD_INLINE void store_words(const uint32_t w[8], uint8_t out[32]) {
  for (int i = 0; i < 8; ++i) {
    out[4 * i + 0] = (uint8_t)(w[i]);
    out[4 * i + 1] = (uint8_t)(w[i] >> 8);
    out[4 * i + 2] = (uint8_t)(w[i] >> 16);
    out[4 * i + 3] = (uint8_t)(w[i] >> 24);
  }
}

// Number of chunks of an input of `len` bytes; the empty input is one chunk.
SMZ_HD_INLINE uint64_t chunk_count(uint64_t len) {
  return len == 0 ? 1 : (len + CHUNK_LEN - 1) / CHUNK_LEN;
}

// Parent node: message = left CV || right CV, key = IV, counter 0.
// extra_flags is 0 or ROOT.
SMZ_HD_INLINE void parent_cv(const uint32_t left[8], const uint32_t right[8],
                             uint32_t extra_flags, uint32_t out[8]) {
  uint32_t m[16];
  for (int i = 0; i < 8; ++i) {
    m[i] = left[i];
    m[8 + i] = right[i];
  }
  uint32_t key[8];
  load_iv(key);
  compress(key, m, 0, BLOCK_LEN, PARENT | extra_flags, out);
}

// Incremental hasher for one chunk (at most CHUNK_LEN bytes).
struct ChunkState {
  uint32_t cv[8];
  uint64_t counter;
  uint8_t block[BLOCK_LEN];
  uint32_t block_len;
  uint32_t blocks_compressed;

  SMZ_HD_INLINE void init(uint64_t chunk_counter) {
    load_iv(cv);
    counter = chunk_counter;
    for (uint32_t i = 0; i < BLOCK_LEN; ++i) block[i] = 0;
    block_len = 0;
    blocks_compressed = 0;
  }

  SMZ_HD_INLINE uint32_t len() const { return BLOCK_LEN * blocks_compressed + block_len; }

  SMZ_HD_INLINE uint32_t start_flag() const {
    return blocks_compressed == 0 ? (uint32_t)CHUNK_START : 0u;
  }

  // Feed bytes; the caller keeps the total at or below CHUNK_LEN.
  SMZ_HD_INLINE void update(const uint8_t* p, size_t n) {
    while (n > 0) {
      if (block_len == BLOCK_LEN) {
        // A full block is only compressed once more input arrives: the last
        // block of a chunk needs CHUNK_END.
        uint32_t m[16];
        load_block_bytes(block, BLOCK_LEN, m);
        compress(cv, m, counter, BLOCK_LEN, start_flag(), cv);
        ++blocks_compressed;
        for (uint32_t i = 0; i < BLOCK_LEN; ++i) block[i] = 0;
        block_len = 0;
      }
      uint32_t take = BLOCK_LEN - block_len;
      if (take > n) take = (uint32_t)n;
      for (uint32_t i = 0; i < take; ++i) block[block_len + i] = p[i];
      block_len += take;
      p += take;
      n -= take;
    }
  }

  // Chaining value of the chunk (extra_flags = 0) or, for a single-chunk
  // input, the root output (extra_flags = ROOT).
  SMZ_HD_INLINE void finish(uint32_t extra_flags, uint32_t out[8]) const {
    uint32_t m[16];
    load_block_bytes(block, block_len, m);
    compress(cv, m, counter, block_len, start_flag() | CHUNK_END | extra_flags, out);
  }
};

// One-shot chunk: `n` <= CHUNK_LEN bytes at `p`, chunk index `counter`.
SMZ_HD_INLINE void chunk_cv(const uint8_t* p, uint32_t n, uint64_t counter, uint32_t extra_flags,
                            uint32_t out[8]) {
  uint32_t cv[8];
  load_iv(cv);
  const uint32_t blocks = n == 0 ? 1 : (n + BLOCK_LEN - 1) / BLOCK_LEN;
  for (uint32_t b = 0; b < blocks; ++b) {
    const uint32_t off = b * BLOCK_LEN;
    const uint32_t blen = (b + 1 == blocks) ? n - off : BLOCK_LEN;
    uint32_t m[16];
    load_block_bytes(p + off, blen, m);
    uint32_t flags = 0;
    if (b == 0) flags |= CHUNK_START;
    if (b + 1 == blocks) flags |= CHUNK_END | extra_flags;
    compress(cv, m, counter, blen, flags, cv);
  }
  for (int i = 0; i < 8; ++i) out[i] = cv[i];
}

// Whole-buffer digest with the reference tree shape (chaining-value stack,
// merged eagerly whenever a completed subtree allows it, the last chunk
// merged lazily so that the final parent gets ROOT).
SMZ_HD inline void hash(const uint8_t* data, uint64_t len, uint8_t out[32]) {
  const uint64_t n = chunk_count(len);
  uint32_t stack[MAX_DEPTH][8];
  uint32_t depth = 0;
  uint32_t cv[8];
  for (uint64_t i = 0; i + 1 < n; ++i) {
    chunk_cv(data + i * CHUNK_LEN, CHUNK_LEN, i, 0, cv);
    uint64_t total = i + 1;
    while ((total & 1) == 0) {
      --depth;
      parent_cv(stack[depth], cv, 0, cv);
      total >>= 1;
    }
    for (int w = 0; w < 8; ++w) stack[depth][w] = cv[w];
    ++depth;
  }
  const uint64_t last_off = (n - 1) * CHUNK_LEN;
  const uint32_t last_len = (uint32_t)(len - last_off);
  if (n == 1) {
    chunk_cv(data, last_len, 0, ROOT, cv);
  } else {
    chunk_cv(data + last_off, last_len, n - 1, 0, cv);
    while (depth > 1) {
      --depth;
      parent_cv(stack[depth], cv, 0, cv);
    }
    parent_cv(stack[0], cv, ROOT, cv);
  }
  store_words(cv, out);
}

// ---------------------------------------------------------------------------
// Level-wise formulation (what the kernels run).
//
// `nodes` holds the m >= 1 nodes of one level, 8 words each, `stride` words
// apart. Node k of the next level (k < ceil(m / 2)) is the parent of nodes
// 2k and 2k + 1, or node 2k carried up when it is the odd last one. With
// `root_level` set and m == 2 the single merge is the root.
SMZ_HD_INLINE void level_node(const uint32_t* nodes, uint32_t stride, uint64_t m, uint64_t k,
                              bool root_level, uint32_t out[8]) {
  const uint32_t* left = nodes + (2 * k) * stride;
  if (2 * k + 1 < m) {
    parent_cv(left, left + stride, (root_level && m == 2) ? ROOT : 0u, out);
  } else {
    for (int i = 0; i < 8; ++i) out[i] = left[i];
  }
}

// Tiling plan shared by the kernels and the host emulation of them. Tiles
// hold at most 2^max_log2 nodes (8: 256, one per thread of a block; the
// emulation also runs smaller maxima to exercise many passes on small inputs).
//
// Leaf pass: each row's chunks are cut into aligned tiles of 2^t chunks; a
// tile reduces, level-wise, to one node. The tile size is the largest power
// of two up to the maximum that leaves at most 1/8 of the tile slots of a row
// idle (t = 0, one node per chunk, never wastes any).
SMZ_HD_INLINE uint32_t leaf_tile_log2(uint64_t chunks_per_row, uint32_t max_log2 = 8) {
  if (chunks_per_row <= 1) return 0;
  for (uint32_t t = max_log2; t > 0; --t) {
    const uint64_t tile = 1ull << t;
    const uint64_t tiles = (chunks_per_row + tile - 1) / tile;
    const uint64_t slots = tiles * tile;
    if ((slots - chunks_per_row) * 8 <= slots) return t;
  }
  return 0;
}

// Reduce passes: tiles of up to 2^max_log2 nodes (at least 2), just large
// enough for rows that fit in one tile.
SMZ_HD_INLINE uint32_t reduce_tile_log2(uint64_t nodes_per_row, uint32_t max_log2 = 8) {
  if (max_log2 < 1) max_log2 = 1;
  uint32_t t = 0;
  while (t < max_log2 && (1ull << t) < nodes_per_row) ++t;
  return t;
}

SMZ_HD_INLINE uint64_t ceil_div_pow2(uint64_t n, uint32_t log2) {
  return (n + (1ull << log2) - 1) >> log2;
}

// Warp-cooperative load layout (kernels over 16-byte aligned rows).
//
// For each 64-byte block step a warp stages the current block of its 32
// chunks in shared memory: 128 units of 16 bytes. In load instruction i
// (0..3) lane `lane` fetches unit coop_unit(lane, i) of job coop_job(lane, i)
// from global memory, so four neighbouring lanes read one contiguous 64-byte
// run, and stores it at coop_slot(job, unit). Lane j then reads its own block
// from coop_slot(j, 0..3). The XOR swizzle keeps both the stores and the
// loads free of shared-memory bank conflicts (each quarter-warp touches 8
// distinct 16-byte bank groups); the host self-test checks this.
SMZ_HD_INLINE uint32_t coop_job(uint32_t lane, uint32_t i) { return (i * 32u + lane) >> 2; }
SMZ_HD_INLINE uint32_t coop_unit(uint32_t lane, uint32_t i) { return (i * 32u + lane) & 3u; }
SMZ_HD_INLINE uint32_t coop_slot(uint32_t job, uint32_t unit) {
  return job * 4u + (unit ^ ((job >> 1) & 3u));
}

}  // namespace blake3
}  // namespace smz

#endif  // SMZ_BLAKE3_TREE_H
