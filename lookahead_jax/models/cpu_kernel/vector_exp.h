// exp(x) for x <= 0 on 8 (AVX2) or 16 (AVX-512) float32 lanes: Cephes' expf, a degree-6
// polynomial on x - n ln 2 times 2^n, relative error ~1e-7 (as XLA's own exp). exp512 does
// exp256's operations lane by lane, so the two give the same bits. x is clamped to
// kExpMin first: a NaN lane becomes exp(-87), a lane at -inf exp(-87) ~ 1.6e-38, not 0
// (callers mask or detect them). Shared by cache_attention.cc and row_logsumexp.cc.
#ifndef LOOKAHEAD_JAX_CPU_KERNEL_VECTOR_EXP_H_
#define LOOKAHEAD_JAX_CPU_KERNEL_VECTOR_EXP_H_

#include <immintrin.h>

#include <cstddef>
#include <iterator>

namespace lookahead_jax {

// The lower bound, log2(e), ln 2 in two parts (high, low), and the polynomial's
// coefficients, the highest power's first.
constexpr float kExpMin = -87.0f, kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kExpPoly[] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                              4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

inline __m256 exp256(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(kExpMin));
  __m256 n = _mm256_floor_ps(
      _mm256_fmadd_ps(x, _mm256_set1_ps(kLog2e), _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), x);
  __m256 y = _mm256_set1_ps(kExpPoly[0]);
  for (size_t i = 1; i < std::size(kExpPoly); ++i)
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(kExpPoly[i]));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

__attribute__((target("avx512f"))) inline __m512 exp512(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(kExpMin));
  __m512 n = _mm512_roundscale_ps(
      _mm512_fmadd_ps(x, _mm512_set1_ps(kLog2e), _mm512_set1_ps(0.5f)),
      _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  x = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  x = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), x);
  __m512 y = _mm512_set1_ps(kExpPoly[0]);
  for (size_t i = 1; i < std::size(kExpPoly); ++i)
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(kExpPoly[i]));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
  const __m512i e = _mm512_slli_epi32(
      _mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}

}  // namespace lookahead_jax

#endif  // LOOKAHEAD_JAX_CPU_KERNEL_VECTOR_EXP_H_
