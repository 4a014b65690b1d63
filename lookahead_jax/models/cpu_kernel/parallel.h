// Work items 0 .. n-1 shared out between XLA's intra-op threads: handed out by an atomic
// counter, the calling thread and the tasks it schedules take items until none are left,
// and the caller then waits only for the items still being computed (a task that starts
// late finds nothing left to do; the shared state outlives it). Used by every kernel.
//
// The kernels see XLA's thread pool through `Workers` (ffi_bindings.cc adapts it), so
// that they compile without XLA's FFI header: that header alone took ~4 s of each
// kernel's 7 s build at -O3, on the first run's critical path.
#ifndef LOOKAHEAD_JAX_CPU_KERNEL_PARALLEL_H_
#define LOOKAHEAD_JAX_CPU_KERNEL_PARALLEL_H_

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>

namespace lookahead_jax {

// The threads a kernel may use: this one and `num_threads()` - 1 more, by Schedule.
class Workers {
 public:
  virtual ~Workers() = default;
  virtual int64_t num_threads() const = 0;
  virtual void Schedule(std::function<void()> task) = 0;
};

// Runs item(i) for every i in [0, n) on the pool's threads and this one; `item` is
// copied into the shared state.
template <typename Item>
void parallel_for(Workers& pool, int64_t n, Item item) {
  if (n <= 0) return;
  struct Shared {
    Item item;
    int64_t n;
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
    Shared(Item f, int64_t count) : item(std::move(f)), n(count) {}
    void work() {
      for (;;) {
        const int64_t i = next.fetch_add(1, std::memory_order_relaxed);
        if (i >= n) return;
        item(i);
        done.fetch_add(1, std::memory_order_release);
      }
    }
  };
  auto shared = std::make_shared<Shared>(std::move(item), n);
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  for (int64_t t = 1; t < threads && t < n; ++t) pool.Schedule([shared] { shared->work(); });
  shared->work();
  while (shared->done.load(std::memory_order_acquire) < n) _mm_pause();
}

}  // namespace lookahead_jax

#endif  // LOOKAHEAD_JAX_CPU_KERNEL_PARALLEL_H_
