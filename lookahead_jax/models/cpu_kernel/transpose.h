// Transposes in AVX registers, shared by the kernels: a group of a matrix's rows, 8 x 8
// blocks at a time (cache_attention.cc's tiles of keys, small_m.cc's x for its AVX-512
// tile).
#ifndef LOOKAHEAD_JAX_CPU_KERNEL_TRANSPOSE_H_
#define LOOKAHEAD_JAX_CPU_KERNEL_TRANSPOSE_H_

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace lookahead_jax {

// 8 rows of 8 floats, transposed in registers (r[i] lane j <- r[j] lane i).
inline void transpose8(__m256 (&r)[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

// Group g of x [M, K]'s rows (rows g * size .. , at most `size` of them) transposed into
// out [K, size]: out[k * size + r] = x[g * size + r, k]. Slots of rows past M hold zeros.
// Eight rows and eight k's a block (loads of 8 contiguous floats, 8 x 8 transposes,
// stores of 8 contiguous slots, masked where a group has fewer left), where one float
// at a time (strided stores) was 5.9 % of the samples of a [1280, 576] x [576, 1536]
// matmul under perf, on one thread while the other waited (AMD EPYC Zen 4).
// Worked example: M = 16, K = 576: two groups of size 8; group 1 is x's rows 8..15, and
// its block at k = 8 loads x[8..15, 8..15] and stores out[8..15][0..7], unmasked.
// M = 25: three groups of size 9 (rows 0-8, 9-17, 18-24); group 2 has 7 rows, so its
// block c = 0 loads rows 18..24 and a zero row (have = 7) into 8 slots, and its block
// c = 8 loads no row (have = 0) and stores one slot (slots = 1, lane 0, masked): zeros.
inline void transpose_group(const float* x, int64_t M, int64_t K, int64_t size, int64_t g,
                            float* out) {
  const int64_t m0 = g * size, rows = std::max<int64_t>(0, std::min(size, M - m0));
  for (int64_t c = 0; c < size; c += 8) {
    const int64_t have = std::clamp<int64_t>(rows - c, 0, 8);  // rows of x in this block
    const int64_t slots = std::min<int64_t>(8, size - c);
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(slots)), lanes);
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) {
        r[i] = i < have ? _mm256_loadu_ps(x + (m0 + c + i) * K + k) : _mm256_setzero_ps();
      }
      transpose8(r);  // r[j] lane i = x[m0 + c + i, k + j]
      for (int j = 0; j < 8; ++j) {
        float* at = out + (k + j) * size + c;
        if (slots == 8) {
          _mm256_storeu_ps(at, r[j]);
        } else {
          _mm256_maskstore_ps(at, mask, r[j]);
        }
      }
    }
    for (; k < K; ++k) {  // (K not a multiple of 8)
      for (int64_t i = 0; i < slots; ++i) {
        out[k * size + c + i] = i < have ? x[(m0 + c + i) * K + k] : 0.0f;
      }
    }
  }
}

}  // namespace lookahead_jax

#endif  // LOOKAHEAD_JAX_CPU_KERNEL_TRANSPOSE_H_
