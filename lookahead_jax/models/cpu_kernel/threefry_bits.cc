// bits[m, i] = jax.random.bits(key[m], (N,), uint32)[i] for keys [M, 2] (raw uint32
// threefry2x32 keys, jax_threefry_partitionable on, JAX's default): the two words of
// Threefry-2x32 (20 rounds, Random123's; jax/_src/random/threefry2x32.py) of the counter
// (0, i) under the key, xor-ed.
//
// Why a kernel: a sampling row's token is the argmax of its logits plus Gumbel noise over
// the whole vocabulary (sampling.gumbel_noise), and XLA:CPU lowers the hash as a loop of
// 5 iterations over arrays of every counter: 4.4 ms for a 16-row step's [16, 49152] bits
// (Intel Xeon model 207; ~7 % of that sampling step), where this takes 0.6 ms. Integer
// operations only: the same bits as JAX's by construction (AVX-512 and AVX2 paths alike;
// tests/test_cpu_kernel.py checks against jax.random.bits).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels.h"
#include "parallel.h"

namespace {

constexpr int kRot[2][4] = {{13, 15, 26, 6}, {17, 29, 16, 24}};
constexpr int64_t kChunk = 8192;  // counters a work item

inline uint32_t rotl(uint32_t x, int d) { return (x << d) | (x >> (32 - d)); }

// One counter (0, i): the scalar reference the vector paths follow step by step.
inline uint32_t hash1(const uint32_t ks[3], uint32_t i) {
  uint32_t x0 = ks[0], x1 = i + ks[1];
  for (int g = 0; g < 5; ++g) {
    for (int r = 0; r < 4; ++r) {
      x0 += x1;
      x1 = rotl(x1, kRot[g % 2][r]) ^ x0;
    }
    x0 += ks[(g + 1) % 3];
    x1 += ks[(g + 2) % 3] + static_cast<uint32_t>(g + 1);
  }
  return x0 ^ x1;
}

template <int D>
inline __m256i rotl256(__m256i x) {
  return _mm256_or_si256(_mm256_slli_epi32(x, D), _mm256_srli_epi32(x, 32 - D));
}

#define LJ_ROUNDS(ROT, ADD, XOR)                                            \
  for (int g = 0; g < 5; ++g) {                                             \
    if (g % 2 == 0) {                                                       \
      x0 = ADD(x0, x1), x1 = XOR(ROT<13>(x1), x0);                          \
      x0 = ADD(x0, x1), x1 = XOR(ROT<15>(x1), x0);                          \
      x0 = ADD(x0, x1), x1 = XOR(ROT<26>(x1), x0);                          \
      x0 = ADD(x0, x1), x1 = XOR(ROT<6>(x1), x0);                           \
    } else {                                                                \
      x0 = ADD(x0, x1), x1 = XOR(ROT<17>(x1), x0);                          \
      x0 = ADD(x0, x1), x1 = XOR(ROT<29>(x1), x0);                          \
      x0 = ADD(x0, x1), x1 = XOR(ROT<16>(x1), x0);                          \
      x0 = ADD(x0, x1), x1 = XOR(ROT<24>(x1), x0);                          \
    }                                                                       \
    x0 = ADD(x0, k[(g + 1) % 3]);                                           \
    x1 = ADD(x1, inject[g]);                                                \
  }

// counters [i0, i0 + n), n a multiple of 8
void hash256(const uint32_t ks[3], uint32_t i0, int64_t n, uint32_t* out) {
  const __m256i k[3] = {_mm256_set1_epi32(static_cast<int>(ks[0])),
                        _mm256_set1_epi32(static_cast<int>(ks[1])),
                        _mm256_set1_epi32(static_cast<int>(ks[2]))};
  __m256i inject[5];
  for (int g = 0; g < 5; ++g) {
    inject[g] = _mm256_set1_epi32(static_cast<int>(ks[(g + 2) % 3] + static_cast<uint32_t>(g + 1)));
  }
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t j = 0; j < n; j += 8) {
    __m256i x0 = k[0];
    const uint32_t at = i0 + static_cast<uint32_t>(j);  // (as an int: GCC wraps it)
    const __m256i counter = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(at)), lanes);
    __m256i x1 = _mm256_add_epi32(counter, k[1]);
    LJ_ROUNDS(rotl256, _mm256_add_epi32, _mm256_xor_si256)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j), _mm256_xor_si256(x0, x1));
  }
}

template <int D>
__attribute__((target("avx512f"))) inline __m512i rotl512(__m512i x) {
  return _mm512_rol_epi32(x, D);
}

// counters [i0, i0 + n), n a multiple of 16
__attribute__((target("avx512f"))) void hash512(const uint32_t ks[3], uint32_t i0, int64_t n,
                                                uint32_t* out) {
  const __m512i k[3] = {_mm512_set1_epi32(static_cast<int>(ks[0])),
                        _mm512_set1_epi32(static_cast<int>(ks[1])),
                        _mm512_set1_epi32(static_cast<int>(ks[2]))};
  __m512i inject[5];
  for (int g = 0; g < 5; ++g) {
    inject[g] = _mm512_set1_epi32(static_cast<int>(ks[(g + 2) % 3] + static_cast<uint32_t>(g + 1)));
  }
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int64_t j = 0; j < n; j += 16) {
    __m512i x0 = k[0];
    const uint32_t at = i0 + static_cast<uint32_t>(j);  // (as an int: GCC wraps it)
    const __m512i counter = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(at)), lanes);
    __m512i x1 = _mm512_add_epi32(counter, k[1]);
    LJ_ROUNDS(rotl512, _mm512_add_epi32, _mm512_xor_si512)
    _mm512_storeu_si512(out + j, _mm512_xor_si512(x0, x1));
  }
}

#undef LJ_ROUNDS

}  // namespace

namespace lookahead_jax {

void threefry_bits_u32(Workers& pool, const uint32_t* keys, int64_t M, int64_t N,
                       uint32_t* out) {
  const bool wide = has_avx512();
  const int64_t chunks = (N + kChunk - 1) / kChunk;
  // a work item: a key's run of up to 8192 counters (~20-40 us)
  parallel_for(pool, M * chunks, [=](int64_t item) {
    const int64_t m = item / chunks, i0 = (item % chunks) * kChunk;
    const int64_t n = std::min(kChunk, N - i0);
    const uint32_t ks[3] = {keys[2 * m], keys[2 * m + 1],
                            keys[2 * m] ^ keys[2 * m + 1] ^ 0x1BD11BDAu};
    uint32_t* row = out + m * N + i0;
    const int64_t lanes = wide ? 16 : 8, body = n - n % lanes;
    if (wide) {
      hash512(ks, static_cast<uint32_t>(i0), body, row);
    } else {
      hash256(ks, static_cast<uint32_t>(i0), body, row);
    }
    for (int64_t j = body; j < n; ++j) row[j] = hash1(ks, static_cast<uint32_t>(i0 + j));
  });
}

}  // namespace lookahead_jax
