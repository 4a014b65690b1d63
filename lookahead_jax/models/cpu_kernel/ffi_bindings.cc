// The kernels' XLA FFI handlers: each checks its buffers' shapes and calls its kernel
// (kernels.h) with XLA's intra-op thread pool. The only file that includes XLA's FFI
// header, built at -O1 (it runs once a call; the header takes most of its build time)
// beside the kernels at -O3 (cpu_kernel/__init__.py).
#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "kernels.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using lookahead_jax::kPanelColumns;

class FfiWorkers final : public lookahead_jax::Workers {
 public:
  explicit FfiWorkers(ffi::ThreadPool& pool) : pool_(pool) {}
  int64_t num_threads() const override { return pool_.num_threads(); }
  void Schedule(std::function<void()> task) override { pool_.Schedule(std::move(task)); }

 private:
  ffi::ThreadPool& pool_;
};

// M, K, P of y[M, P * 16] = x[..., K] @ panels[P, K, 16], or an error.
template <ffi::DataType T>
ffi::Error SmallMShape(const ffi::Buffer<ffi::F32>& x, const ffi::Buffer<T>& panels,
                       ffi::ResultBuffer<ffi::F32>& y, int64_t& M, int64_t& K,
                       int64_t& P) {
  const auto wd = panels.dimensions();
  if (wd.size() != 3 || wd[2] != kPanelColumns) {
    return ffi::Error::InvalidArgument("panels must be [P, K, 16]");
  }
  const auto xd = x.dimensions();
  K = xd.size() ? xd.back() : 0;
  if (K != wd[1]) return ffi::Error::InvalidArgument("x's last axis is not the panels' K");
  M = K ? x.element_count() / K : 0;
  P = wd[0];
  if (static_cast<int64_t>(y->element_count()) != M * P * kPanelColumns) {
    return ffi::Error::InvalidArgument("y must hold M x P * 16 values");
  }
  return ffi::Error::Success();
}

ffi::Error SmallMF32(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                     ffi::Buffer<ffi::F32> panels, ffi::ResultBuffer<ffi::F32> y) {
  int64_t M, K, P;
  if (ffi::Error e = SmallMShape(x, panels, y, M, K, P); e.failure()) return e;
  FfiWorkers workers(pool);
  lookahead_jax::small_m_f32(workers, x.typed_data(), M, K, panels.typed_data(), P,
                             y->typed_data());
  return ffi::Error::Success();
}

ffi::Error SmallMInt8(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                      ffi::Buffer<ffi::S8> panels, ffi::Buffer<ffi::F32> scale,
                      ffi::ResultBuffer<ffi::F32> y) {
  int64_t M, K, P;
  if (ffi::Error e = SmallMShape(x, panels, y, M, K, P); e.failure()) return e;
  if (static_cast<int64_t>(scale.element_count()) != P * kPanelColumns) {
    return ffi::Error::InvalidArgument("scale must hold P * 16 values");
  }
  FfiWorkers workers(pool);
  lookahead_jax::small_m_int8(workers, x.typed_data(), M, K, panels.typed_data(),
                              scale.typed_data(), P, y->typed_data());
  return ffi::Error::Success();
}

ffi::Error CacheAttentionF32(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q,
                             ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                             ffi::Buffer<ffi::S32> lengths, ffi::Buffer<ffi::S32> positions,
                             int64_t window, float scale, int64_t segments,
                             ffi::ResultBuffer<ffi::F32> top,
                             ffi::ResultBuffer<ffi::F32> mass, ffi::ResultBuffer<ffi::F32> acc) {
  const auto qd = q.dimensions(), kd = k.dimensions(), pd = positions.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || pd.size() != 2) {
    return ffi::Error::InvalidArgument("q, k, v must be [B, K, R|S, Dh], positions [B, T]");
  }
  lookahead_jax::CacheAttention p;
  p.B = qd[0], p.H = qd[1], p.R = qd[2], p.Dh = qd[3], p.S = kd[2], p.T = pd[1];
  const auto vd = v.dimensions();
  if (kd[0] != p.B || kd[1] != p.H || kd[3] != p.Dh || vd.size() != 4 ||
      !std::equal(vd.begin(), vd.end(), kd.begin()) ||
      static_cast<int64_t>(lengths.element_count()) != p.B || pd[0] != p.B || p.T == 0 ||
      p.R % p.T != 0 || p.Dh % 8 != 0 || (segments != 0 && p.S != p.T)) {
    return ffi::Error::InvalidArgument("cache attention: mismatched shapes");
  }
  p.q = q.typed_data(), p.k = k.typed_data(), p.v = v.typed_data();
  p.lengths = lengths.typed_data(), p.positions = positions.typed_data();
  p.top = top->typed_data(), p.mass = mass->typed_data(), p.acc = acc->typed_data();
  p.window = window, p.scale = scale, p.segments = segments != 0;
  FfiWorkers workers(pool);
  lookahead_jax::cache_attention_f32(workers, p);
  return ffi::Error::Success();
}

// M rows of N of x [..., N] (1 <= N <= max_n) for one result a row in `out` (out_count
// values), or an error naming the reduction.
ffi::Error RowsShape(const ffi::Buffer<ffi::F32>& x, int64_t out_count, const std::string& what,
                     int64_t max_n, int64_t& M, int64_t& N) {
  const auto xd = x.dimensions();
  N = xd.size() ? xd.back() : 0;
  if (N == 0) return ffi::Error::InvalidArgument(what + " over an empty last axis");
  if (N > max_n) return ffi::Error::InvalidArgument(what + ": rows past its index type");
  M = x.element_count() / N;
  if (out_count != M) return ffi::Error::InvalidArgument(what + ": out must hold one value a row");
  return ffi::Error::Success();
}

ffi::Error FirstMaxF32(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                       ffi::ResultBuffer<ffi::S32> out) {
  int64_t M, N;
  const int64_t count = static_cast<int64_t>(out->element_count());
  if (ffi::Error e = RowsShape(x, count, "argmax", INT32_MAX, M, N); e.failure()) return e;
  FfiWorkers workers(pool);
  lookahead_jax::first_max_index_f32(workers, x.typed_data(), M, N, out->typed_data());
  return ffi::Error::Success();
}

ffi::Error LogSumExpF32(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                        ffi::ResultBuffer<ffi::F32> out) {
  int64_t M, N;
  const int64_t count = static_cast<int64_t>(out->element_count());
  if (ffi::Error e = RowsShape(x, count, "logsumexp", INT64_MAX, M, N); e.failure()) return e;
  FfiWorkers workers(pool);
  lookahead_jax::logsumexp_f32(workers, x.typed_data(), M, N, out->typed_data());
  return ffi::Error::Success();
}

ffi::Error ThreefryBitsU32(ffi::ThreadPool pool, ffi::Buffer<ffi::U32> keys,
                           ffi::ResultBuffer<ffi::U32> out) {
  const auto kd = keys.dimensions(), od = out->dimensions();
  if (kd.size() == 0 || kd.back() != 2 || od.size() != kd.size() ||
      !std::equal(kd.begin(), kd.end() - 1, od.begin())) {
    return ffi::Error::InvalidArgument("threefry bits: keys [..., 2], out [..., N]");
  }
  const int64_t M = keys.element_count() / 2, N = od.back();
  if (N > UINT32_MAX) return ffi::Error::InvalidArgument("threefry bits: N past 2^32");
  FfiWorkers workers(pool);
  lookahead_jax::threefry_bits_u32(workers, keys.typed_data(), M, N, out->typed_data());
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(LjSmallMF32, SmallMF32,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(LjSmallMInt8, SmallMInt8,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S8>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(LjCacheAttentionF32, CacheAttentionF32,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Attr<int64_t>("window")
                                  .Attr<float>("scale")
                                  .Attr<int64_t>("segments")
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(LjFirstMaxF32, FirstMaxF32,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(LjLogSumExpF32, LogSumExpF32,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(LjThreefryBitsU32, ThreefryBitsU32,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::U32>>()
                                  .Ret<ffi::Buffer<ffi::U32>>());
