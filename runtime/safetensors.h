// safetensors read / write (the format of Hugging Face, PyTorch and NumPy tools), validated.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/allocator.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"

namespace meshrt {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// Writes the tensors (any device; non-host ones are copied through `stream`) and string metadata.
// Written to path.tmp then renamed, so a crash never leaves a half file under `path`.
void save_safetensors(const std::string& path, const NamedTensors& tensors, Stream& stream,
                      const std::map<std::string, std::string>& metadata = {});

struct SafetensorsFile {
  NamedTensors tensors;  // host tensors, in file order
  std::map<std::string, std::string> metadata;
  const Tensor& at(const std::string& name) const;
};

// Reads and validates a whole file: rejects truncated files, oversized or malformed headers,
// unknown dtypes, shape/size mismatches, offsets out of range or overlapping, with an Error that
// names the file, the tensor and the values.
SafetensorsFile load_safetensors(const std::string& path, const std::shared_ptr<Allocator>& host);

}  // namespace meshrt
