// The kernels' entry points (small_m.cc, cache_attention.cc, row_argmax.cc,
// row_logsumexp.cc, threefry_bits.cc), called by their XLA FFI handlers in
// ffi_bindings.cc once the buffers' shapes are checked there.
#ifndef LOOKAHEAD_JAX_CPU_KERNEL_KERNELS_H_
#define LOOKAHEAD_JAX_CPU_KERNEL_KERNELS_H_

#include <cstdint>

#include "parallel.h"

namespace lookahead_jax {

constexpr int64_t kPanelColumns = 16;  // output columns per panel of W (small_m.cc)

// Whether the kernels take their AVX-512 paths: the CPU has AVX-512F and
// LOOKAHEAD_JAX_CPU_KERNEL is not "avx2" (which keeps the AVX2 paths, to compare the two
// on one machine: they give the same bits). Decided once a process (small_m.cc).
bool has_avx512();
// ... from this many rows of x (small_m.cc: where the AVX2 tile's 6 rows do not hold them)
// or tokens of a call (B x T, cache_attention.cc); at most kWideRows rows go through the
// AVX-512 matmul tile at once
constexpr int64_t kWideMatmulRows = 7;
constexpr int64_t kWideRows = 12;

// y[M, P * 16] = x[M, K] @ W, W in panels [P, K, 16] (small_m.cc); int8 panels have a
// float32 scale per output column.
void small_m_f32(Workers& pool, const float* x, int64_t M, int64_t K, const float* panels,
                 int64_t P, float* y);
void small_m_int8(Workers& pool, const float* x, int64_t M, int64_t K, const int8_t* panels,
                  const float* scale, int64_t P, float* y);

// The attention of R queries per row and kv head over each row's cache (shapes and
// results: cache_attention.cc).
struct CacheAttention {
  const float *q, *k, *v;
  const int32_t *lengths, *positions;
  float *top, *mass, *acc;
  int64_t B, H, R, S, Dh, T;  // H: kv heads
  int64_t window;
  float scale;
  bool segments = false;  // positions hold each token's row's first token (the .cc's top)
};
void cache_attention_f32(Workers& pool, const CacheAttention& p);

// out[m] = jnp.argmax(x[m]) for x [M, N], N >= 1 (row_argmax.cc).
void first_max_index_f32(Workers& pool, const float* x, int64_t M, int64_t N, int32_t* out);

// out[m] = jax.nn.logsumexp(x[m]) for x [M, N], N >= 1 (row_logsumexp.cc).
void logsumexp_f32(Workers& pool, const float* x, int64_t M, int64_t N, float* out);

// out[m, :] = jax.random.bits(keys[m], (N,), uint32) for raw threefry keys [M, 2]
// (threefry_bits.cc).
void threefry_bits_u32(Workers& pool, const uint32_t* keys, int64_t M, int64_t N,
                       uint32_t* out);

}  // namespace lookahead_jax

#endif  // LOOKAHEAD_JAX_CPU_KERNEL_KERNELS_H_
