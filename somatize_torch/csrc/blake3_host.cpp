// Host build of the BLAKE3 tree code: a small C ABI loaded through ctypes.
//
//   smz_blake3_host                  digest of one buffer (reference tree shape)
//   smz_blake3_host_rows             one digest per row of a rows x row_bytes batch,
//                                    on SIMD lanes (blake3_lanes.h)
//   smz_blake3_host_lane_width       how many lanes smz_blake3_host_rows uses here
//   smz_blake3_host_rows_begin       smz_blake3_host_rows on the process's worker thread
//   smz_blake3_host_rows_wait        ... finished, helping, or given up (once per begin)
//   smz_blake3_host_rows_forked      forgets the worker, in a forked child
//
// and, for tests of the code the CUDA kernels share:
//
//   smz_blake3_host_rows_width       the same on a given number of lanes (1: scalar)
//   smz_blake3_host_levelwise        level-wise pairwise reduction of all chunk CVs
//   smz_blake3_host_streaming        ChunkState fed in pieces of a given size
//   smz_blake3_host_emulate_rows     the kernels' tiling plan, run sequentially
//   smz_blake3_host_coop_selftest    checks the warp-cooperative load layout
//
// Build: g++ -O3 -std=c++17 -shared -fPIC -pthread blake3_host.cpp -o libsmz_blake3.so

#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "blake3_lanes.h"
#include "blake3_tree.h"

namespace b3 = smz::blake3;

namespace {

// Sequential equivalent of one kernel tile: m0 nodes (8 words each) reduced
// over `levels` levels, level by level, exactly as the threads of a tile do it
// (every new node of a level computed from the old level, then written back).
void reduce_tile(std::vector<uint32_t>& nodes, uint64_t m0, uint32_t levels, bool final_pass,
                 uint32_t out[8]) {
  std::vector<uint32_t> next(nodes.size());
  uint64_t m = m0;
  for (uint32_t lvl = 0; lvl < levels; ++lvl) {
    const uint64_t produced = (m + 1) / 2;
    for (uint64_t k = 0; k < produced; ++k) {
      b3::level_node(nodes.data(), 8, m, k, final_pass, &next[k * 8]);
    }
    std::copy(next.begin(), next.begin() + static_cast<std::ptrdiff_t>(produced * 8),
              nodes.begin());
    m = produced;
  }
  memcpy(out, nodes.data(), 32);
}

void rows_scalar(const uint8_t* data, uint64_t rows, uint64_t row_bytes, uint8_t* out) {
  for (uint64_t r = 0; r < rows; ++r) b3::hash(data + r * row_bytes, row_bytes, out + 32 * r);
}

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define SMZ_LANES 1

void rows_x4(const uint8_t* data, uint64_t rows, uint64_t row_bytes, uint8_t* out) {
  b3::lanes::rows<b3::lanes::u32x4, 4>(data, rows, row_bytes, out);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SMZ_LANES_AVX2 1
__attribute__((target("avx2"))) void rows_x8(const uint8_t* data, uint64_t rows,
                                             uint64_t row_bytes, uint8_t* out) {
  b3::lanes::rows<b3::lanes::u32x8, 8>(data, rows, row_bytes, out);
}
#define SMZ_LANES_AVX512 1
__attribute__((target("avx512f"))) void rows_x16(const uint8_t* data, uint64_t rows,
                                                 uint64_t row_bytes, uint8_t* out) {
  b3::lanes::rows<b3::lanes::u32x16, 16>(data, rows, row_bytes, out);
}
#endif
#endif

int lane_width() {
#if defined(SMZ_LANES_AVX512)
  if (__builtin_cpu_supports("avx512f")) return 16;
#endif
#if defined(SMZ_LANES_AVX2)
  if (__builtin_cpu_supports("avx2")) return 8;
#endif
#if defined(SMZ_LANES)
  return 4;
#else
  return 1;
#endif
}

// A digest as a key's text, "blake3:" and its 64 hex digits, written at `out` (71 bytes).
void named(const uint8_t digest[32], char* out) {
  static const char HEX[] = "0123456789abcdef";
  memcpy(out, "blake3:", 7);
  for (int k = 0; k < 32; ++k) {
    out[7 + 2 * k] = HEX[digest[k] >> 4];
    out[8 + 2 * k] = HEX[digest[k] & 15];
  }
}

}  // namespace

extern "C" void smz_blake3_host_rows(const uint8_t* data, uint64_t rows, uint64_t row_bytes,
                                     uint8_t* out);

namespace {

struct RowsWorker;

// A batch's rows are handed out in runs of about RUN_BYTES: the worker takes
// runs until none is left, and so does the caller when it comes for the digests
// before they are all written, instead of idling while a worker that got little
// of the CPU finishes alone. The job is freed by the last of the two to let go.
constexpr uint64_t RUN_BYTES = 256 * 1024;

struct RowsJob {
  RowsJob(const uint8_t* data_, uint64_t rows_, uint64_t row_bytes_, uint8_t* out_,
          RowsWorker* worker_)
      : data(data_), rows(rows_), row_bytes(row_bytes_), out(out_), worker(worker_),
        run(std::max<uint64_t>(1, RUN_BYTES / std::max<uint64_t>(1, row_bytes_))),
        left(rows_), done(rows_ == 0) {}

  const uint8_t* data;
  const uint64_t rows;
  const uint64_t row_bytes;
  uint8_t* out;
  RowsWorker* worker;
  const uint64_t run;                // rows per run
  std::atomic<uint64_t> next{0};     // the first row not handed out (may pass `rows`)
  std::atomic<uint64_t> left;        // rows whose digests are not written, nor skipped
  std::atomic<int> holders{2};       // the caller and the worker
  bool done;                         // under worker->lock: `left` reached 0

  // Takes runs until none is left; true if this call accounted for the last row.
  bool take_runs() {
    bool last = false;
    for (;;) {
      const uint64_t lo = next.fetch_add(run);
      if (lo >= rows) return last;
      const uint64_t n = std::min(run, rows - lo);
      smz_blake3_host_rows(data + lo * row_bytes, n, row_bytes, out + 32 * lo);
      last = left.fetch_sub(n) == n;
    }
  }

  // Hands out no more runs; true if no run is left being hashed.
  bool cancel() {
    const uint64_t lo = next.exchange(rows);
    const uint64_t skipped = lo < rows ? rows - lo : 0;
    return skipped > 0 && left.fetch_sub(skipped) == skipped;
  }

  void let_go() {
    if (holders.fetch_sub(1) == 1) delete this;
  }
};

struct RowsWorker {
  std::mutex lock;
  std::condition_variable queued;
  std::condition_variable finished;
  std::deque<RowsJob*> jobs;  // null: stop (a worker that lost the race to be the one)

  void run() {
    std::unique_lock<std::mutex> held(lock);
    for (;;) {
      queued.wait(held, [this] { return !jobs.empty(); });
      RowsJob* job = jobs.front();
      jobs.pop_front();
      if (job == nullptr) return;
      held.unlock();
      const bool last = job->take_runs();
      held.lock();
      if (last) {
        job->done = true;
        finished.notify_all();
      }
      job->let_go();
    }
  }
};

std::atomic<RowsWorker*> rows_worker_slot{nullptr};

// The process's worker, started if there is none. Its thread starts before it is
// published, so a published worker always runs; of two made at once, one stops.
RowsWorker* rows_worker() {
  RowsWorker* current = rows_worker_slot.load(std::memory_order_acquire);
  if (current != nullptr) return current;
  auto* made = new RowsWorker;
  std::thread(&RowsWorker::run, made).detach();
  if (rows_worker_slot.compare_exchange_strong(current, made)) return made;
  {
    std::lock_guard<std::mutex> held(made->lock);
    made->jobs.push_back(nullptr);
  }
  made->queued.notify_one();  // it stops; the few bytes it holds stay
  return current;
}

}  // namespace

extern "C" {

int smz_blake3_host_abi_version(void) { return 5; }

int smz_blake3_host_lane_width(void) { return lane_width(); }

// 0 on success, -1 when this build or CPU has no `width`-lane code.
int smz_blake3_host_rows_width(const uint8_t* data, uint64_t rows, uint64_t row_bytes,
                               uint8_t* out, int width) {
  switch (width) {
    case 1:
      rows_scalar(data, rows, row_bytes, out);
      return 0;
#if defined(SMZ_LANES)
    case 4:
      rows_x4(data, rows, row_bytes, out);
      return 0;
#endif
#if defined(SMZ_LANES_AVX2)
    case 8:
      if (!__builtin_cpu_supports("avx2")) return -1;
      rows_x8(data, rows, row_bytes, out);
      return 0;
#endif
#if defined(SMZ_LANES_AVX512)
    case 16:
      if (!__builtin_cpu_supports("avx512f")) return -1;
      rows_x16(data, rows, row_bytes, out);
      return 0;
#endif
    default:
      return -1;
  }
}

void smz_blake3_host(const uint8_t* data, uint64_t len, uint8_t out[32]) {
  b3::hash(data, len, out);
}

// The key of each of `count` items, as a node keyed by one input names it from the
// input's key: "blake3:" + hex(BLAKE3(outer || "blake3:" + hex(BLAKE3(inner || item)))),
// item i the bytes of `items` from offsets[i] to offsets[i + 1]; 71 characters each,
// one after another in `out`. The per-row cache names a batch's rows with it in one
// call rather than two hashes and two hex strings a row in Python.
void smz_blake3_host_keys(const uint8_t* inner, uint64_t inner_len, const uint8_t* items,
                          const uint64_t* offsets, uint64_t count, const uint8_t* outer,
                          uint64_t outer_len, char* out) {
  std::vector<uint8_t> first(inner, inner + inner_len);
  std::vector<uint8_t> second(outer, outer + outer_len);
  second.resize(outer_len + 71);
  uint8_t digest[32];
  for (uint64_t i = 0; i < count; ++i) {
    first.resize(inner_len);
    first.insert(first.end(), items + offsets[i], items + offsets[i + 1]);
    b3::hash(first.data(), first.size(), digest);
    named(digest, reinterpret_cast<char*>(second.data() + outer_len));
    b3::hash(second.data(), second.size(), digest);
    named(digest, out + 71 * i);
  }
}

// row_bytes may be 0: every row then digests the empty input.
void smz_blake3_host_rows(const uint8_t* data, uint64_t rows, uint64_t row_bytes, uint8_t* out) {
  smz_blake3_host_rows_width(data, rows, row_bytes, out, lane_width());
}

// A batch's rows hashed on a thread that never touches the Python interpreter, so
// it runs beside a training step without taking the GIL from it: one worker per
// process, started on first use, taking jobs in order. The caller keeps `data` and
// `out` alive and calls smz_blake3_host_rows_wait once per job, until which `out`
// is not to be read. Begin returns null when no worker could be started.
void* smz_blake3_host_rows_begin(const uint8_t* data, uint64_t rows, uint64_t row_bytes,
                                 uint8_t* out) {
  try {
    RowsWorker* worker = rows_worker();
    auto* job = new RowsJob(data, rows, row_bytes, out, worker);
    {
      std::lock_guard<std::mutex> held(worker->lock);
      worker->jobs.push_back(job);
    }
    worker->queued.notify_one();
    return job;
  } catch (...) {
    return nullptr;
  }
}

// Returns once no thread reads `data` or writes `out` for this job. With `take_rest`,
// the caller hashes the rows no thread has taken yet, and every digest is then
// written; without it (a job given up), those rows are skipped.
void smz_blake3_host_rows_wait(void* handle, int take_rest) {
  auto* job = static_cast<RowsJob*>(handle);
  const bool last = take_rest ? job->take_runs() : job->cancel();
  if (!last) {
    std::unique_lock<std::mutex> held(job->worker->lock);
    job->worker->finished.wait(held, [job] { return job->done; });
  }
  job->let_go();
}

// In a forked child: the parent's worker thread is not there (and its lock may have
// been held at the fork), so the next job starts a worker of the child's own.
void smz_blake3_host_rows_forked(void) { rows_worker_slot.store(nullptr); }

void smz_blake3_host_levelwise(const uint8_t* data, uint64_t len, uint8_t out[32]) {
  const uint64_t n = b3::chunk_count(len);
  uint32_t cv[8];
  if (n == 1) {
    b3::chunk_cv(data, static_cast<uint32_t>(len), 0, b3::ROOT, cv);
    b3::store_words(cv, out);
    return;
  }
  std::vector<uint32_t> nodes(n * 8);
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t off = i * b3::CHUNK_LEN;
    const uint32_t clen = static_cast<uint32_t>(std::min<uint64_t>(b3::CHUNK_LEN, len - off));
    b3::chunk_cv(data + off, clen, i, 0, &nodes[i * 8]);
  }
  // In place: node k of the next level only reads nodes 2k and 2k + 1 >= k.
  uint64_t m = n;
  while (m > 1) {
    const uint64_t produced = (m + 1) / 2;
    for (uint64_t k = 0; k < produced; ++k) {
      b3::level_node(nodes.data(), 8, m, k, true, cv);
      memcpy(&nodes[k * 8], cv, 32);
    }
    m = produced;
  }
  b3::store_words(&nodes[0], out);
}

// A streaming hasher over ChunkState: the input arrives in pieces of `piece`
// bytes (0 means all at once).
void smz_blake3_host_streaming(const uint8_t* data, uint64_t len, uint64_t piece,
                               uint8_t out[32]) {
  if (piece == 0) piece = len == 0 ? 1 : len;
  uint32_t stack[b3::MAX_DEPTH][8];
  uint32_t depth = 0;
  b3::ChunkState chunk;
  chunk.init(0);
  uint64_t pos = 0;
  while (pos < len) {
    uint64_t take = std::min<uint64_t>(piece, len - pos);
    while (take > 0) {
      if (chunk.len() == b3::CHUNK_LEN) {
        // More input follows: the chunk is complete and not the root.
        uint32_t cv[8];
        chunk.finish(0, cv);
        uint64_t total = chunk.counter + 1;
        while ((total & 1) == 0) {
          --depth;
          b3::parent_cv(stack[depth], cv, 0, cv);
          total >>= 1;
        }
        memcpy(stack[depth], cv, 32);
        ++depth;
        chunk.init(chunk.counter + 1);
      }
      const uint64_t room = b3::CHUNK_LEN - chunk.len();
      const uint64_t n = std::min(room, take);
      chunk.update(data + pos, n);
      pos += n;
      take -= n;
    }
  }
  uint32_t cv[8];
  if (depth == 0) {
    chunk.finish(b3::ROOT, cv);
  } else {
    chunk.finish(0, cv);
    while (depth > 1) {
      --depth;
      b3::parent_cv(stack[depth], cv, 0, cv);
    }
    b3::parent_cv(stack[0], cv, b3::ROOT, cv);
  }
  b3::store_words(cv, out);
}

// The CUDA kernels' plan, run sequentially: a leaf pass over tiles of
// 2^leaf_tile_log2 chunks, then reduce passes over tiles of up to 256 nodes
// until one node per row is left. Every tile is reduced with level_node()
// as in the kernels.
void smz_blake3_host_emulate_rows(const uint8_t* data, uint64_t rows, uint64_t row_bytes,
                                  uint8_t* out) {
  if (rows == 0) return;
  const uint64_t cpr = b3::chunk_count(row_bytes);
  const uint32_t t = b3::leaf_tile_log2(cpr);
  const uint64_t tile = 1ull << t;
  uint64_t count = b3::ceil_div_pow2(cpr, t);
  bool final_pass = count == 1;
  std::vector<uint32_t> cur(rows * count * 8);
  std::vector<uint32_t> nodes(tile * 8);
  uint32_t node[8];
  for (uint64_t r = 0; r < rows; ++r) {
    const uint8_t* row = data + r * row_bytes;
    for (uint64_t ti = 0; ti < count; ++ti) {
      const uint64_t m0 = std::min(tile, cpr - ti * tile);
      for (uint64_t k = 0; k < m0; ++k) {
        const uint64_t chunk = ti * tile + k;
        const uint64_t off = chunk * b3::CHUNK_LEN;
        const uint32_t clen =
            static_cast<uint32_t>(std::min<uint64_t>(b3::CHUNK_LEN, row_bytes - off));
        b3::chunk_cv(row + off, clen, chunk, cpr == 1 ? b3::ROOT : 0u, &nodes[k * 8]);
      }
      reduce_tile(nodes, m0, t, final_pass, node);
      if (final_pass) {
        b3::store_words(node, out + 32 * r);
      } else {
        memcpy(&cur[(r * count + ti) * 8], node, 32);
      }
    }
  }
  while (!final_pass) {
    const uint32_t t2 = b3::reduce_tile_log2(count);
    const uint64_t tile2 = 1ull << t2;
    const uint64_t next_count = b3::ceil_div_pow2(count, t2);
    final_pass = next_count == 1;
    std::vector<uint32_t> next(rows * next_count * 8);
    nodes.assign(tile2 * 8, 0);
    for (uint64_t r = 0; r < rows; ++r) {
      for (uint64_t ti = 0; ti < next_count; ++ti) {
        const uint64_t m0 = std::min(tile2, count - ti * tile2);
        memcpy(nodes.data(), &cur[(r * count + ti * tile2) * 8], m0 * 32);
        reduce_tile(nodes, m0, t2, final_pass, node);
        if (final_pass) {
          b3::store_words(node, out + 32 * r);
        } else {
          memcpy(&next[(r * next_count + ti) * 8], node, 32);
        }
      }
    }
    cur.swap(next);
    count = next_count;
  }
}

// 0 when the cooperative load layout is a bijection that hands every lane its
// own block and is free of bank conflicts; a positive code otherwise.
int smz_blake3_host_coop_selftest(void) {
  int owner[128];
  for (int& o : owner) o = -1;
  for (uint32_t i = 0; i < 4; ++i) {
    for (uint32_t phase = 0; phase < 4; ++phase) {
      bool group_used[8] = {false, false, false, false, false, false, false, false};
      for (uint32_t l = phase * 8; l < phase * 8 + 8; ++l) {
        const uint32_t job = b3::coop_job(l, i);
        const uint32_t unit = b3::coop_unit(l, i);
        const uint32_t slot = b3::coop_slot(job, unit);
        if (slot >= 128) return 1;
        if (owner[slot] != -1) return 2;
        owner[slot] = static_cast<int>(job * 4 + unit);
        if (group_used[slot % 8]) return 3;
        group_used[slot % 8] = true;
      }
    }
  }
  for (uint32_t unit = 0; unit < 4; ++unit) {
    for (uint32_t phase = 0; phase < 4; ++phase) {
      bool group_used[8] = {false, false, false, false, false, false, false, false};
      for (uint32_t l = phase * 8; l < phase * 8 + 8; ++l) {
        const uint32_t slot = b3::coop_slot(l, unit);
        if (owner[slot] != static_cast<int>(l * 4 + unit)) return 4;
        if (group_used[slot % 8]) return 5;
        group_used[slot % 8] = true;
      }
    }
  }
  return 0;
}

}  // extern "C"
