// A structure-aware libFuzzer mutator for the JSON targets (config.json, hf_quant_config.json, the checkpoint
// index). Byte mutations rarely keep a JSON document valid while changing one field to a hostile value, so half
// the time this parses the input and edits the tree instead: one node gets an edge value (huge, negative,
// fractional, wrong type), or a member is deleted, copied into another object, or an array grows. Input that does
// not parse, or an edit that would not fit max_size, falls back to libFuzzer's own mutation (with the target's
// dictionary). With byte mutations alone, 2 million runs did not produce {"partial_rotary_factor": 1e300}; with
// this mutator it takes seconds.
//
// Use: in the target's .cc, DSV4_FUZZ_JSON_MUTATOR() defines LLVMFuzzerCustomMutator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace dsv4::fuzz {

inline const std::vector<nlohmann::json>& JsonEdgeValues() {
  static const auto* values = new std::vector<nlohmann::json>{
      0, -1, 1, 2, 3, 16, 128, 4096, 2147483647, 2147483648LL, 4294967296LL, 9223372036854775807LL,
      static_cast<uint64_t>(9223372036854775808ULL), static_cast<uint64_t>(18446744073709551615ULL),
      -9223372036854775807LL - 1, 1e300, -1e300, 1e-300, 0.5, -0.5, 1.0, "", "x", "NVFP4", "yarn", true, false,
      nullptr, nlohmann::json::array(), nlohmann::json::object(), nlohmann::json::array({0, 4, 128})};
  return *values;
}

// Every node of `j` (pre-order), with its parent (nullptr for the root).
inline void CollectNodes(nlohmann::json* j, nlohmann::json* parent, std::vector<nlohmann::json*>* nodes,
                         std::vector<nlohmann::json*>* parents) {
  nodes->push_back(j);
  parents->push_back(parent);
  if (j->is_structured()) {
    for (auto& child : *j) CollectNodes(&child, j, nodes, parents);
  }
}

inline bool MutateJsonTree(nlohmann::json& root, std::minstd_rand& rng) {
  std::vector<nlohmann::json*> nodes, parents;
  CollectNodes(&root, nullptr, &nodes, &parents);
  const size_t pick = rng() % nodes.size();
  nlohmann::json* node = nodes[pick];
  nlohmann::json* parent = parents[pick];
  const auto& edges = JsonEdgeValues();
  switch (rng() % 4) {
    case 0:  // a hostile value in place of this one
      *node = edges[rng() % edges.size()];
      return true;
    case 1: {  // delete this member or element
      if (parent == nullptr) return false;
      if (parent->is_object()) {
        for (auto it = parent->begin(); it != parent->end(); ++it) {
          if (&*it == node) {
            parent->erase(it);
            return true;
          }
        }
      } else {
        for (size_t i = 0; i < parent->size(); ++i) {
          if (&(*parent)[i] == node) {
            parent->erase(i);
            return true;
          }
        }
      }
      return false;
    }
    case 2: {  // copy a member of one object into another (moves keys between nesting levels)
      if (parent == nullptr || !parent->is_object()) return false;
      std::string key;
      for (auto it = parent->begin(); it != parent->end(); ++it) {
        if (&*it == node) key = it.key();
      }
      std::vector<nlohmann::json*> objects;
      for (nlohmann::json* n : nodes) {
        if (n->is_object() && n != parent) objects.push_back(n);
      }
      if (objects.empty()) return false;
      nlohmann::json value = *node;  // copy first: the insert may move `node`
      (*objects[rng() % objects.size()])[key] = std::move(value);
      return true;
    }
    default: {  // grow an array by a copy of an element or an edge value
      if (!node->is_array()) return false;
      if (!node->empty() && rng() % 2 == 0) {
        nlohmann::json copy = (*node)[rng() % node->size()];
        node->push_back(std::move(copy));
      } else {
        node->push_back(edges[rng() % edges.size()]);
      }
      return true;
    }
  }
}

inline size_t MutateJson(uint8_t* data, size_t size, size_t max_size, unsigned seed) {
  std::minstd_rand rng(seed);
  if (rng() % 2 == 0) {
    nlohmann::json root = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
    if (!root.is_discarded() && root.is_structured()) {
      bool changed = false;
      for (int i = 0; i < 8 && !changed; ++i) changed = MutateJsonTree(root, rng);
      if (changed) {
        const std::string text = root.dump();
        if (text.size() <= max_size) {
          std::memcpy(data, text.data(), text.size());
          return text.size();
        }
      }
    }
  }
  return LLVMFuzzerMutate(data, size, max_size);
}

}  // namespace dsv4::fuzz

#define DSV4_FUZZ_JSON_MUTATOR()                                                                     \
  extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned seed) { \
    return dsv4::fuzz::MutateJson(data, size, max_size, seed);                                       \
  }
