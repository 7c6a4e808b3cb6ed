// Helpers of the attention family's CUDA tests (attention_ops_test.cc, indexer_ops_test.cc), header-only: device
// arrays a test owns, and host/device twins of a step index, a paged KV pool and block tables, so one Args struct
// can be pointed at host memory for the CPU reference op and at device memory for the CUDA launcher.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/ops.h"
#include "kernels/sparse_mla/kv_row_format.h"

namespace dsv4::kernels::cuda::testing {

// A device copy of a host vector (or n zero-filled elements), freed with the object.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(const std::vector<T>& host) { Assign(host); }
  explicit DeviceArray(size_t n) {
    Allocate(n);
    if (n > 0) {
      EXPECT_EQ(cudaMemset(ptr_, 0, n * sizeof(T)), cudaSuccess);
    }
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { cudaFree(ptr_); }

  void Assign(const std::vector<T>& host) {
    if (host.size() != n_) Allocate(host.size());
    if (n_ > 0) {
      EXPECT_EQ(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  std::vector<T> ToHost() const {
    std::vector<T> host(n_);
    if (n_ > 0) {
      EXPECT_EQ(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return host;
  }
  T* get() const { return ptr_; }
  size_t size() const { return n_; }

 private:
  void Allocate(size_t n) {
    cudaFree(ptr_);
    ptr_ = nullptr;
    n_ = n;
    if (n > 0) {
      EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&ptr_), n * sizeof(T)), cudaSuccess);
    }
  }
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

// One sequence of a step: positions p0 .. p0 + len - 1 (len 0: a padding sequence) and its state slot.
struct SeqSpec {
  int32_t p0 = 0, len = 0, slot = 0;
};

// A step index in host memory and its device twin: the sequences in order, then `padding_tokens` tokens with
// pos -1.
struct TestStep {
  std::vector<int32_t> pos, seq, seq_first, seq_len, state_slot;
  int max_seq_len = 1;
  DeviceArray<int32_t> d_pos, d_seq, d_first, d_len, d_slot;

  TestStep(const std::vector<SeqSpec>& seqs, int padding_tokens) {
    for (size_t b = 0; b < seqs.size(); ++b) {
      seq_first.push_back(static_cast<int32_t>(pos.size()));
      seq_len.push_back(seqs[b].len);
      state_slot.push_back(seqs[b].slot);
      max_seq_len = std::max(max_seq_len, seqs[b].len);
      for (int32_t i = 0; i < seqs[b].len; ++i) {
        pos.push_back(seqs[b].p0 + i);
        seq.push_back(static_cast<int32_t>(b));
      }
    }
    pos.insert(pos.end(), padding_tokens, -1);
    seq.insert(seq.end(), padding_tokens, 0);
    d_pos.Assign(pos);
    d_seq.Assign(seq);
    d_first.Assign(seq_first);
    d_len.Assign(seq_len);
    d_slot.Assign(state_slot);
  }
  int64_t t() const { return static_cast<int64_t>(pos.size()); }
  int64_t b() const { return static_cast<int64_t>(seq_len.size()); }
  StepIndex Host() const {
    return {.pos = pos.data(), .seq = seq.data(), .seq_first = seq_first.data(), .seq_len = seq_len.data(),
            .state_slot = state_slot.data(), .t = t(), .b = b(), .max_seq_len = max_seq_len};
  }
  StepIndex Device() const {
    return {.pos = d_pos.get(), .seq = d_seq.get(), .seq_first = d_first.get(), .seq_len = d_len.get(),
            .state_slot = d_slot.get(), .t = t(), .b = b(), .max_seq_len = max_seq_len};
  }
};

// Reads / writes physical row `row` of a pool in host memory as floats (the FP8 record through
// kernels/sparse_mla's encoder and decoder, the ones the CPU backend uses).
inline void HostReadRow(const KvCacheView& c, int64_t row, float* out) {
  const uint8_t* page = c.base + (row / c.page_rows) * c.page_bytes;
  const int64_t r = row % c.page_rows;
  if (c.format == KvFormat::kF32) {
    std::copy_n(reinterpret_cast<const float*>(page) + r * c.dim, c.dim, out);
    return;
  }
  namespace fmt = sparse_mla;
  fmt::DecodeKvRow(page + r * fmt::kRowDataBytes, page + int64_t{c.page_rows} * fmt::kRowDataBytes + r * fmt::kRowScaleBytes,
                   std::span<float, fmt::kKvDim>(out, fmt::kKvDim));
}
inline void HostWriteRow(const KvCacheView& c, int64_t row, const float* in) {
  uint8_t* page = c.base + (row / c.page_rows) * c.page_bytes;
  const int64_t r = row % c.page_rows;
  if (c.format == KvFormat::kF32) {
    std::copy_n(in, c.dim, reinterpret_cast<float*>(page) + r * c.dim);
    return;
  }
  namespace fmt = sparse_mla;
  fmt::EncodeKvRow(std::span<const float, fmt::kKvDim>(in, fmt::kKvDim), page + r * fmt::kRowDataBytes,
                   page + int64_t{c.page_rows} * fmt::kRowDataBytes + r * fmt::kRowScaleBytes);
}

// A paged pool in host memory (zero-filled) and its device twin; Upload copies host -> device.
struct TestPool {
  KvFormat format = KvFormat::kF32;
  int dim = 0, page_rows = 0;
  int64_t pages = 0, page_bytes = 0;
  std::vector<uint8_t> host;
  DeviceArray<uint8_t> dev;

  TestPool(KvFormat format, int dim, int page_rows, int64_t pages)
      : format(format), dim(dim), page_rows(page_rows), pages(pages),
        page_bytes(KvPageBytes(format, dim, page_rows)), host(pages * page_bytes, 0) {
    Upload();
  }
  void Upload() { dev.Assign(host); }
  KvCacheView HostView() { return View(host.data()); }
  KvCacheView DeviceView() { return View(dev.get()); }
  int64_t rows() const { return pages * page_rows; }
  // Every row as floats (rows x dim): the host copy, or a download of the device copy.
  std::vector<float> DecodeHost() { return Decode(host); }
  std::vector<float> DecodeDevice() {
    std::vector<uint8_t> bytes = dev.ToHost();
    return Decode(bytes);
  }

 private:
  KvCacheView View(uint8_t* base) const {
    return {.base = base, .format = format, .dim = dim, .page_rows = page_rows, .page_bytes = page_bytes};
  }
  std::vector<float> Decode(std::vector<uint8_t>& bytes) {
    const KvCacheView v = View(bytes.data());
    std::vector<float> out(rows() * dim);
    for (int64_t r = 0; r < rows(); ++r) HostReadRow(v, r, &out[r * dim]);
    return out;
  }
};

// Block tables of `seqs` sequences with `per_seq` pages each: distinct pages first_page, first_page + 1, ... in a
// random order.
struct TestTables {
  std::vector<int32_t> pages;
  int64_t stride = 0;
  DeviceArray<int32_t> dev;
  TestTables(int64_t seqs, int64_t per_seq, int64_t first_page, std::mt19937& rng)
      : pages(seqs * per_seq), stride(per_seq) {
    std::iota(pages.begin(), pages.end(), static_cast<int32_t>(first_page));
    std::shuffle(pages.begin(), pages.end(), rng);
    dev.Assign(pages);
  }
  BlockTables Host() const { return {.pages = pages.data(), .stride = stride}; }
  BlockTables Device() const { return {.pages = dev.get(), .stride = stride}; }
  // Physical row of logical row `logical` of sequence b.
  int64_t Row(int64_t b, int64_t logical, int page_rows) const {
    return int64_t{pages[b * stride + logical / page_rows]} * page_rows + logical % page_rows;
  }
};

}  // namespace dsv4::kernels::cuda::testing
