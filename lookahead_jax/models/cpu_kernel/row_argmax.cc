// out[m] = the first index of the largest value of row m of x [M, N] (jnp.argmax over the
// last axis: a NaN counts as the largest, so the first NaN wins), in one pass over x.
//
// Why a kernel: XLA:CPU runs the decode's argmax over the logits as two reductions (the
// max, then the smallest index holding it; sampling.first_max_index says why not one):
// over a 16-row step's [16, 49152] logits 1.5-1.8 ms, ~3 % of the step, where this pass
// takes 0.13-0.25 ms (benchmarks/cpu/row_argmax_xeon_167_s90.md).
//
// Exact by construction: every lane keeps the first index of its largest value (a strict
// `>`, or a NaN where its best is not one), and lanes and the tail are merged by one total
// order: a NaN above every number, then the larger value, then the smaller index (-0 and
// +0 are equal, as in `x == max`). The result is the largest element in that order,
// whatever order the elements are met in: numpy's argmax, and jnp.argmax's on XLA:CPU
// (jaxlib 0.10.2: its reducer keeps a NaN it holds, so the first NaN wins there too).
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "kernels.h"
#include "parallel.h"

namespace {

// Whether (v, i) comes before (best, best_i) in the merge's order.
inline bool before(float v, int64_t i, float best, int64_t best_i) {
  const bool v_nan = std::isnan(v), best_nan = std::isnan(best);
  if (v_nan || best_nan) return v_nan && (!best_nan || i < best_i);
  return v > best || (v == best && i < best_i);
}

// Vector lanes: kChains x 8 (four independent compare-and-blend chains, so that a k's
// compare does not wait for the last one's blend: one chain ran at ~10 GB/s a thread).
constexpr int kChains = 4;
constexpr int64_t kBlock = 8 * kChains;  // elements a loop iteration

// N >= 1
int32_t row_first_max(const float* x, int64_t N) {
  float best = x[0];
  int64_t best_i = 0, i = 1;
  if (N >= 2 * kBlock) {
    __m256 values[kChains];
    __m256i index[kChains];
    const __m256i step = _mm256_set1_epi32(kBlock);
    __m256i at[kChains];
    for (int c = 0; c < kChains; ++c) {
      values[c] = _mm256_loadu_ps(x + 8 * c);
      index[c] = at[c] = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                          _mm256_set1_epi32(8 * c));
    }
    for (i = kBlock; i + kBlock <= N; i += kBlock) {
      for (int c = 0; c < kChains; ++c) {
        at[c] = _mm256_add_epi32(at[c], step);
        const __m256 v = _mm256_loadu_ps(x + i + 8 * c);
        // take v where it is larger, or a NaN where the lane's best is not one
        const __m256 v_nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
        const __m256 best_nan = _mm256_cmp_ps(values[c], values[c], _CMP_UNORD_Q);
        const __m256 take = _mm256_or_ps(_mm256_cmp_ps(v, values[c], _CMP_GT_OQ),
                                         _mm256_andnot_ps(best_nan, v_nan));
        values[c] = _mm256_blendv_ps(values[c], v, take);
        index[c] = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(index[c]),
                                                        _mm256_castsi256_ps(at[c]), take));
      }
    }
    alignas(32) float lane_value[kBlock];
    alignas(32) int32_t lane_index[kBlock];
    for (int c = 0; c < kChains; ++c) {
      _mm256_store_ps(lane_value + 8 * c, values[c]);
      _mm256_store_si256(reinterpret_cast<__m256i*>(lane_index + 8 * c), index[c]);
    }
    best = lane_value[0], best_i = lane_index[0];
    for (int l = 1; l < kBlock; ++l) {
      if (before(lane_value[l], lane_index[l], best, best_i)) {
        best = lane_value[l], best_i = lane_index[l];
      }
    }
  }
  for (; i < N; ++i) {
    if (before(x[i], i, best, best_i)) best = x[i], best_i = i;
  }
  return static_cast<int32_t>(best_i);
}

}  // namespace

namespace lookahead_jax {

void first_max_index_f32(Workers& pool, const float* x, int64_t M, int64_t N, int32_t* out) {
  // a row a work item (a row of logits: ~0.2 MB, ~20-40 us), both threads from two rows
  parallel_for(pool, M, [=](int64_t m) { out[m] = row_first_max(x + m * N, N); });
}

}  // namespace lookahead_jax
