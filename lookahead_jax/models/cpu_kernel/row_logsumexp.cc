// out[m] = log(sum_n exp(x[m, n])) for x [M, N] (jax.nn.logsumexp over the last axis): the
// row's max in one pass, then the sum of exp(x - max) in a second (the row, 0.2 MB of
// logits, still in L2), out = max + log(sum).
//
// Why a kernel: token recycling turns its top-k logits into probabilities
// (token_recycling.update) with the logsumexp of every logits row a step computes; XLA:CPU
// runs its reduce of exp over a 16-token step's [15, 49152] logits as a YNNPACK fusion
// (with its max, 2.0 ms of a profiled step on the Intel Xeon model 207; 3.2 ms on another
// VM), where these two passes take 0.26 ms (benchmarks/cpu/row_logsumexp_xeon_207_s92.md).
//
// The same rows as jax.nn.logsumexp: any NaN -> NaN; a +inf (and no NaN) -> +inf; every
// value -inf -> -inf; else max + log(sum), within ~1e-6 relative (the exp's error, and a
// sum in another order). The AVX-512 path gives the AVX2 path's bits: element n goes to
// partial sum n % 16 in both (two 8-lane registers or one of 16), the tail's exps from a
// padded 16-lane block whose padding is not summed, and the 16 partial sums are added
// in one order.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels.h"
#include "parallel.h"
#include "vector_exp.h"

namespace {

using lookahead_jax::exp256;
using lookahead_jax::exp512;

constexpr int64_t kLanes = 16;  // partial sums a row

// The row's max and whether it holds a NaN (max_ps keeps its second operand where either
// is a NaN: a NaN never enters `top`, so it is looked for on its own).
float row_max(const float* x, int64_t N, bool& nan) {
  __m256 top[4], bad = _mm256_setzero_ps();
  for (__m256& t : top) t = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + 32 <= N; i += 32) {  // four chains: a max does not wait on the last one
    for (int c = 0; c < 4; ++c) {
      const __m256 v = _mm256_loadu_ps(x + i + 8 * c);
      top[c] = _mm256_max_ps(v, top[c]);
      bad = _mm256_or_ps(bad, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_max_ps(_mm256_max_ps(top[0], top[1]),
                                       _mm256_max_ps(top[2], top[3])));
  nan = _mm256_movemask_ps(bad) != 0;
  float best = lanes[0];
  for (int l = 1; l < 8; ++l) best = std::fmax(best, lanes[l]);
  for (; i < N; ++i) {
    nan |= std::isnan(x[i]);
    best = std::fmax(best, x[i]);
  }
  return best;
}

// The row's tail x[n0 .. N) (n0 = N - N % 16) as one 16-element block, padded with -inf
// (its exps are not summed: the partial sums take those of n < N only).
inline void padded_tail(const float* x, int64_t n0, int64_t N, float (&tail)[kLanes]) {
  for (int64_t l = 0; l < kLanes; ++l) {
    tail[l] = n0 + l < N ? x[n0 + l] : -std::numeric_limits<float>::infinity();
  }
}

// The 16 partial sums of exp(x[n] - top), element n into sum n % 16: the row's whole
// 16-element blocks, then its padded tail.
void partial_sums256(const float* x, int64_t N, float top, float (&sums)[kLanes]) {
  const __m256 t = _mm256_set1_ps(top);
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  const int64_t n0 = N - N % kLanes;
  for (int64_t i = 0; i < n0; i += kLanes) {
    lo = _mm256_add_ps(lo, exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), t)));
    hi = _mm256_add_ps(hi, exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), t)));
  }
  _mm256_storeu_ps(sums, lo);
  _mm256_storeu_ps(sums + 8, hi);
  if (n0 == N) return;
  alignas(32) float tail[kLanes], e[kLanes];  // each exp into the partial sum of its n % 16
  padded_tail(x, n0, N, tail);
  _mm256_store_ps(e, exp256(_mm256_sub_ps(_mm256_load_ps(tail), t)));
  _mm256_store_ps(e + 8, exp256(_mm256_sub_ps(_mm256_load_ps(tail + 8), t)));
  for (int64_t l = 0; n0 + l < N; ++l) sums[l] += e[l];
}

__attribute__((target("avx512f"))) void partial_sums512(const float* x, int64_t N, float top,
                                                        float (&sums)[kLanes]) {
  const __m512 t = _mm512_set1_ps(top);
  __m512 s = _mm512_setzero_ps();
  const int64_t n0 = N - N % kLanes;
  for (int64_t i = 0; i < n0; i += kLanes) {
    s = _mm512_add_ps(s, exp512(_mm512_sub_ps(_mm512_loadu_ps(x + i), t)));
  }
  _mm512_storeu_ps(sums, s);
  if (n0 == N) return;
  alignas(64) float tail[kLanes], e[kLanes];
  padded_tail(x, n0, N, tail);
  _mm512_store_ps(e, exp512(_mm512_sub_ps(_mm512_load_ps(tail), t)));
  for (int64_t l = 0; n0 + l < N; ++l) sums[l] += e[l];
}

float row_logsumexp(const float* x, int64_t N, bool wide) {
  bool nan = false;
  const float top = row_max(x, N, nan);
  if (nan) return std::numeric_limits<float>::quiet_NaN();
  if (std::isinf(top)) return top;  // +inf: one is; -inf: all are (the sum is 0)
  float sums[kLanes];
  if (wide) {
    partial_sums512(x, N, top, sums);
  } else {
    partial_sums256(x, N, top, sums);
  }
  float sum = 0.0f;  // >= 1: the max's exp(0) is exactly 1
  for (float s : sums) sum += s;
  return top + std::log(sum);
}

}  // namespace

namespace lookahead_jax {

void logsumexp_f32(Workers& pool, const float* x, int64_t M, int64_t N, float* out) {
  const bool wide = has_avx512();
  // a row a work item (a row of logits: ~0.2 MB, ~10-20 us), both threads from two rows
  parallel_for(pool, M, [=](int64_t m) { out[m] = row_logsumexp(x + m * N, N, wide); });
}

}  // namespace lookahead_jax
