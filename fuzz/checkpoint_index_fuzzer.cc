// Fuzz target: model.safetensors.index.json text through ParseCheckpointIndex, the parser Checkpoint::Open uses.
// Accepted indexes must map at least one tensor and only to plain file names inside the checkpoint folder: a
// shard name that could leave the folder ("..", "a/b", NUL) would let an index make the loader open any file.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_check.h"
#include "fuzz/json_mutator.h"
#include "model/checkpoint/checkpoint.h"

DSV4_FUZZ_JSON_MUTATOR()

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto map = dsv4::ckpt::ParseCheckpointIndex("fuzz/model.safetensors.index.json", text);
  if (!map.ok()) {
    FUZZ_CHECK(map.status().code() == absl::StatusCode::kInvalidArgument, "unexpected code: %s",
               map.status().ToString().c_str());
    return 0;
  }
  FUZZ_CHECK(!map->empty(), "accepted an empty weight_map");
  for (const auto& [tensor, shard] : *map) {
    FUZZ_CHECK(!shard.empty() && shard != "." && shard != "..", "shard name \"%s\" is not a file", shard.c_str());
    FUZZ_CHECK(shard.find('/') == std::string::npos && shard.find('\0') == std::string::npos,
               "shard name \"%s\" leaves the folder", shard.c_str());
  }
  return 0;
}
