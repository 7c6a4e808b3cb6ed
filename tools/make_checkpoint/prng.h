// The checkpoint generator's random numbers: a counter-based stream per tensor, so every value is a pure
// function of (seed, tensor name, element index). Tensors are independent of the order (and the thread)
// they are generated in, and the bytes are the same on every machine: integer hashing only, and the
// uniform value is an exact float (an odd multiple of 2^-23), never the result of libm.
#pragma once

#include <cstdint>
#include <string_view>

namespace dsv4::gen {

// SplitMix64's output function (Steele, Lea & Flood 2014): a bijective 64-bit mixer.
constexpr uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// FNV-1a over the bytes of a name.
constexpr uint64_t Fnv1a64(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : s) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ULL;
  }
  return h;
}

class TensorRng {
 public:
  TensorRng(uint64_t seed, std::string_view name) : key_(Mix64(Mix64(seed) ^ Fnv1a64(name))) {}

  // Element i's 64 random bits: SplitMix64's stream started at the tensor's key, read at position i.
  uint64_t Bits(uint64_t i) const { return Mix64(key_ + (i + 1) * 0x9e3779b97f4a7c15ULL); }

  // Uniform on (-1, 1), symmetric (mean exactly 0), standard deviation 1/sqrt(3): (2m + 1 - 2^23) / 2^23
  // for a 23-bit m, exactly representable as a float.
  float Uniform(uint64_t i) const {
    const int64_t m = static_cast<int64_t>(Bits(i) >> 41);  // 23 bits
    return static_cast<float>(2 * m + 1 - (int64_t{1} << 23)) * (1.0f / 8388608.0f);
  }

  // Uniform integer in [0, n), n > 0: the high word of a 64x64-bit product (Lemire), no division.
  uint64_t Below(uint64_t i, uint64_t n) const {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(Bits(i)) * n) >> 64);
  }

 private:
  uint64_t key_;
};

}  // namespace dsv4::gen
