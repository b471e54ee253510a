// The index.json of sharded checkpoints (train/checkpoint_index.h), with and without a config the
// run expects.
#include <cstdint>
#include <string>

#include "runtime/error.h"
#include "train/checkpoint_index.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  meshrt::CheckpointMeta expect;
  try {
    meshrt::detail::parse_checkpoint_index(text, "ck/index.json", "ck", expect);
  } catch (const meshrt::Error&) {
  }
  expect.config = {{"hidden", "64"}, {"dtype", "f32"}};
  try {
    meshrt::detail::parse_checkpoint_index(text, "ck/index.json", "ck", expect);
  } catch (const meshrt::Error&) {
  }
  return 0;
}
