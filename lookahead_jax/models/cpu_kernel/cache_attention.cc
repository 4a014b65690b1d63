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
// keys and values two tiles ahead prefetched into L2: the hardware's prefetcher alone left
// the kernel at half the rate these cores stream; into L1, the L1's few outstanding misses
// held the prefetches up, and 16 rows' one-token step over 256 cached positions took
// 13.1-14.3 ms for 30 layers where into L2 it takes 9.8-10.3 ms, a 16-token step the same
// 2.4-3.1 ms, on the 2-core AMD EPYC Zen 4; 1 or 3 tiles ahead measured slower), and for
// each tile and 6 queries (3 for a one-token step's group of 3 heads):
//   1. scores: the tile's keys transposed into [Dh, 16], the 6 x 16 scores build up in
//      12 AVX registers, one FMA chain over d each;
//   2. the online softmax: each query's top so far, its mass and acc rescaled by
//      exp(old top - new top), p = exp(score - top) (0 where not visible);
//   3. acc += p @ V, 6 queries x 16 dims in 12 registers, one FMA chain over the tile.
// Tiles start at multiples of 16 positions and masked entries add exact zeros, so a
// query's result does not depend on which other queries share its unit.
//
// Measured (benchmarks/cpu/cache_attention.md): XLA's loop over 64-position blocks took
// 4.3 ms for 30 layers of one token over 256 positions, this 1.9 ms with the merge.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels.h"
#include "parallel.h"
#include "transpose.h"

namespace {

using Problem = lookahead_jax::CacheAttention;

constexpr int64_t kRows = 6;    // queries per register tile
constexpr int64_t kCols = 16;   // positions (scores) or dims (p @ V) per tile
constexpr float kNegInf = -1e30f;  // attention.NEG_INF

// exp(x) for x <= 0 in float32 (Cephes' expf: a degree-6 polynomial on x - n ln 2 times
// 2^n; relative error ~1e-7, as XLA's own exp).
inline __m256 exp256(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  __m256 n = _mm256_floor_ps(
      _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

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

// A tile: NR rows a[r] times W registers of columns of b (row stride ldb) over n terms:
// out[r][j] = sum_i a[r][i] * b[i][j], one FMA chain over i.
template <int NR, int W>
inline void tile(const float* const* a, const float* b, int64_t ldb, int64_t n,
                 __m256 (&out)[NR][2]) {
  __m256 c[NR][W];
  for (int r = 0; r < NR; ++r)
    for (int w = 0; w < W; ++w) c[r][w] = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; ++i) {
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

// One unit: row b, kv head h, queries [r0, r1), one pass over the visible cache in tiles
// of 16 positions (see the top of the file), NR queries at a time (3 for a one-token
// step's group of 3 heads, else 6; a query's arithmetic is the same either way);
// Segments: p.segments (each query's own end; else the row's length, kept in a register).
template <int64_t NR, bool Segments>
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
  float* acc = acc_buf.data();    // [rows, Dh]
  float* kt = kt_buf.data();      // [Dh, 16]: the tile's keys, transposed
  int64_t* lo = lo_buf.data();    // [rows]: each query's first visible position
  int64_t* hi = hi_buf.data();    // [rows]: ... and the one past its last
  alignas(32) float rescale[NR], pt[NR][kCols];  // a tile's: exp(old top - new), p
  const float* q = p.q + (bh * p.R + r0) * Dh;
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
  const int64_t base = first / kCols * kCols;  // tiles start at multiples of 16
  prefetch_rows(keys, Dh, base, std::min(last, base + kAhead), _MM_HINT_T1);
  prefetch_rows(vals, Dh, base, std::min(last, base + kAhead), _MM_HINT_T1);
  for (int64_t s0 = base; s0 < last; s0 += kCols) {
    const int64_t m = std::min(kCols, last - s0);
    const int64_t ahead = std::min(last, s0 + kAhead + kCols);
    prefetch_rows(keys, Dh, s0 + kAhead, ahead, _MM_HINT_T1);
    prefetch_rows(vals, Dh, s0 + kAhead, ahead, _MM_HINT_T1);
    // the tile's m keys [m, Dh] -> kt [Dh, 16], zeros past `last` (nothing read past it)
    lookahead_jax::transpose_group(keys + s0 * Dh, m, Dh, kCols, 0, kt);
    const __m256i at0 = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(s0)),
                                         _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256i at1 = _mm256_add_epi32(at0, _mm256_set1_epi32(8));
    const __m256i row_end = _mm256_set1_epi32(static_cast<int>(len));
    for (int64_t g = 0; g < rows; g += NR) {
      // scores of NR queries x 16 positions
      const float* a[NR];
      for (int64_t r = 0; r < NR; ++r) a[r] = q + std::min(g + r, n - 1) * Dh;
      __m256 sc[NR][2];
      tile<NR, 2>(a, kt, kCols, Dh, sc);
      // online softmax: each query's top so far, its mass rescaled, p = exp(s - top)
      for (int64_t r = 0; r < NR; ++r) {
        const __m256i from = _mm256_set1_epi32(static_cast<int>(lo[g + r]) - 1);
        const __m256i end =
            Segments ? _mm256_set1_epi32(static_cast<int>(hi[g + r])) : row_end;
        const __m256 seen0 = _mm256_castsi256_ps(_mm256_and_si256(
            _mm256_cmpgt_epi32(at0, from), _mm256_cmpgt_epi32(end, at0)));
        const __m256 seen1 = _mm256_castsi256_ps(_mm256_and_si256(
            _mm256_cmpgt_epi32(at1, from), _mm256_cmpgt_epi32(end, at1)));
        const __m256 neg = _mm256_set1_ps(kNegInf), scale = _mm256_set1_ps(p.scale);
        const __m256 x0 = _mm256_blendv_ps(neg, _mm256_mul_ps(sc[r][0], scale), seen0);
        const __m256 x1 = _mm256_blendv_ps(neg, _mm256_mul_ps(sc[r][1], scale), seen1);
        const float old = tops[g + r];
        const float t = std::max(old, _mm256_cvtss_f32(hmax8(_mm256_max_ps(x0, x1))));
        const __m256 tv = _mm256_set1_ps(t);
        const __m256 e0 = _mm256_and_ps(exp256(_mm256_sub_ps(x0, tv)), seen0);
        const __m256 e1 = _mm256_and_ps(exp256(_mm256_sub_ps(x1, tv)), seen1);
        _mm256_store_ps(pt[r], e0);
        _mm256_store_ps(pt[r] + 8, e1);
        rescale[r] = _mm256_cvtss_f32(exp256(_mm256_set1_ps(old - t)));
        tops[g + r] = t;
        masses[g + r] = masses[g + r] * rescale[r] + hsum(_mm256_add_ps(e0, e1));
      }
      // acc = acc * rescale + p @ V, 16 (then 8) dims at a time
      const float* pa[NR];
      for (int64_t r = 0; r < NR; ++r) pa[r] = pt[r];
      for (int64_t d = 0; d < Dh; d += kCols) {
        const bool wide = d + kCols <= Dh;
        __m256 out[NR][2];
        if (wide) {
          tile<NR, 2>(pa, vals + s0 * Dh + d, Dh, m, out);
        } else {
          tile<NR, 1>(pa, vals + s0 * Dh + d, Dh, m, out);
        }
        for (int64_t r = 0; r < NR; ++r) {
          float* o = acc + (g + r) * Dh + d;
          const __m256 rs = _mm256_set1_ps(rescale[r]);
          _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_loadu_ps(o), rs, out[r][0]));
          if (wide) _mm256_storeu_ps(o + 8, _mm256_fmadd_ps(_mm256_loadu_ps(o + 8), rs, out[r][1]));
        }
      }
    }
  }
  float* top_out = p.top + bh * p.R + r0;
  float* mass_out = p.mass + bh * p.R + r0;
  std::copy(tops.begin(), tops.begin() + n, top_out);
  std::copy(masses.begin(), masses.begin() + n, mass_out);
  std::copy(acc, acc + n * Dh, p.acc + (bh * p.R + r0) * Dh);
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
  lookahead_jax::parallel_for(pool, heads * per_head, [p, chunk, per_head](int64_t u) {
    const int64_t bh = u / per_head, r0 = u % per_head * chunk;
    const int64_t r1 = std::min(p.R, r0 + chunk);
    if (p.segments) {
      unit<kRows, true>(p, bh / p.H, bh % p.H, r0, r1);
    } else if (r1 - r0 > 3) {
      unit<kRows, false>(p, bh / p.H, bh % p.H, r0, r1);
    } else if (r0 < r1) {
      unit<3, false>(p, bh / p.H, bh % p.H, r0, r1);
    }
  });
}

}  // namespace lookahead_jax
