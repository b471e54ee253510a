// Token files (train/token_data.h): the first byte picks the name (.npy, or .bin read raw as u16 /
// u32, where llm.c's header is recognised by its magic), the rest is the file. An opened file is
// checked against a vocabulary and a window length and read back.
#include <cstdint>
#include <string>

#include "runtime/error.h"
#include "tests/fuzz/fuzz_util.h"
#include "train/token_data.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool npy = (data[0] & 1) != 0;
  const auto raw = (data[0] & 2) != 0 ? meshrt::TokenDType::U32 : meshrt::TokenDType::U16;
  const std::string p =
      meshrt::fuzz::write_input(npy ? "tokens.npy" : "tokens.bin", data + 1, size - 1);
  try {
    auto f = meshrt::TokenFile::open(p, raw);
    for (int64_t i = 0; i < f->size(); ++i)
      if (f->token(i) < 0 || f->token(i) > f->max_token()) __builtin_trap();  // checked at open
    f->check(1 + (data[0] >> 2), 1 + (data[0] >> 4));
  } catch (const meshrt::Error&) {
  }
  return 0;
}
