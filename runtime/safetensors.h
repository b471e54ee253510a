// safetensors read / write (the format of Hugging Face, PyTorch and NumPy tools), validated.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "meshrt/export.h"
#include "runtime/allocator.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"

namespace meshrt {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

struct MESHRT_API SafetensorsWriteOptions {
  // fsync the file before the rename and its directory after it, so the file survives a crash
  // of the machine once save_safetensors returns (checkpoints need it; dumps do not).
  bool durable = false;
  // Sees every byte written, in file order (checksums without reading the file back).
  std::function<void(const void* data, size_t n)> on_bytes;
  // Names the file in error messages: the flag or role it was written for ("--dump").
  std::string what = "save_safetensors";
};

// The safetensors name of a dtype: "F32", "BF16", "F16", "I32", "I64", "U8".
MESHRT_API const char* safetensors_dtype_name(DType d);

// Writes the tensors (any device; non-host ones are copied through `stream`) and string metadata.
// Written through OutputFile (runtime/output_file.h): a unique temporary file renamed over
// `path` (a symlink is followed, a non-regular target refused), every write checked; a crash or a
// failure never leaves a half file under `path`.
MESHRT_API void save_safetensors(const std::string& path, const NamedTensors& tensors,
                                 Stream& stream,
                                 const std::map<std::string, std::string>& metadata = {},
                                 const SafetensorsWriteOptions& options = {});

struct MESHRT_API SafetensorsFile {
  NamedTensors tensors;  // host tensors, in file order
  std::map<std::string, std::string> metadata;
  std::string path;  // the file it was read from (named in errors)
  const Tensor& at(const std::string& name) const;
};

// An open, validated safetensors file whose tensors are read on demand, whole or by byte range,
// so a reader touches only the bytes it needs. Only regular files are opened (never a device or
// a FIFO). Validation as load_safetensors.
class MESHRT_API SafetensorsReader {
 public:
  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    uint64_t begin = 0, end = 0;  // byte range in the data section
  };
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  uint64_t file_size() const { return file_size_; }
  const std::vector<Entry>& entries() const { return entries_; }  // in file order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // nullptr when absent.
  const Entry* find(const std::string& name) const;
  // Throws naming the file and the tensor when absent.
  const Entry& at(const std::string& name) const;
  // Copies `bytes` bytes of tensor `e`'s data starting `offset` bytes into it to `dst`.
  void read(const Entry& e, uint64_t offset, uint64_t bytes, void* dst) const;

 private:
  void parse();
  void read_at(uint64_t pos, uint64_t bytes, void* dst) const;

  std::string path_;
  int fd_ = -1;
  uint64_t file_size_ = 0, data_start_ = 0;
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Reads and validates a whole file: rejects truncated files, oversized or malformed headers,
// unknown dtypes, shape/size mismatches, offsets out of range or overlapping, with an Error that
// names the file, the tensor and the values.
MESHRT_API SafetensorsFile load_safetensors(const std::string& path,
                                            const std::shared_ptr<Allocator>& host);

}  // namespace meshrt
