// A decode step allocates nothing (GPU-ENGINE.md §1; issue 12): after AllocateCache and a warm-up step, Forward of
// decode steps performs zero heap allocations (this binary replaces global operator new with a counting one) and
// touches the same workspace addresses every step, so the step is capturable as a CUDA graph. A prefill chunk
// and a mixed step are checked too: they reuse the planned workspace as well.
#include <atomic>
#include <cstdlib>
#include <new>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/model/model_fixture.h"
#include "tools/generate/runner.h"

namespace {
std::atomic<int64_t> g_allocations{0};
}  // namespace

void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void* operator new(std::size_t n, std::align_val_t a) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  const std::size_t al = static_cast<std::size_t>(a);
  if (void* p = std::aligned_alloc(al, (n + al - 1) / al * al)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t a) { return operator new(n, a); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace dsv4::model::testing {
namespace {

TEST(NoAllocTest, DecodeStepsAllocateNothingAfterWarmUp) {
  for (NumericMode mode : {NumericMode::kExact, NumericMode::kProduction}) {
    Dsv4Model& m = TinyModel(mode);
    const int64_t V = m.config().vocab_size;
    const int kSeqs = 4;
    auto plan = generate::AllocateSequences(m, kSeqs, 400);
    ASSERT_TRUE(plan.ok()) << plan.status();
    // Prefill every sequence to a different length (past the window and a ratio-128 row for the longest).
    std::vector<std::vector<int32_t>> toks;
    std::vector<int32_t> pos(kSeqs);
    std::vector<float> logits(kSeqs * V);
    for (int s = 0; s < kSeqs; ++s) {
      toks.push_back(RandomTokens(390, 50 + s, static_cast<int>(V)));
      pos[s] = 130 + 40 * s;
      const SeqChunk c{.tables = &plan->tables[s], .tokens = std::span(toks[s]).subspan(0, pos[s]), .start_pos = 0};
      ASSERT_TRUE(m.Forward({&c, 1}, logits.data()).ok());
    }
    std::vector<SeqChunk> chunks(kSeqs);
    auto decode_step = [&] {
      for (int s = 0; s < kSeqs; ++s) {
        chunks[s] = {.tables = &plan->tables[s], .tokens = std::span(toks[s]).subspan(pos[s], 1), .start_pos = pos[s]};
        ++pos[s];
      }
      return m.Forward(chunks, logits.data());
    };
    ASSERT_TRUE(decode_step().ok());  // warm-up
    const int64_t before = g_allocations.load();
    for (int step = 0; step < 20; ++step) ASSERT_TRUE(decode_step().ok());
    const int64_t decode_allocs = g_allocations.load() - before;
    // A mixed step: one sequence prefills a 7-token chunk while the others decode.
    const int64_t before_mixed = g_allocations.load();
    for (int s = 0; s < kSeqs; ++s) {
      const int n = s == 0 ? 7 : 1;
      chunks[s] = {.tables = &plan->tables[s], .tokens = std::span(toks[s]).subspan(pos[s], n), .start_pos = pos[s]};
      pos[s] += n;
    }
    ASSERT_TRUE(m.Forward(chunks, logits.data()).ok());
    const int64_t mixed_allocs = g_allocations.load() - before_mixed;
    std::printf("mode %d: %lld allocations in 20 decode steps of %d sequences, %lld in a mixed step\n",
                static_cast<int>(mode), static_cast<long long>(decode_allocs), kSeqs,
                static_cast<long long>(mixed_allocs));
    EXPECT_EQ(decode_allocs, 0);
    EXPECT_EQ(mixed_allocs, 0);
  }
}

}  // namespace
}  // namespace dsv4::model::testing
