// Counts global operator new calls (all threads) between Start and Stop: the test binary replaces the global
// allocation functions (alloc_counter.cc), so a test can prove that a piece of code does not allocate.
#pragma once

#include <cstdint>

namespace dsv4::testing {

void StartCountingAllocations();
// Allocations since StartCountingAllocations (and stops counting).
int64_t StopCountingAllocations();

}  // namespace dsv4::testing
