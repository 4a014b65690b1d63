// A step's queries attending to each row's K/V cache, on an x86-64 CPU with AVX2 and FMA
// (lookahead_jax/models/cpu_kernel/__init__.py says why and where it is used).
//
// Shapes (float32; R = T x Q query rows per kv head, T new tokens of Q heads each):
//   q          [B, K, R, Dh]   row r is token r / Q's query of head r % Q
//   cache k/v  [B, K, S, Dh]   entry s holds position s
//   lengths    [B]             a row's cache entries s < lengths[b] are visible
//   positions  [B, T]          the tokens' positions (for a sliding window)
// Results: top [B, K, R] (the largest visible score, or -1e30 where none is visible),
// mass [B, K, R] (sum over visible s of exp(score - top)) and acc [B, K, R, Dh] (the
// values weighted by the same exp), the online softmax's carry over the cache, which
// attention.attention merges with the new tokens' part. Entry s is visible to the query of
// a token at position p where s < lengths[b] and, with a window w > 0, p - s < w.
//
// Segments (`segments`: a ragged pass's own keys, attention.segment_attention): k/v are
// the pass's T tokens (S = T) and `positions` holds each token's row's first token
// (`first`), so token t sees the entries first[b, t] <= s <= t (s < lengths[b] too;
// with a window, t - s < w: within a row the distance of positions). A unit then holds 16
// tokens' queries, so that it reads only the keys of the rows they are in.
//
// One unit of work is a row, a kv head and a run of its queries, handed out to XLA's
// intra-op threads. A unit reads the visible cache once, 16 positions at a time (the
// keys and values two tiles ahead prefetched into L2, a line of each with each term of
// the tile's first scores: the hardware's prefetcher alone left the kernel at half the
// rate these cores stream; into L1, the L1's few outstanding misses held the prefetches
// up, and 16 rows' one-token step over 256 cached positions took 13.1-14.3 ms for 30
// layers where into L2 it takes 9.8-10.3 ms, a 16-token step the same 2.4-3.1 ms, on the
// 2-core AMD EPYC Zen 4; 1 or 3 tiles ahead measured slower; all of a tile's lines at
// once, at its start, held the core up on the L1's line buffers as well: 13.1 ms that
// way, 9.6 ms spread, on the 2-core Intel Xeon model 167), and for each tile and 6
// queries (3 for a one-token step's group of 3 heads):
//   1. scores: the tile's keys transposed into [Dh, 16], the 6 x 16 scores build up in
//      12 AVX registers, one FMA chain over d each;
//   2. the online softmax: each query's top so far, its mass and acc rescaled by
//      exp(old top - new top), p = exp(score - top) (0 where not visible);
//   3. acc += p @ V, 6 queries x 16 dims in 12 registers, one FMA chain over the tile.
// Tiles start at multiples of 16 positions and masked entries add exact zeros, so a
// query's result does not depend on which other queries share its unit. Where the CPU
// has AVX-512, the call has 7 tokens or more (B x T, as the matmul's AVX-512 tile) and a
// unit more than 6 queries (or is a pass's segments), group512 does the same 12 queries
// at a time with a tile's 16
// positions or dims in one register: each lane the same operations in the same order, so
// the same bits as the AVX2 path (a 16-token step's 30 layers: 4.4-5.7 ms AVX2, 3.7-4.8
// AVX-512, benchmarks/cpu/cache_attention_xeon_167_s89.md).
//
// Measured (benchmarks/cpu/cache_attention.md): XLA's loop over 64-position blocks took
// 4.3 ms for 30 layers of one token over 256 positions, this 1.9 ms with the merge.
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels.h"
#include "parallel.h"
#include "transpose.h"
#include "vector_exp.h"

namespace {

using lookahead_jax::exp256;
using lookahead_jax::exp512;
using Problem = lookahead_jax::CacheAttention;

constexpr int64_t kRows = 6;    // queries per register tile
constexpr int64_t kCols = 16;   // positions (scores) or dims (p @ V) per tile
constexpr float kNegInf = -1e30f;  // attention.NEG_INF

// The sum of v's 8 lanes, always in the same order.
inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

inline __m256 hmax8(__m256 v) {  // every lane: the largest of v's lanes
  __m256 m = _mm256_max_ps(v, _mm256_permute2f128_ps(v, v, 1));
  m = _mm256_max_ps(m, _mm256_shuffle_ps(m, m, 0x4e));
  return _mm256_max_ps(m, _mm256_shuffle_ps(m, m, 0xb1));
}

// Cache lines to prefetch into L2 while a tile computes, one of `keys` and one of `values`
// a term (see unit's loop).
struct Ahead {
  const char *keys = nullptr, *values = nullptr;
  int64_t lines = 0;
};

// A tile: NR rows a[r] times W registers of columns of b (row stride ldb) over n terms:
// out[r][j] = sum_i a[r][i] * b[i][j], one FMA chain over i.
template <int NR, int W>
inline void tile(const float* const* a, const float* b, int64_t ldb, int64_t n,
                 __m256 (&out)[NR][2], Ahead ahead = {}) {
  __m256 c[NR][W];
  for (int r = 0; r < NR; ++r)
    for (int w = 0; w < W; ++w) c[r][w] = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; ++i) {
    if (i < ahead.lines) {
      _mm_prefetch(ahead.keys + 64 * i, _MM_HINT_T1);
      _mm_prefetch(ahead.values + 64 * i, _MM_HINT_T1);
    }
    __m256 b0 = _mm256_loadu_ps(b + i * ldb), b1 = b0;
    if (W == 2) b1 = _mm256_loadu_ps(b + i * ldb + 8);
    for (int r = 0; r < NR; ++r) {
      const __m256 x = _mm256_broadcast_ss(a[r] + i);
      c[r][0] = _mm256_fmadd_ps(x, b0, c[r][0]);
      if (W == 2) c[r][1] = _mm256_fmadd_ps(x, b1, c[r][1]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int w = 0; w < W; ++w) out[r][w] = c[r][w];
}

constexpr int64_t kAhead = 2 * kCols;  // positions the keys and values are prefetched ahead

// Prefetches rows [from, to) of a [S, Dh] buffer (Dh floats a row) into the cache.
template <typename Hint>
inline void prefetch_rows(const float* buf, int64_t Dh, int64_t from, int64_t to, Hint hint) {
  const char* p = reinterpret_cast<const char*>(buf + from * Dh);
  const char* end = reinterpret_cast<const char*>(buf + to * Dh);
  for (; p < end; p += 64) _mm_prefetch(p, hint);
}

// What a tile's groups of queries share (unit's loop): the unit's queries, the tile's
// keys transposed and its values, each query's visible range and online softmax carry.
struct TileWork {
  const float* q;     // [n, Dh]: the unit's queries
  int64_t n, Dh;
  const float* kt;    // [Dh, 16]: the tile's keys, transposed
  const float* vals;  // [m, Dh]: the tile's values (positions s0 .. s0 + m)
  int64_t s0, m, len;
  const int64_t *lo, *hi;  // [rows]: each query's first visible position, one past its last
  float *top, *mass, *acc;  // [rows], [rows], [rows, Dh]: the carry
  float scale;
  Ahead ahead;  // lines to prefetch during the first group's scores
};

// mass * rescale + the tile's sum: the same expression for both widths.
inline float carried(float mass, float rescale, float tile_sum) {
  return mass * rescale + tile_sum;
}

// Queries g .. g + NR of a tile, with AVX2 (see the top of the file).
template <int64_t NR, bool Segments>
inline void group256(const TileWork& t, int64_t g) {
  // scores of NR queries x 16 positions
  const float* a[NR];
  for (int64_t r = 0; r < NR; ++r) a[r] = t.q + std::min(g + r, t.n - 1) * t.Dh;
  __m256 sc[NR][2];
  tile<NR, 2>(a, t.kt, kCols, t.Dh, sc, g == 0 ? t.ahead : Ahead{});
  // online softmax: each query's top so far, its mass rescaled, p = exp(s - top)
  const __m256i at0 = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(t.s0)),
                                       _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256i at1 = _mm256_add_epi32(at0, _mm256_set1_epi32(8));
  static_assert(NR <= 8, "one register of rescales");
  alignas(32) float pt[NR][kCols], sums[NR], rescale[8] = {};
  for (int64_t r = 0; r < NR; ++r) {
    const __m256i from = _mm256_set1_epi32(static_cast<int>(t.lo[g + r]) - 1);
    const __m256i end = _mm256_set1_epi32(static_cast<int>(Segments ? t.hi[g + r] : t.len));
    const __m256 seen0 = _mm256_castsi256_ps(
        _mm256_and_si256(_mm256_cmpgt_epi32(at0, from), _mm256_cmpgt_epi32(end, at0)));
    const __m256 seen1 = _mm256_castsi256_ps(
        _mm256_and_si256(_mm256_cmpgt_epi32(at1, from), _mm256_cmpgt_epi32(end, at1)));
    const __m256 neg = _mm256_set1_ps(kNegInf), scale = _mm256_set1_ps(t.scale);
    const __m256 x0 = _mm256_blendv_ps(neg, _mm256_mul_ps(sc[r][0], scale), seen0);
    const __m256 x1 = _mm256_blendv_ps(neg, _mm256_mul_ps(sc[r][1], scale), seen1);
    const float old = t.top[g + r];
    const float top = std::max(old, _mm256_cvtss_f32(hmax8(_mm256_max_ps(x0, x1))));
    const __m256 tv = _mm256_set1_ps(top);
    const __m256 e0 = _mm256_and_ps(exp256(_mm256_sub_ps(x0, tv)), seen0);
    const __m256 e1 = _mm256_and_ps(exp256(_mm256_sub_ps(x1, tv)), seen1);
    _mm256_store_ps(pt[r], e0);
    _mm256_store_ps(pt[r] + 8, e1);
    sums[r] = hsum(_mm256_add_ps(e0, e1));
    rescale[r] = old - top;
    t.top[g + r] = top;
  }
  // exp(old top - new top), the NR queries' in one call (lane r: query r's)
  _mm256_store_ps(rescale, exp256(_mm256_load_ps(rescale)));
  for (int64_t r = 0; r < NR; ++r) t.mass[g + r] = carried(t.mass[g + r], rescale[r], sums[r]);
  // acc = acc * rescale + p @ V, 16 (then 8) dims at a time
  const float* pa[NR];
  for (int64_t r = 0; r < NR; ++r) pa[r] = pt[r];
  for (int64_t d = 0; d < t.Dh; d += kCols) {
    const bool wide = d + kCols <= t.Dh;
    __m256 out[NR][2];
    if (wide) {
      tile<NR, 2>(pa, t.vals + d, t.Dh, t.m, out);
    } else {
      tile<NR, 1>(pa, t.vals + d, t.Dh, t.m, out);
    }
    for (int64_t r = 0; r < NR; ++r) {
      float* o = t.acc + (g + r) * t.Dh + d;
      const __m256 rs = _mm256_set1_ps(rescale[r]);
      _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_loadu_ps(o), rs, out[r][0]));
      if (wide) _mm256_storeu_ps(o + 8, _mm256_fmadd_ps(_mm256_loadu_ps(o + 8), rs, out[r][1]));
    }
  }
}

// group256 with AVX-512 registers: a tile's 16 positions (scores) or 16 dims (p @ V) in
// one register where AVX2 takes two, each lane's FMA chain, exp and sum as group256's, so
// the same bits (test_cpu_kernel.py checks): the exp of 16 scores one call, the masks in
// mask registers, all of a query's dims in one sweep over the tile's values.
template <int64_t NR, bool Segments>
__attribute__((target("avx512f"), noinline)) void group512(const TileWork& t, int64_t g) {
  const float* a[NR];
  for (int64_t r = 0; r < NR; ++r) a[r] = t.q + std::min(g + r, t.n - 1) * t.Dh;
  __m512 sc[NR];
  for (int64_t r = 0; r < NR; ++r) sc[r] = _mm512_setzero_ps();
  const Ahead ahead = g == 0 ? t.ahead : Ahead{};
  for (int64_t i = 0; i < t.Dh; ++i) {  // scores: tile<NR, 2>'s chains
    if (i < ahead.lines) {
      _mm_prefetch(ahead.keys + 64 * i, _MM_HINT_T1);
      _mm_prefetch(ahead.values + 64 * i, _MM_HINT_T1);
    }
    const __m512 k = _mm512_loadu_ps(t.kt + i * kCols);
    for (int64_t r = 0; r < NR; ++r) sc[r] = _mm512_fmadd_ps(_mm512_set1_ps(a[r][i]), k, sc[r]);
  }
  const __m512i at = _mm512_add_epi32(
      _mm512_set1_epi32(static_cast<int>(t.s0)),
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  static_assert(NR <= 16, "one register of rescales");
  alignas(64) float pt[NR][kCols], sums[NR], rescale[16] = {};
  for (int64_t r = 0; r < NR; ++r) {
    const __m512i from = _mm512_set1_epi32(static_cast<int>(t.lo[g + r]) - 1);
    const __m512i end = _mm512_set1_epi32(static_cast<int>(Segments ? t.hi[g + r] : t.len));
    const __mmask16 seen = _mm512_cmpgt_epi32_mask(at, from) & _mm512_cmpgt_epi32_mask(end, at);
    const __m512 x = _mm512_mask_mul_ps(_mm512_set1_ps(kNegInf), seen, sc[r],
                                        _mm512_set1_ps(t.scale));
    const float old = t.top[g + r];
    const float top = std::max(old, _mm512_reduce_max_ps(x));
    const __m512 e = _mm512_maskz_mov_ps(seen, exp512(_mm512_sub_ps(x, _mm512_set1_ps(top))));
    _mm512_store_ps(pt[r], e);
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1));
    sums[r] = hsum(_mm256_add_ps(_mm512_castps512_ps256(e), hi));
    rescale[r] = old - top;
    t.top[g + r] = top;
  }
  _mm512_store_ps(rescale, exp512(_mm512_load_ps(rescale)));
  for (int64_t r = 0; r < NR; ++r) t.mass[g + r] = carried(t.mass[g + r], rescale[r], sums[r]);
  for (int64_t d = 0; d < t.Dh; d += kCols) {  // p @ V: tile<NR, W>'s chains
    const __mmask16 dims = t.Dh - d >= kCols ? 0xffff : 0x00ff;  // (Dh: a multiple of 8)
    __m512 out[NR];
    for (int64_t r = 0; r < NR; ++r) out[r] = _mm512_setzero_ps();
    for (int64_t i = 0; i < t.m; ++i) {
      const __m512 v = _mm512_maskz_loadu_ps(dims, t.vals + i * t.Dh + d);
      for (int64_t r = 0; r < NR; ++r)
        out[r] = _mm512_fmadd_ps(_mm512_set1_ps(pt[r][i]), v, out[r]);
    }
    for (int64_t r = 0; r < NR; ++r) {
      float* o = t.acc + (g + r) * t.Dh + d;
      const __m512 old = _mm512_maskz_loadu_ps(dims, o);
      _mm512_mask_storeu_ps(o, dims, _mm512_fmadd_ps(old, _mm512_set1_ps(rescale[r]), out[r]));
    }
  }
}

// One unit: row b, kv head h, queries [r0, r1), one pass over the visible cache in tiles
// of 16 positions (see the top of the file), NR queries at a time (3 for a one-token
// step's group of 3 heads, else 6, or 12 with AVX-512; a query's arithmetic is the same
// either way) with AVX2 or (Wide) AVX-512's group512; Segments: p.segments (each query's
// own end, else the row's).
template <int64_t NR, bool Segments, bool Wide>
void unit(const Problem& p, int64_t b, int64_t h, int64_t r0, int64_t r1) {
  const int64_t n = r1 - r0, Dh = p.Dh, S = p.S;
  const int64_t bh = b * p.H + h;
  const int64_t len = std::clamp<int64_t>(p.lengths[b], 0, S);
  const int64_t Q = p.R / p.T;
  const int64_t rows = (n + NR - 1) / NR * NR;
  thread_local std::vector<float> acc_buf, kt_buf, tops, masses;
  thread_local std::vector<int64_t> lo_buf, hi_buf;
  acc_buf.assign(static_cast<size_t>(rows * Dh), 0.0f);
  tops.assign(static_cast<size_t>(rows), kNegInf);  // each query's largest score so far
  masses.assign(static_cast<size_t>(rows), 0.0f);   // and its sum of exp(score - top)
  kt_buf.resize(static_cast<size_t>(Dh * kCols));
  lo_buf.assign(static_cast<size_t>(rows), len);  // padding rows see nothing
  hi_buf.assign(static_cast<size_t>(rows), 0);
  int64_t* lo = lo_buf.data();  // [rows]: each query's first visible position
  int64_t* hi = hi_buf.data();  // [rows]: ... and the one past its last
  const float* keys = p.k + bh * S * Dh;
  const float* vals = p.v + bh * S * Dh;
  int64_t first = len, last = 0;  // the positions any query of the unit sees: [first, last)
  for (int64_t r = 0; r < n; ++r) {
    const int64_t t = (r0 + r) / Q, at = p.positions[b * p.T + t];
    lo[r] = Segments ? std::clamp<int64_t>(at, 0, len) : 0;
    hi[r] = Segments ? std::min(t + 1, len) : len;
    if (p.window > 0) {  // (segments: the token's index is its position in the pass)
      const int64_t pos = Segments ? t : at;
      lo[r] = std::max(lo[r], std::clamp<int64_t>(pos - p.window + 1, 0, len));
    }
    first = std::min(first, lo[r]), last = std::max(last, hi[r]);
  }
  TileWork work{p.q + (bh * p.R + r0) * Dh, n, Dh, kt_buf.data(), nullptr, 0, 0, len,
                lo, hi, tops.data(), masses.data(), acc_buf.data(), p.scale, {}};
  const int64_t base = first / kCols * kCols;  // tiles start at multiples of 16
  prefetch_rows(keys, Dh, base, std::min(last, base + kAhead), _MM_HINT_T1);
  prefetch_rows(vals, Dh, base, std::min(last, base + kAhead), _MM_HINT_T1);
  for (int64_t s0 = base; s0 < last; s0 += kCols) {
    work.s0 = s0, work.m = std::min(kCols, last - s0), work.vals = vals + s0 * Dh;
    // the tile kAhead positions on: its lines of keys and of values, one of each a term
    // of the first group's scores (Dh terms; a tile is 16 x Dh x 4 bytes: Dh lines), so
    // that the prefetches spread over the work (all at once, they held up the core on
    // the L1's few line buffers: 16 rows' step took 13.1 ms for 30 layers, spread 9.6)
    const int64_t later = std::min(last, s0 + kAhead + kCols) - (s0 + kAhead);
    work.ahead = {};
    if (later > 0) {  // (no pointer past the buffers is formed)
      work.ahead = {reinterpret_cast<const char*>(keys + (s0 + kAhead) * Dh),
                    reinterpret_cast<const char*>(vals + (s0 + kAhead) * Dh),
                    (later * Dh * 4 + 63) / 64};
    }
    // the tile's m keys [m, Dh] -> kt [Dh, 16], zeros past `last` (nothing read past it)
    lookahead_jax::transpose_group(keys + s0 * Dh, work.m, Dh, kCols, 0, kt_buf.data());
    for (int64_t g = 0; g < rows; g += NR) {
      if constexpr (Wide) {
        group512<NR, Segments>(work, g);
      } else {
        group256<NR, Segments>(work, g);
      }
    }
  }
  float* top_out = p.top + bh * p.R + r0;
  float* mass_out = p.mass + bh * p.R + r0;
  std::copy(tops.begin(), tops.begin() + n, top_out);
  std::copy(masses.begin(), masses.begin() + n, mass_out);
  std::copy(acc_buf.begin(), acc_buf.begin() + n * Dh, p.acc + (bh * p.R + r0) * Dh);
}

// A unit through the AVX2 path or (wide, see cache_attention_f32: a pass's segments and
// units of more than 6 queries) group512, 12 queries at a time: at 3 queries a tile (16
// rows of one token) the AVX-512 path measured no faster, its unit bound by reading the
// cache.
void run(const Problem& p, bool wide, int64_t b, int64_t h, int64_t r0, int64_t r1) {
  constexpr int64_t k12 = 2 * kRows;
  if (p.segments) {
    wide ? unit<k12, true, true>(p, b, h, r0, r1) : unit<kRows, true, false>(p, b, h, r0, r1);
  } else if (r1 - r0 > kRows) {
    wide ? unit<k12, false, true>(p, b, h, r0, r1) : unit<kRows, false, false>(p, b, h, r0, r1);
  } else if (r1 - r0 > 3) {
    unit<kRows, false, false>(p, b, h, r0, r1);
  } else if (r0 < r1) {
    unit<3, false, false>(p, b, h, r0, r1);
  }
}

}  // namespace

namespace lookahead_jax {

void cache_attention_f32(Workers& pool, const CacheAttention& p) {
  const int64_t heads = p.B * p.H;
  if (heads == 0 || p.R == 0) return;
  // units of a row, a kv head and `chunk` of its queries: enough for two a thread, none
  // under one tile of queries (segments: 16 tokens' queries a unit, however few units
  // that makes); shared out by parallel_for
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t want = std::max<int64_t>(1, (2 * threads + heads - 1) / heads);
  const int64_t chunk = p.segments ? kCols * (p.R / p.T)  // 16 tokens' queries
                                   : std::max<int64_t>(kRows, (p.R + want - 1) / want);
  const int64_t per_head = (p.R + chunk - 1) / chunk;
  // AVX-512 where the step's matmuls take it too (kWideMatmulRows tokens and more: at
  // fewer a step is bound by reading weights, and an earlier Xeon ran AVX-512 at a lower
  // clock that the whole step paid; an 8-token step's attention took 0.58 ms less with it,
  // 11 of 12 alternating rounds on the Intel Xeon model 207, from 12 tokens before)
  const bool wide = has_avx512() && p.B * p.T >= kWideMatmulRows;
  lookahead_jax::parallel_for(pool, heads * per_head, [p, chunk, per_head, wide](int64_t u) {
    const int64_t bh = u / per_head, r0 = u % per_head * chunk;
    const int64_t r1 = std::min(p.R, r0 + chunk);
    run(p, wide, bh / p.H, bh % p.H, r0, r1);
  });
}

}  // namespace lookahead_jax
