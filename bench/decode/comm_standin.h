// The collectives of a simulated tensor-parallel rank (--simulate-rank r --simulate-world T): the model of rank r
// runs alone, so its collectives do no communication; this stand-in counts what they would move, and
// ModelledCommSeconds turns that into time with a measured all-reduce bandwidth (bench/RESULTS.md says whose).
// The all-reduce leaves the rank's partial sum in place and the vocabulary gather leaves the other ranks' logit
// columns as they were: the step's values differ from a real group's, its work does not.
#pragma once

#include <cstdint>

#include "model/dsv4/hooks.h"

namespace dsv4::bench {

class StandInCollectives final : public model::Collectives {
 public:
  StandInCollectives(int rank, int world) : rank_(rank), world_(world) {}
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  absl::Status AllReduceSum(float*, int64_t n) override {
    ++all_reduces_;
    all_reduce_bytes_ += n * 4;
    return absl::OkStatus();
  }
  absl::Status GatherVocab(const float*, int64_t rows, int64_t vocab, float*) override {
    ++gathers_;
    gather_bytes_ += rows * vocab * 4;
    return absl::OkStatus();
  }

  void Reset() { all_reduces_ = gathers_ = all_reduce_bytes_ = gather_bytes_ = 0; }
  int64_t all_reduces() const { return all_reduces_; }
  int64_t all_reduce_bytes() const { return all_reduce_bytes_; }  // payload: sum of the buffers' sizes
  int64_t gathers() const { return gathers_; }
  int64_t gather_bytes() const { return gather_bytes_; }          // the gathered [rows, vocab] fp32 results

 private:
  int rank_, world_;
  int64_t all_reduces_ = 0, all_reduce_bytes_ = 0, gathers_ = 0, gather_bytes_ = 0;
};

// Ring all-reduce of S payload bytes in a group of T: t = latency + 2 (T - 1) / T * S / busbw (nccl-tests' bus
// bandwidth definition); the all-gather of G result bytes: latency + (T - 1) / T * G / busbw.
inline double ModelledCommSeconds(int64_t all_reduces, int64_t all_reduce_bytes, int64_t gathers, int64_t gather_bytes,
                                  int world, double busbw_bytes_per_s, double latency_s) {
  if (world <= 1) return 0.0;
  const double t = static_cast<double>(world);
  return static_cast<double>(all_reduces + gathers) * latency_s +
         (2.0 * (t - 1) / t * static_cast<double>(all_reduce_bytes) + (t - 1) / t * static_cast<double>(gather_bytes)) /
             busbw_bytes_per_s;
}

}  // namespace dsv4::bench
