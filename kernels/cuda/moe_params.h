// The contracts of the MoE family's kernels (moe_router.cu, moe.cu): plain structs filled with designated
// initializers by LaunchMoe. Plain C++ (no CUDA types) so tests and host code include them too.
//
// Shapes (ops.h vocabulary): T tokens, D model dims, E experts (all of the model's), Ek experts per token,
// I expert width, Is shared-expert width. An "entry" is one (token, slot) pair, id t * Ek + i; the router
// writes a token's entries in ascending expert id, which is the order the combine sums them in (the CPU
// reference's order).
#pragma once

#include <cstdint>

#include "kernels/cuda/moe_layout.h"

namespace dsv4::kernels::cuda::moe {

inline constexpr int kMaxExperts = 512;  // E the router handles (16 scores per lane)
inline constexpr int kMaxTopk = 16;      // Ek

// Router: logits = W_gate . x (fp32), s = sqrt(softplus(logits)), top-Ek of s + bias (ties: lower id) or
// tid2eid[token], weights s_e / (sum + 1e-20) * routed_scale, then the per-expert entry lists.
struct MoeRouteParams {
  const float* x = nullptr;            // [T, D] normed input
  const uint16_t* gate = nullptr;      // [E, D] bf16 bits, row-major
  const float* bias = nullptr;         // [E] selection bias; null when tid2eid is set
  const int32_t* tid2eid = nullptr;    // [V, Ek] hash routing table, or null (score routing)
  const int32_t* tokens = nullptr;     // [T] token ids; read only with tid2eid
  const int32_t* pos = nullptr;        // [T] pos < 0: padding, routed nowhere
  const int32_t* expert_slot = nullptr;  // [E] slot of expert e in this rank's weights, -1 = not held
  int64_t t = 0, d = 0;                // T, D (D % 8 == 0)
  int experts = 0, topk = 0;           // E (<= kMaxExperts), Ek (<= kMaxTopk)
  float routed_scale = 1.f;
  // Outputs, all in the MoE scratch.
  float* logits = nullptr;             // [T, E]
  uint16_t* x_bf16 = nullptr;          // [T, D] x rounded to bf16 (the experts' activations)
  int32_t* entry_expert = nullptr;     // [T, Ek] expert of each entry, ascending per token; -1 = padding
                                       //   token, expert not held here or out-of-range hash id
  float* entry_weight = nullptr;       // [T, Ek] routing weight of each entry (0 where entry_expert < 0)
  int32_t* expert_count = nullptr;     // [E] entries per expert (0 for experts not held)
  int32_t* expert_offset = nullptr;    // [E] first position of expert e's entries in expert_entries
  int32_t* expert_entries = nullptr;   // [T * Ek] entry ids grouped by expert (any order inside a group)
  int32_t* active = nullptr;           // [E] experts with entries, ascending; the first *num_active valid
  int32_t* num_active = nullptr;       // [1]
};

// The routed experts' two grouped GEMMs over the router's lists. Launch grids cover (tile, active expert)
// pairs up to max_active; blocks past *num_active exit at once.
//   up:   h[p] = silu(min(W1 x, L)) * clamp(W3 x, -L, L)   for list position p of expert e (token of entry)
//   down: out[entry] = weight[entry] * W2 h[p]
struct MoeExpertParams {
  const uint8_t* weights = nullptr;      // [slots, layout.bytes] repacked experts (moe_layout.h)
  const float* expert_scale = nullptr;   // [slots, 4] fp32 epilogue factors of w1, w3, w2 (4th unused)
  ExpertLayout layout;
  Fp4Kind kind = Fp4Kind::kNvfp4;
  const int32_t* expert_slot = nullptr;  // [E]
  const int32_t* expert_count = nullptr;    // [E]
  const int32_t* expert_offset = nullptr;   // [E]
  const int32_t* expert_entries = nullptr;  // [T * Ek]
  const int32_t* active = nullptr;          // [E]
  const int32_t* num_active = nullptr;      // [1]
  const uint16_t* x_bf16 = nullptr;      // [T, D]
  const float* entry_weight = nullptr;   // [T, Ek]
  uint16_t* h = nullptr;                 // [T * Ek, I] bf16 bits, row p = list position p
  float* out = nullptr;                  // [T * Ek, D] weighted output of each entry
  int64_t d = 0, inter = 0;              // D, I (both % 64 == 0)
  int topk = 0;                          // Ek
  int max_active = 0;                    // grid bound: min(held experts, T * Ek)
  float swiglu_limit = 10.f;
};

// y[t] = (accumulate ? y[t] : 0) + sum of the token's entries' outputs in ascending expert id; padding
// tokens get zeros.
struct MoeCombineParams {
  float* y = nullptr;                    // [T, D]
  const float* out = nullptr;            // [T * Ek, D]
  const int32_t* entry_expert = nullptr; // [T, Ek]
  const int32_t* pos = nullptr;          // [T]
  int64_t t = 0, d = 0;                  // D % 4 == 0
  int topk = 0;
  bool accumulate = true;                // y holds the shared expert's output
};

// The shared expert's activation, in place: g = silu(min(g, L)) * clamp(v, -L, L).
struct MoeSwigluParams {
  float* g = nullptr;        // [n]
  const float* v = nullptr;  // [n]
  int64_t n = 0;
  float limit = 10.f;
};

}  // namespace dsv4::kernels::cuda::moe
