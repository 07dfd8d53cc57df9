// BLAKE3 over many rows of one length at once, one chunk (or one parent node)
// per SIMD lane. Host only: GCC/Clang vector extensions, so the same code
// compiles to AVX-512 (16 lanes) or AVX2 (8 lanes), selected at run time, or to
// the baseline vector unit (4 lanes: SSE2 on x86-64, NEON on arm64).
//
// The rows of a batch all have the same tree shape, so they are hashed level
// by level, as blake3_tree.h describes: every full chunk of a group of rows is
// one job of the leaf level, every pair of nodes one job of a parent level,
// and the jobs of a level are packed W to a vector regardless of which row
// they belong to (a 12-chunk row alone would leave a third of two 8-lane
// passes idle). A row's partial last chunk, and rows of one chunk or less,
// take the scalar code of blake3_tree.h.

#ifndef SMZ_BLAKE3_LANES_H
#define SMZ_BLAKE3_LANES_H

#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "blake3_tree.h"

#define SMZ_LANES_INLINE inline __attribute__((always_inline))

// Every function here is inlined into a caller compiled for its vector width,
// so no vector crosses a function boundary and the ABI note GCC gives for
// 32-byte vectors in functions built without AVX does not apply.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace smz {
namespace blake3 {
namespace lanes {

// Byte and word shuffles need __builtin_shufflevector (GCC 12, Clang); without
// it (or with SMZ_LANES_NO_SHUFFLE, which tests use to build this path) the
// message words are gathered one by one and rotations are shifts.
#if defined(__has_builtin) && !defined(SMZ_LANES_NO_SHUFFLE)
#if __has_builtin(__builtin_shufflevector)
#define SMZ_LANES_SHUFFLE 1
#endif
#endif

typedef uint32_t u32x4 __attribute__((vector_size(16)));
typedef uint32_t u32x8 __attribute__((vector_size(32)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));

// Message word order of each of the seven rounds.
constexpr uint8_t SCHEDULE[7][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8},
    {3, 4, 10, 12, 13, 2, 7, 14, 6, 5, 9, 0, 11, 15, 8, 1},
    {10, 7, 12, 9, 14, 3, 13, 15, 4, 0, 11, 2, 5, 8, 1, 6},
    {12, 13, 9, 11, 15, 10, 14, 8, 7, 2, 5, 3, 0, 1, 6, 4},
    {9, 14, 11, 5, 8, 12, 15, 1, 13, 3, 0, 10, 2, 6, 4, 7},
    {11, 15, 5, 0, 1, 9, 8, 6, 14, 10, 2, 12, 3, 4, 7, 13},
};

constexpr uint32_t IV[8] = {0x6A09E667u, 0xBB67AE85u, 0x3C6EF372u, 0xA54FF53Au,
                            0x510E527Fu, 0x9B05688Cu, 0x1F83D9ABu, 0x5BE0CD19u};

template <class V>
SMZ_LANES_INLINE V splat(uint32_t x) {
  return V{} + x;
}

template <class V>
SMZ_LANES_INLINE V rot(V x, int c) {
  return (x >> c) | (x << (32 - c));
}

// Rotations by whole bytes move bytes within each word: one byte shuffle where
// the vector unit has one (SSSE3 and AVX2 on x86-64, NEON), else two shifts.
// AVX-512 rotates a word by any count in one instruction: 16 lanes always shift.
template <class V>
SMZ_LANES_INLINE V rot16(V x) {
  return rot(x, 16);
}
template <class V>
SMZ_LANES_INLINE V rot8(V x) {
  return rot(x, 8);
}

#if defined(SMZ_LANES_SHUFFLE)
typedef uint8_t u8x16 __attribute__((vector_size(16)));
typedef uint8_t u8x32 __attribute__((vector_size(32)));

// SSE2 alone (the x86-64 baseline) has no byte shuffle: a byte shuffle there is
// taken apart byte by byte, five times slower than hashing one row at a time.
#if !defined(__x86_64__) || defined(__SSSE3__)
SMZ_LANES_INLINE u32x4 rot16(u32x4 x) {
  const u8x16 b = (u8x16)x;
  const u8x16 r = __builtin_shufflevector(b, b, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
  return (u32x4)r;
}
SMZ_LANES_INLINE u32x4 rot8(u32x4 x) {
  const u8x16 b = (u8x16)x;
  const u8x16 r = __builtin_shufflevector(b, b, 1, 2, 3, 0, 5, 6, 7, 4, 9, 10, 11, 8, 13, 14, 15, 12);
  return (u32x4)r;
}
#endif
SMZ_LANES_INLINE u32x8 rot16(u32x8 x) {
  const u8x32 b = (u8x32)x;
  const u8x32 r = __builtin_shufflevector(b, b, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12,
                                          13, 18, 19, 16, 17, 22, 23, 20, 21, 26, 27, 24, 25, 30,
                                          31, 28, 29);
  return (u32x8)r;
}
SMZ_LANES_INLINE u32x8 rot8(u32x8 x) {
  const u8x32 b = (u8x32)x;
  const u8x32 r = __builtin_shufflevector(b, b, 1, 2, 3, 0, 5, 6, 7, 4, 9, 10, 11, 8, 13, 14, 15,
                                          12, 17, 18, 19, 16, 21, 22, 23, 20, 25, 26, 27, 24, 29,
                                          30, 31, 28);
  return (u32x8)r;
}
#endif

template <class V>
SMZ_LANES_INLINE void g(V& a, V& b, V& c, V& d, const V& x, const V& y) {
  a = a + b + x;
  d = rot16(d ^ a);
  c = c + d;
  b = rot(b ^ c, 12);
  a = a + b + y;
  d = rot8(d ^ a);
  c = c + d;
  b = rot(b ^ c, 7);
}

// The compression function on every lane at once, truncated to the 8 output
// words; `cv` is replaced by the output.
template <class V>
SMZ_LANES_INLINE void compress(V cv[8], const V m[16], const V& counter_lo,
                               const V& counter_hi, uint32_t block_len, const V& flags) {
  V v[16] = {cv[0],          cv[1],          cv[2],          cv[3],
             cv[4],          cv[5],          cv[6],          cv[7],
             splat<V>(IV[0]), splat<V>(IV[1]), splat<V>(IV[2]), splat<V>(IV[3]),
             counter_lo,     counter_hi,     splat<V>(block_len), flags};
  // Rounds and blocks stay loops: unrolled, they built ten times slower (13 s, not
  // 5) and ran no faster, the 32 live vectors spilling either way.
#pragma GCC unroll 1
  for (int r = 0; r < 7; ++r) {
    const uint8_t* s = SCHEDULE[r];
    g(v[0], v[4], v[8], v[12], m[s[0]], m[s[1]]);
    g(v[1], v[5], v[9], v[13], m[s[2]], m[s[3]]);
    g(v[2], v[6], v[10], v[14], m[s[4]], m[s[5]]);
    g(v[3], v[7], v[11], v[15], m[s[6]], m[s[7]]);
    g(v[0], v[5], v[10], v[15], m[s[8]], m[s[9]]);
    g(v[1], v[6], v[11], v[12], m[s[10]], m[s[11]]);
    g(v[2], v[7], v[8], v[13], m[s[12]], m[s[13]]);
    g(v[3], v[4], v[9], v[14], m[s[14]], m[s[15]]);
  }
  for (int i = 0; i < 8; ++i) cv[i] = v[i] ^ v[i + 8];
}

#if defined(SMZ_LANES_SHUFFLE)
template <class V>
SMZ_LANES_INLINE V load_vector(const uint8_t* p) {
  V v;
  memcpy(&v, p, sizeof(V));
  return v;
}

// Transposes r[0..3] (lane l's words j..j+3 in r[l]) into m[0..3] (word j+i of
// every lane in m[i]).
SMZ_LANES_INLINE void transpose(const u32x4 r[4], u32x4 m[4]) {
  const u32x4 t0 = __builtin_shufflevector(r[0], r[1], 0, 4, 1, 5);
  const u32x4 t1 = __builtin_shufflevector(r[0], r[1], 2, 6, 3, 7);
  const u32x4 t2 = __builtin_shufflevector(r[2], r[3], 0, 4, 1, 5);
  const u32x4 t3 = __builtin_shufflevector(r[2], r[3], 2, 6, 3, 7);
  m[0] = __builtin_shufflevector(t0, t2, 0, 1, 4, 5);
  m[1] = __builtin_shufflevector(t0, t2, 2, 3, 6, 7);
  m[2] = __builtin_shufflevector(t1, t3, 0, 1, 4, 5);
  m[3] = __builtin_shufflevector(t1, t3, 2, 3, 6, 7);
}

// The same for 8 lanes of 8 words, in the three steps AVX2 has instructions
// for: interleave words, then word pairs (both within each 128-bit half), then
// swap halves.
SMZ_LANES_INLINE void transpose(const u32x8 r[8], u32x8 m[8]) {
  u32x8 t[8], u[8];
  for (int k = 0; k < 4; ++k) {
    t[2 * k] = __builtin_shufflevector(r[2 * k], r[2 * k + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[2 * k + 1] = __builtin_shufflevector(r[2 * k], r[2 * k + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int k = 0; k < 2; ++k) {
    const u32x8 a = t[4 * k], b = t[4 * k + 1], c = t[4 * k + 2], d = t[4 * k + 3];
    u[4 * k + 0] = __builtin_shufflevector(a, c, 0, 1, 8, 9, 4, 5, 12, 13);
    u[4 * k + 1] = __builtin_shufflevector(a, c, 2, 3, 10, 11, 6, 7, 14, 15);
    u[4 * k + 2] = __builtin_shufflevector(b, d, 0, 1, 8, 9, 4, 5, 12, 13);
    u[4 * k + 3] = __builtin_shufflevector(b, d, 2, 3, 10, 11, 6, 7, 14, 15);
  }
  for (int i = 0; i < 4; ++i) {
    m[i] = __builtin_shufflevector(u[i], u[i + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    m[i + 4] = __builtin_shufflevector(u[i], u[i + 4], 4, 5, 6, 7, 12, 13, 14, 15);
  }
}

// The same for 16 lanes of 16 words, in four steps: step d swaps, in every
// 2d x 2d block, the d x d block above the diagonal with the one below it. Rows
// i and i + d (i without bit d) trade words: row i's columns with bit d set
// for row i + d's columns without it. One two-vector permute per row and step.
#define SMZ_WORDS(...) __VA_ARGS__
#define SMZ_SWAP(d, low, high)                                 \
  for (int i = 0; i < 16; ++i) {                               \
    if (i & d) continue;                                       \
    const u32x16 a = r[i], b = r[i + d];                       \
    r[i] = __builtin_shufflevector(a, b, SMZ_WORDS low);       \
    r[i + d] = __builtin_shufflevector(a, b, SMZ_WORDS high);  \
  }
SMZ_LANES_INLINE void transpose(const u32x16 in[16], u32x16 m[16]) {
  u32x16 r[16];
  for (int i = 0; i < 16; ++i) r[i] = in[i];
  SMZ_SWAP(1, (0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30),
           (1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31))
  SMZ_SWAP(2, (0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29),
           (2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31))
  SMZ_SWAP(4, (0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27),
           (4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31))
  SMZ_SWAP(8, (0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23),
           (8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31))
  for (int i = 0; i < 16; ++i) m[i] = r[i];
}
#undef SMZ_SWAP
#undef SMZ_WORDS
#endif

// Word i of lane l's 64-byte block at src[l] + offset, for every i and l
// (little-endian host; the caller checks).
template <class V, int W>
SMZ_LANES_INLINE void load_blocks(const uint8_t* const src[W], uint64_t offset, V m[16]) {
#if defined(SMZ_LANES_SHUFFLE)
  // W lanes of W words each make one square to transpose: 16 / W of them.
  for (int q = 0; q < 16 / W; ++q) {
    V r[W];
    for (int l = 0; l < W; ++l) r[l] = load_vector<V>(src[l] + offset + 4 * W * q);
    transpose(r, m + W * q);
  }
#else
  for (int i = 0; i < 16; ++i) {
    for (int l = 0; l < W; ++l) {
      uint32_t w;
      memcpy(&w, src[l] + offset + 4 * i, 4);
      m[i][l] = w;
    }
  }
#endif
}

template <class V, int W>
SMZ_LANES_INLINE void store_lanes(const V cv[8], uint32_t* const dst[W]) {
  for (int l = 0; l < W; ++l) {
    for (int i = 0; i < 8; ++i) dst[l][i] = cv[i][l];
  }
}

// Chaining values of W full, non-root chunks: lane l hashes the 1 KiB at
// src[l] as chunk number counter[l].
template <class V, int W>
SMZ_LANES_INLINE void chunks(const uint8_t* const src[W], const uint64_t counter[W],
                             uint32_t* const dst[W]) {
  V cv[8];
  for (int i = 0; i < 8; ++i) cv[i] = splat<V>(IV[i]);
  V lo = {}, hi = {};
  for (int l = 0; l < W; ++l) {
    lo[l] = static_cast<uint32_t>(counter[l]);
    hi[l] = static_cast<uint32_t>(counter[l] >> 32);
  }
  const uint32_t last = CHUNK_LEN / BLOCK_LEN - 1;
#pragma GCC unroll 1
  for (uint32_t b = 0; b <= last; ++b) {
    // The next vector's lanes usually read the chunks W further on (the rows
    // are back to back): ask for its block now, so that it is in cache then.
    for (int l = 0; l < W; ++l) __builtin_prefetch(src[l] + W * CHUNK_LEN + b * BLOCK_LEN);
    V m[16];
    load_blocks<V, W>(src, uint64_t{b} * BLOCK_LEN, m);
    const uint32_t flags = (b == 0 ? CHUNK_START : 0u) | (b == last ? CHUNK_END : 0u);
    compress(cv, m, lo, hi, BLOCK_LEN, splat<V>(flags));
  }
  store_lanes<V, W>(cv, dst);
}

// W parent nodes: lane l's message is the 64 bytes at src[l] (two adjacent
// chaining values of one level).
template <class V, int W>
SMZ_LANES_INLINE void parents(const uint8_t* const src[W], uint32_t flags,
                              uint32_t* const dst[W]) {
  V cv[8];
  for (int i = 0; i < 8; ++i) cv[i] = splat<V>(IV[i]);
  V m[16];
  load_blocks<V, W>(src, 0, m);
  compress(cv, m, V{}, V{}, BLOCK_LEN, splat<V>(flags));
  store_lanes<V, W>(cv, dst);
}

// Rows of this many chunks or fewer are hashed in groups whose chaining
// values (32 bytes per chunk) stay within about 64 KiB.
constexpr uint64_t GROUP_CHUNKS = 2048;

// One digest per row of a rows x row_bytes batch, W lanes at a time.
template <class V, int W>
SMZ_LANES_INLINE void rows(const uint8_t* data, uint64_t rows, uint64_t row_bytes,
                           uint8_t* out) {
  const uint64_t n = chunk_count(row_bytes);
  if (n == 1) {
    for (uint64_t r = 0; r < rows; ++r) hash(data + r * row_bytes, row_bytes, out + 32 * r);
    return;
  }
  const uint64_t full = row_bytes / CHUNK_LEN;  // n - full is 0 or 1
  const uint64_t group = std::max<uint64_t>(1, GROUP_CHUNKS / n);
  std::vector<uint32_t> nodes(std::min(group, rows) * n * 8);
  const uint8_t* src[W];
  uint64_t counter[W];
  uint32_t* dst[W];
  for (uint64_t first = 0; first < rows; first += group) {
    const uint64_t g = std::min(group, rows - first);
    const uint8_t* base = data + first * row_bytes;
    // Leaf level. A short last vector repeats the last job in its spare lanes.
    const uint64_t leaves = g * full;
    for (uint64_t j = 0; j < leaves; j += W) {
      for (int l = 0; l < W; ++l) {
        const uint64_t job = std::min<uint64_t>(j + l, leaves - 1);
        const uint64_t r = job / full, c = job % full;
        src[l] = base + r * row_bytes + c * CHUNK_LEN;
        counter[l] = c;
        dst[l] = &nodes[(r * n + c) * 8];
      }
      chunks<V, W>(src, counter, dst);
    }
    if (full < n) {
      const uint32_t tail = static_cast<uint32_t>(row_bytes - full * CHUNK_LEN);
      for (uint64_t r = 0; r < g; ++r) {
        chunk_cv(base + r * row_bytes + full * CHUNK_LEN, tail, full, 0, &nodes[(r * n + full) * 8]);
      }
    }
    // Parent levels, in place: node k of the next level is written over node
    // k of this one, which no later job reads (they read nodes 2k' >= 2k + 2),
    // and every lane of a vector has loaded its message before any is stored.
    for (uint64_t m = n; m > 1; m = (m + 1) / 2) {
      const uint64_t pairs = m / 2;
      const uint32_t flags = PARENT | (m == 2 ? ROOT : 0u);
      const uint64_t jobs = g * pairs;
      for (uint64_t j = 0; j < jobs; j += W) {
        for (int l = 0; l < W; ++l) {
          const uint64_t job = std::min<uint64_t>(j + l, jobs - 1);
          const uint64_t r = job / pairs, k = job % pairs;
          src[l] = reinterpret_cast<const uint8_t*>(&nodes[(r * n + 2 * k) * 8]);
          dst[l] = &nodes[(r * n + k) * 8];
        }
        parents<V, W>(src, flags, dst);
      }
      if (m % 2 == 1) {
        for (uint64_t r = 0; r < g; ++r) {
          memmove(&nodes[(r * n + pairs) * 8], &nodes[(r * n + m - 1) * 8], 32);
        }
      }
    }
    for (uint64_t r = 0; r < g; ++r) store_words(&nodes[r * n * 8], out + 32 * (first + r));
  }
}

}  // namespace lanes
}  // namespace blake3
}  // namespace smz

#endif  // SMZ_BLAKE3_LANES_H
