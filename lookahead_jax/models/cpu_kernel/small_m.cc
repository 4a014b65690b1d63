// y[M, N] = x[M, K] @ W[K, N] for small M on an x86-64 CPU with AVX2 and FMA, reading
// W once (lookahead_jax/models/cpu_kernel/__init__.py says why and where it is used).
//
// W is stored in panels of 16 output columns, [P, K, 16] with P = N / 16, so a panel
// is K * 64 contiguous bytes: W[k, 16 p + j] = panels[p, k, j]. For each panel the
// rows of x go through it in groups of at most six, of nearly equal size (16 rows go
// 6 + 5 + 5), each group keeping its outputs in up to 12 AVX registers over the whole
// sum over k (BLIS's 6 x 16 register tile for AVX2); the first group reads the panel
// from memory, the others from L2, and while a panel is used the next one is prefetched
// into L2, so the weights stream from memory once whatever M is. Panels are shared out
// between XLA's intra-op threads.
//
// Every output is one chain of FMAs over k = 0 .. K-1 in order, the same whichever
// group, thread or M the row comes in: a row's result does not depend on the other rows
// (a lookahead step's rows get bit for bit what a one-token step computes).
//
// Where the CPU has AVX-512 (checked once, at run time) and x has at least 7 rows, a
// panel's row of 16 outputs is one 512-bit register, and up to 12 rows (groups of equal
// size: 16 rows go 8 + 8) go through two panels at once (`tile512`), so that each
// broadcast of x[r, k] feeds two FMAs: the same FMA chains, so the same bits, with fewer
// loads per FMA (the AVX2 tile's broadcast feeds two 8-wide FMAs, the AVX-512 tile's with
// one panel a single 16-wide one, and that one measured no faster than AVX2).
//
// Weights are float32, or int8 with one float32 scale per output column (per-channel
// int8: the int8 values are summed in float32 and the sum is scaled, as quantize.py's
// reference computes it).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "kernels.h"
#include "parallel.h"
#include "transpose.h"

namespace {

constexpr int64_t kPanel = lookahead_jax::kPanelColumns;  // two 8-float AVX registers
constexpr int kRows = 6;        // rows of x per register tile

inline void load16(const float* w, __m256& w0, __m256& w1) {
  w0 = _mm256_loadu_ps(w);
  w1 = _mm256_loadu_ps(w + 8);
}

inline void load16(const int8_t* w, __m256& w0, __m256& w1) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
  w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
  w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8)));
}

// Prefetching the next panel into L2 while this one is used: the tiles of a panel
// (one per group of rows) each fetch an equal share of the next panel's lines, spread
// evenly over their k, so memory stays busy while the later groups compute from L2.
// Worked example: float32, K = 576, M = 16: a panel is 576 lines of 64 bytes, the rows
// go in 3 groups (6, 5, 5), so group g fetches lines 192 g .. 192 g + 191 of the next
// panel, one every third k (step = 576 / (3 * 576) = 1/3 line per k).
struct Prefetch {
  const char* next;  // the next panel's first byte
  uint64_t pos;      // 32.32 fixed point: the line to fetch at this k
  uint64_t step;     // lines per k
};

inline Prefetch prefetch_share(const char* next, int64_t lines, int64_t group, int64_t groups,
                               int64_t K) {
  const uint64_t step = (static_cast<uint64_t>(lines) << 32) / static_cast<uint64_t>(groups * K);
  return {next, static_cast<uint64_t>(group * K) * step, step};
}

// R rows of x (row stride K) times one panel (K x 16), into y (row stride ldy), each
// output times scale[j] when scale is given; `pf` says which lines of the next panel
// to prefetch meanwhile.
template <int R, typename W>
inline void tile(const float* x, int64_t K, const W* panel, const float* scale, float* y,
                 int64_t ldy, Prefetch pf) {
  static_assert(R >= 1 && R <= kRows, "rows per tile");
  // named registers, not an array: GCC spills an array of __m256 to the stack every k
#define LJ_ROWS(F) F(0) F(1) F(2) F(3) F(4) F(5)
#define LJ_INIT(r)                                                   \
  __m256 a##r##0 = _mm256_setzero_ps(), a##r##1 = _mm256_setzero_ps(); \
  const float* x##r = x + (r < R ? r : 0) * K;
  LJ_ROWS(LJ_INIT)
  for (int64_t k = 0; k < K; ++k, pf.pos += pf.step) {
    _mm_prefetch(pf.next + (pf.pos >> 32) * 64, _MM_HINT_T1);
    __m256 w0, w1;
    load16(panel + k * kPanel, w0, w1);
#define LJ_FMA(r)                                   \
  if constexpr (r < R) {                            \
    const __m256 b = _mm256_broadcast_ss(x##r + k); \
    a##r##0 = _mm256_fmadd_ps(b, w0, a##r##0);      \
    a##r##1 = _mm256_fmadd_ps(b, w1, a##r##1);      \
  }
    LJ_ROWS(LJ_FMA)
  }
  __m256 s0 = _mm256_set1_ps(1.0f), s1 = s0;
  if (scale != nullptr) load16(scale, s0, s1);
#define LJ_STORE(r)                                                    \
  if constexpr (r < R) {                                               \
    _mm256_storeu_ps(y + r * ldy, scale ? _mm256_mul_ps(a##r##0, s0) : a##r##0); \
    _mm256_storeu_ps(y + r * ldy + 8, scale ? _mm256_mul_ps(a##r##1, s1) : a##r##1); \
  }
  LJ_ROWS(LJ_STORE)
#undef LJ_ROWS
#undef LJ_INIT
#undef LJ_FMA
#undef LJ_STORE
}

// The AVX-512 tile: R <= kRows512 rows of x times one or two panels, one 512-bit
// accumulator a row and panel; each output the same chain of FMAs over k as `tile`
// computes.
constexpr int kRows512 = lookahead_jax::kWideRows;

__attribute__((target("avx512f"))) inline __m512 load16x512(const float* w) {
  return _mm512_loadu_ps(w);
}

__attribute__((target("avx512f"))) inline __m512 load16x512(const int8_t* w) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
}

// xt: the group's rows of x transposed, [K, size] (xt[k * size + r] = x[r, k]), so
// that one pointer reaches every row's x[k] at a constant offset (twelve row pointers
// would not fit the general registers beside the loop's own). NP panels at once (1 or 2,
// the second `panel_stride` floats after the first): with two, each broadcast of x[r, k]
// feeds two FMAs, so loads (x's broadcasts and W's lines) are fewer than FMAs.
template <int R, int NP, typename W>
__attribute__((target("avx512f"))) inline void tile512(const float* xt, int64_t size, int64_t K,
                                                       const W* panel, int64_t panel_stride,
                                                       const float* scale, float* y, int64_t ldy,
                                                       Prefetch pf) {
  static_assert(R >= 1 && R <= kRows512 && (NP == 1 || NP == 2), "rows and panels per tile");
  const bool two_lines = pf.step > (uint64_t{1} << 32);  // the loop is unswitched on it
#define LJ_ROWS(F) F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7) F(8) F(9) F(10) F(11)
#define LJ_INIT(r) __m512 a##r = _mm512_setzero_ps(), b##r = _mm512_setzero_ps();
  LJ_ROWS(LJ_INIT)
  for (int64_t k = 0; k < K; ++k, pf.pos += pf.step) {
    _mm_prefetch(pf.next + (pf.pos >> 32) * 64, _MM_HINT_T1);
    // a pair's share can be two lines a k (one group: 2K lines over K k's); a second
    // prefetch every k only then (always, it measured 1.5-2x slower at M = 16..1024)
    if (NP == 2 && two_lines) _mm_prefetch(pf.next + ((pf.pos >> 32) + 1) * 64, _MM_HINT_T1);
    const __m512 w0 = load16x512(panel + k * kPanel);
    const __m512 w1 = NP == 2 ? load16x512(panel + panel_stride + k * kPanel) : w0;
    const float* xk = xt + k * size;
#define LJ_FMA(r)                                  \
  if constexpr (r < R) {                           \
    const __m512 x = _mm512_set1_ps(xk[r]);        \
    a##r = _mm512_fmadd_ps(x, w0, a##r);           \
    if constexpr (NP == 2) b##r = _mm512_fmadd_ps(x, w1, b##r); \
  }
    LJ_ROWS(LJ_FMA)
  }
  const __m512 s0 = scale != nullptr ? load16x512(scale) : _mm512_set1_ps(1.0f);
  const __m512 s1 = scale != nullptr && NP == 2 ? load16x512(scale + kPanel) : s0;
#define LJ_STORE(r)                                                                     \
  if constexpr (r < R) {                                                                \
    _mm512_storeu_ps(y + r * ldy, scale ? _mm512_mul_ps(a##r, s0) : a##r);             \
    if constexpr (NP == 2)                                                              \
      _mm512_storeu_ps(y + r * ldy + kPanel, scale ? _mm512_mul_ps(b##r, s1) : b##r);  \
  }
  LJ_ROWS(LJ_STORE)
#undef LJ_ROWS
#undef LJ_INIT
#undef LJ_FMA
#undef LJ_STORE
}

// Rows of x go through the AVX-512 tile in Groups512(M) groups of equal size.
inline int64_t Groups512(int64_t M) { return (M + kRows512 - 1) / kRows512; }

// x [M, K] -> xt: each group's rows transposed, [groups, K, size] (tile512's xt; slots of
// rows past M hold zeros, which tile512 never reads: it reads rows r < R only). Groups are
// shared out between the threads where there are at least 4 a thread (a prefill's M):
// below that a group's transpose (~1 us at K = 576) costs less than handing it out.
std::unique_ptr<float[]> Transpose512(lookahead_jax::Workers& pool, const float* x, int64_t M,
                                      int64_t K) {
  const int64_t groups = Groups512(M), size = (M + groups - 1) / groups;
  std::unique_ptr<float[]> xt(new float[static_cast<size_t>(groups * K * size)]);
  float* out = xt.get();
  const auto group = [=](int64_t g) {
    lookahead_jax::transpose_group(x, M, K, size, g, out + g * K * size);
  };
  if (groups >= 4 * std::max<int64_t>(1, pool.num_threads())) {
    lookahead_jax::parallel_for(pool, groups, group);
  } else {
    for (int64_t g = 0; g < groups; ++g) group(g);
  }
  return xt;
}

template <typename W>
struct Matmul {
  const float* x;
  int64_t M, K;
  const W* panels;
  int64_t P;
  const float* scale;  // [P * 16] or nullptr
  float* y;
  const float* xt = nullptr;  // x transposed for run512 (Transpose512), or nullptr
  // Panels from a chunk's end to the first panel of the chunk its thread most likely takes
  // next (parallel_for hands chunks out in order, so a thread ending chunk c takes about
  // c + threads): Run's (threads - 1) x chunk. Prefetched while the chunk's last panels
  // run, instead of nothing: that chunk's first panels were read from memory on demand.
  int64_t to_next_chunk = 0;

  // 64-byte lines a panel holds
  int64_t panel_lines() const { return K * kPanel * static_cast<int64_t>(sizeof(W)) / 64; }

  // Where the panels after those before p1 (a chunk's end) are prefetched from: the next
  // chunk's first panel (`count` of them at most), or `fallback` where there is none.
  const char* after_chunk(int64_t p1, int64_t count, const W* fallback, int64_t& lines) const {
    const int64_t q = p1 + to_next_chunk;
    if (to_next_chunk == 0 || q >= P) return reinterpret_cast<const char*>(fallback);
    lines = std::min(count, P - q) * panel_lines();
    return reinterpret_cast<const char*>(panels + q * K * kPanel);
  }

  // panels [p0, p1) for every row of x. Each panel meets every row of x while it is in
  // L2; a prefill's thousands of rows are then read from L3 once a panel (blocking the
  // rows to keep them in L2 measured no faster: 116 GFLOP/s at M = 1024 either way).
  void run(int64_t p0, int64_t p1) const {
    const int64_t ldy = P * kPanel;
    for (int64_t p = p0; p < p1; ++p) {
      const W* panel = panels + p * K * kPanel;
      int64_t lines = panel_lines();
      const char* next = p + 1 < p1 ? reinterpret_cast<const char*>(panel + K * kPanel)
                                    : after_chunk(p1, 1, panel, lines);
      const int64_t groups = (M + kRows - 1) / kRows;
      const float* s = scale ? scale + p * kPanel : nullptr;
      float* yp = y + p * kPanel;
      // groups of (nearly) equal size: 8 rows go 4 + 4, not 6 + 2, whose 4 FMA chains a
      // k wait on the FMA's latency (an 8-row step 1.1 ms less, AMD EPYC Zen 3:
      // benchmarks/cpu/small_m_equal_groups_epyc_zen3_s93.md)
      for (int64_t g = 0, m = 0; g < groups; ++g) {
        const int64_t rows = M / groups + (g < M % groups ? 1 : 0);
        const float* xm = x + m * K;
        float* ym = yp + m * ldy;
        const Prefetch pf = prefetch_share(next, lines, g, groups, K);
        switch (rows) {
          case 6: tile<6>(xm, K, panel, s, ym, ldy, pf); break;
          case 5: tile<5>(xm, K, panel, s, ym, ldy, pf); break;
          case 4: tile<4>(xm, K, panel, s, ym, ldy, pf); break;
          case 3: tile<3>(xm, K, panel, s, ym, ldy, pf); break;
          case 2: tile<2>(xm, K, panel, s, ym, ldy, pf); break;
          case 1: tile<1>(xm, K, panel, s, ym, ldy, pf); break;
          default: break;
        }
        m += rows;
      }
    }
  }

  // run() with the AVX-512 tile (has_avx512()), over `xt`: x's rows transposed a group at
  // a time (Transpose512), then every panel through every group.
  __attribute__((target("avx512f"))) void run512(int64_t p0, int64_t p1) const {
    const int64_t ldy = P * kPanel;
    // groups of equal size (16 rows: 8 + 8, not 12 + 4, whose 4 FMA chains a k would
    // wait on the FMA's latency)
    const int64_t groups = Groups512(M), size = (M + groups - 1) / groups;
    for (int64_t p = p0; p < p1; p += 2) {
      const W* panel = panels + p * K * kPanel;
      const bool two = p + 1 < p1;
      // the next pair (or last single panel) of this chunk, prefetched while these run
      const int64_t q = p + (two ? 2 : 1);
      int64_t lines = (q + 1 < p1 ? 2 : 1) * panel_lines();
      const char* next = q < p1 ? reinterpret_cast<const char*>(panels + q * K * kPanel)
                                : after_chunk(p1, 2, panel, lines);
      const float* s = scale ? scale + p * kPanel : nullptr;
      float* yp = y + p * kPanel;
      for (int64_t g = 0; g < groups; ++g) {
        const float* xg = xt + g * K * size;
        float* yg = yp + g * size * ldy;
        const Prefetch pf = prefetch_share(next, lines, g, groups, K);
        const int64_t stride = K * kPanel;
#define LJ_CASE(r)                                                         \
  case r:                                                                  \
    if (two) {                                                             \
      tile512<r, 2>(xg, size, K, panel, stride, s, yg, ldy, pf);                 \
    } else {                                                               \
      tile512<r, 1>(xg, size, K, panel, stride, s, yg, ldy, pf);                 \
    }                                                                      \
    break;
        switch (std::min<int64_t>(size, M - g * size)) {
          LJ_CASE(12) LJ_CASE(11) LJ_CASE(10) LJ_CASE(9) LJ_CASE(8) LJ_CASE(7)
          LJ_CASE(6) LJ_CASE(5) LJ_CASE(4) LJ_CASE(3) LJ_CASE(2) LJ_CASE(1)
          default: break;
        }
#undef LJ_CASE
      }
    }
  }
};

// Two chunks of panels a thread (more and smaller chunks measured slower), shared out by
// parallel_for; a chunk's last panels prefetch the next chunk's first (to_next_chunk).
// Example: P = 36 panels (N = 576) on 2 threads: chunks of 9 panels, 4 chunks; chunk 0's
// last panel prefetches panel 18, chunk 2's first.
template <typename W>
void Run(lookahead_jax::Workers& pool, const Matmul<W>& mm) {
  if (mm.M == 0 || mm.P == 0) return;
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  // The AVX-512 tile from 7 rows up, where the AVX2 tile (6 rows) would go over each panel
  // twice: an 8-token step took 8.4 ms less with it, 4 tokens and 2 tokens 0.7 ms less, a
  // 16-token step the same (Intel Xeon model 207, alternating in one process;
  // benchmarks/cpu/small_m_wide_xeon_207_s92.md). At 1 and 4 rows it had measured slower
  // on an earlier Xeon (31.2 against 29.8 ms, 36.2 against 34.8;
  // benchmarks/cpu/step_ratio_xeon_*.md): where one AVX2 tile holds the rows, it stays.
  const bool wide = lookahead_jax::has_avx512() && mm.M >= lookahead_jax::kWideMatmulRows;
  int64_t chunk = std::max<int64_t>(1, (mm.P + 2 * threads - 1) / (2 * threads));
  if (wide) chunk += chunk % 2;  // pairs of panels: an odd chunk leaves one alone
  // x transposed once a call (M x K floats, a small part of the M x K x N multiply),
  // shared by every thread's panels
  const std::unique_ptr<float[]> xt = wide ? Transpose512(pool, mm.x, mm.M, mm.K) : nullptr;
  Matmul<W> with_xt = mm;
  with_xt.xt = xt.get();
  with_xt.to_next_chunk = (threads - 1) * chunk;
  lookahead_jax::parallel_for(pool, (mm.P + chunk - 1) / chunk, [mm = with_xt, chunk, wide](int64_t c) {
    const int64_t p1 = std::min(mm.P, (c + 1) * chunk);
    if (wide) {
      mm.run512(c * chunk, p1);
    } else {
      mm.run(c * chunk, p1);
    }
  });
}

}  // namespace

namespace lookahead_jax {

bool has_avx512() {
  static const bool yes = [] {
    const char* env = std::getenv("LOOKAHEAD_JAX_CPU_KERNEL");
    if (env != nullptr && std::strcmp(env, "avx2") == 0) return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
  }();
  return yes;
}

void small_m_f32(Workers& pool, const float* x, int64_t M, int64_t K, const float* panels,
                 int64_t P, float* y) {
  Run(pool, Matmul<float>{x, M, K, panels, P, nullptr, y});
}

void small_m_int8(Workers& pool, const float* x, int64_t M, int64_t K, const int8_t* panels,
                  const float* scale, int64_t P, float* y) {
  Run(pool, Matmul<int8_t>{x, M, K, panels, P, scale, y});
}

}  // namespace lookahead_jax

// 512 where the matmul runs its AVX-512 tile (from 7 rows up), else 256: for the tests.
extern "C" int lj_small_m_tile_bits() { return lookahead_jax::has_avx512() ? 512 : 256; }

// 1 where this CPU runs the kernel (AVX2 and FMA), else 0: checked before registering.
extern "C" int lj_small_m_supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
