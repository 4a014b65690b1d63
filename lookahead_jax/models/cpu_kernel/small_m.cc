// y[M, N] = x[M, K] @ W[K, N] for small M on an x86-64 CPU with AVX2 and FMA, reading
// W once (lookahead_jax/models/cpu_kernel/__init__.py says why and where it is used).
//
// W is stored in panels of 16 output columns, [P, K, 16] with P = N / 16, so a panel
// is K * 64 contiguous bytes: W[k, 16 p + j] = panels[p, k, j]. For each panel the
// rows of x go through it six at a time, each group keeping its 6 x 16 outputs in 12
// AVX registers over the whole sum over k (BLIS's 6 x 16 register tile for AVX2); the
// first group reads the panel from memory, the others from L2, and while a panel is
// used the next one is prefetched into L2, so the weights stream from memory once
// whatever M is. Panels are shared out between XLA's intra-op threads.
//
// Every output is one chain of FMAs over k = 0 .. K-1 in order, the same whichever
// group, thread or M the row comes in: a row's result does not depend on the other rows
// (a lookahead step's rows get bit for bit what a one-token step computes).
//
// Weights are float32, or int8 with one float32 scale per output column (per-channel
// int8: the int8 values are summed in float32 and the sum is scaled, as quantize.py's
// reference computes it).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels.h"
#include "parallel.h"

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
// go in 3 groups (6, 6, 4), so group g fetches lines 192 g .. 192 g + 191 of the next
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

template <typename W>
struct Matmul {
  const float* x;
  int64_t M, K;
  const W* panels;
  int64_t P;
  const float* scale;  // [P * 16] or nullptr
  float* y;

  // panels [p0, p1) for every row of x. Each panel meets every row of x while it is in
  // L2; a prefill's thousands of rows are then read from L3 once a panel (blocking the
  // rows to keep them in L2 measured no faster: 116 GFLOP/s at M = 1024 either way).
  void run(int64_t p0, int64_t p1) const {
    const int64_t ldy = P * kPanel;
    for (int64_t p = p0; p < p1; ++p) {
      const W* panel = panels + p * K * kPanel;
      const char* next = reinterpret_cast<const char*>(p + 1 < p1 ? panel + K * kPanel : panel);
      const int64_t lines = K * kPanel * static_cast<int64_t>(sizeof(W)) / 64;
      const int64_t groups = (M + kRows - 1) / kRows;
      const float* s = scale ? scale + p * kPanel : nullptr;
      float* yp = y + p * kPanel;
      int64_t m = 0, g = 0;
      for (; m + kRows <= M; m += kRows, ++g) {
        tile<kRows>(x + m * K, K, panel, s, yp + m * ldy, ldy,
                    prefetch_share(next, lines, g, groups, K));
      }
      const float* xm = x + m * K;
      float* ym = yp + m * ldy;
      const Prefetch pf = prefetch_share(next, lines, g, groups, K);
      switch (M - m) {
        case 5: tile<5>(xm, K, panel, s, ym, ldy, pf); break;
        case 4: tile<4>(xm, K, panel, s, ym, ldy, pf); break;
        case 3: tile<3>(xm, K, panel, s, ym, ldy, pf); break;
        case 2: tile<2>(xm, K, panel, s, ym, ldy, pf); break;
        case 1: tile<1>(xm, K, panel, s, ym, ldy, pf); break;
        default: break;
      }
    }
  }
};

// Two chunks of panels a thread (a chunk boundary leaves one panel unprefetched; more
// and smaller chunks measured slower), shared out by parallel_for. Example: P = 36 panels
// (N = 576) on 2 threads: chunks of 9 panels, 4 chunks.
template <typename W>
void Run(lookahead_jax::Workers& pool, const Matmul<W>& mm) {
  if (mm.M == 0 || mm.P == 0) return;
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t chunk = std::max<int64_t>(1, (mm.P + 2 * threads - 1) / (2 * threads));
  lookahead_jax::parallel_for(pool, (mm.P + chunk - 1) / chunk, [mm, chunk](int64_t c) {
    mm.run(c * chunk, std::min(mm.P, (c + 1) * chunk));
  });
}

}  // namespace

namespace lookahead_jax {

void small_m_f32(Workers& pool, const float* x, int64_t M, int64_t K, const float* panels,
                 int64_t P, float* y) {
  Run(pool, Matmul<float>{x, M, K, panels, P, nullptr, y});
}

void small_m_int8(Workers& pool, const float* x, int64_t M, int64_t K, const int8_t* panels,
                  const float* scale, int64_t P, float* y) {
  Run(pool, Matmul<int8_t>{x, M, K, panels, P, scale, y});
}

}  // namespace lookahead_jax

// 1 where this CPU runs the kernel (AVX2 and FMA), else 0: checked before registering.
extern "C" int lj_small_m_supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
