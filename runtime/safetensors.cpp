#include "runtime/safetensors.h"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include "runtime/error.h"
#include "runtime/json_field.h"
#include "runtime/output_file.h"

namespace meshrt {

namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // as the reference implementation

bool parse_st_dtype(const std::string& s, DType* out) {
  static const std::pair<const char*, DType> map[] = {{"F32", DType::f32}, {"BF16", DType::bf16},
                                                      {"F16", DType::f16}, {"I32", DType::i32},
                                                      {"I64", DType::i64}, {"U8", DType::u8}};
  for (auto& [n, d] : map)
    if (s == n) {
      *out = d;
      return true;
    }
  return false;
}

}  // namespace

const char* safetensors_dtype_name(DType d) {
  switch (d) {
    case DType::f32:
      return "F32";
    case DType::bf16:
      return "BF16";
    case DType::f16:
      return "F16";
    case DType::i32:
      return "I32";
    case DType::i64:
      return "I64";
    case DType::u8:
      return "U8";
  }
  return "?";
}

const Tensor& SafetensorsFile::at(const std::string& name) const {
  for (auto& [n, t] : tensors)
    if (n == name) return t;
  MESHRT_FAIL("safetensors" << (path.empty() ? std::string() : " " + path) << ": no tensor named '"
                            << name << "' (file has " << tensors.size() << " tensors)");
}

void save_safetensors(const std::string& path, const NamedTensors& tensors, Stream& stream,
                      const std::map<std::string, std::string>& metadata,
                      const SafetensorsWriteOptions& options) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<Tensor> host;
  auto host_alloc = make_host_plain_allocator();
  uint64_t offset = 0;
  for (auto& [name, t] : tensors) {
    MESHRT_CHECK(t.defined(),
                 "save_safetensors(" << path << "): tensor '" << name << "' is undefined");
    MESHRT_CHECK(name != "__metadata__" && !name.empty(),
                 "save_safetensors(" << path << "): invalid tensor name '" << name << "'");
    MESHRT_CHECK(!header.contains(name),
                 "save_safetensors(" << path << "): duplicate name '" << name << "'");
    Tensor h =
        t.device().is_cpu() ? t.contiguous(stream) : t.contiguous(stream).to(host_alloc, stream);
    host.push_back(h);
    uint64_t bytes = h.nbytes();
    header[name] = {{"dtype", safetensors_dtype_name(t.dtype())},
                    {"shape", t.shape().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  stream.synchronize();
  std::string hs = header.dump();
  while (hs.size() % 8) hs.push_back(' ');
  OutputFile f(path, options.what, options.durable);
  auto put = [&](const void* data, size_t n) {
    if (options.on_bytes) options.on_bytes(data, n);
    f.write(data, n);
  };
  uint64_t n = hs.size();
  unsigned char le[8];
  for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(n >> (8 * i));
  put(le, 8);
  put(hs.data(), hs.size());
  for (auto& h : host) put(h.data_ptr(), h.nbytes());
  f.commit();
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  MESHRT_CHECK(fd_ >= 0, "load_safetensors: cannot open " << path << ": " << std::strerror(errno));
  try {
    parse();
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) ::close(fd_);
}

namespace {

using StEntry = SafetensorsReader::Entry;

// The JSON header. JSON objects may repeat a key (the parser keeps the last): a repeated tensor
// name is refused here, where the parser still sees both, instead of surfacing later as a gap in
// the data.
nlohmann::json st_parse_header(const std::string& path, const std::string& hs) {
  std::string duplicate;
  std::set<std::string> seen;
  bool too_deep = false;  // nesting past kJsonMaxDepth (runtime/json_field.h): nothing built
  const nlohmann::json::parser_callback_t on_key = [&](int depth, nlohmann::json::parse_event_t ev,
                                                       nlohmann::json& parsed) {
    if (depth == 1 && ev == nlohmann::json::parse_event_t::key && parsed.is_string() &&
        !seen.insert(parsed.get<std::string>()).second && duplicate.empty())
      duplicate = parsed.get<std::string>();
    if ((ev == nlohmann::json::parse_event_t::object_start ||
         ev == nlohmann::json::parse_event_t::array_start) &&
        depth >= kJsonMaxDepth)
      too_deep = true;
    return !too_deep;
  };
  nlohmann::json header = nlohmann::json::parse(hs, on_key, /*allow_exceptions=*/false);
  MESHRT_CHECK(!too_deep, "load_safetensors(" << path << "): the header nests arrays and objects "
                                              << "more than " << kJsonMaxDepth
                                              << " levels deep; not a safetensors file");
  MESHRT_CHECK(!header.is_discarded() && header.is_object(),
               "load_safetensors(" << path << "): header is not a JSON object");
  MESHRT_CHECK(duplicate.empty(),
               "load_safetensors(" << path << "): the header names '" << duplicate << "' twice");
  return header;
}

void st_read_metadata(const std::string& path, const nlohmann::json& v,
                      std::map<std::string, std::string>& out) {
  MESHRT_CHECK(v.is_object(), "load_safetensors(" << path << "): __metadata__ is not an object");
  for (auto m = v.begin(); m != v.end(); ++m) {
    MESHRT_CHECK(m.value().is_string(),
                 "load_safetensors(" << path << "): metadata '" << m.key() << "' is not a string");
    out[m.key()] = m.value().get<std::string>();
  }
}

// A header's shape: at most kMaxDims non-negative extents whose strides and byte size fit in
// int64, zero extents or not ([0, 2^62, 2^62] holds no element but its strides overflow).
Shape st_shape(const std::string& where, const nlohmann::json& shape, DType dtype) {
  MESHRT_CHECK(shape.is_array() && shape.size() <= static_cast<size_t>(kMaxDims),
               where << ": shape must be an array of at most " << kMaxDims << " extents");
  std::vector<int64_t> extents;
  for (auto& d : shape) {
    MESHRT_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0),
                 where << ": shape has a non-integer or negative extent " << d.dump());
    MESHRT_CHECK(d.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX),
                 where << ": extent " << d.dump() << " too large");
    extents.push_back(d.get<int64_t>());
  }
  int64_t span = static_cast<int64_t>(dtype_size(dtype));
  for (int64_t x : extents)
    MESHRT_CHECK(!__builtin_mul_overflow(span, std::max<int64_t>(x, 1), &span),
                 where << ": shape " << shape.dump() << " overflows 64-bit strides / byte sizes");
  return Shape(extents);
}

// One tensor's header entry, checked against itself and the data section's size.
StEntry st_entry(const std::string& path, const std::string& name, const nlohmann::json& v,
                 uint64_t data_size) {
  MESHRT_CHECK(!name.empty(), "load_safetensors(" << path << "): a tensor has an empty name");
  const std::string where = "load_safetensors(" + path + "): tensor '" + name + "'";
  MESHRT_CHECK(
      v.is_object() && v.contains("dtype") && v.contains("shape") && v.contains("data_offsets"),
      where << " needs dtype, shape and data_offsets");
  MESHRT_CHECK(v["dtype"].is_string(), where << ": dtype is not a string");
  StEntry e;
  e.name = name;
  const std::string ds = v["dtype"].get<std::string>();
  MESHRT_CHECK(parse_st_dtype(ds, &e.dtype), where << ": unsupported dtype '" << ds
                                                   << "' (meshrt reads F32, BF16, F16, I32, "
                                                   << "I64, U8)");
  e.shape = st_shape(where, v["shape"], e.dtype);
  const auto& off = v["data_offsets"];
  MESHRT_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() &&
                   off[1].is_number_unsigned(),
               where << ": data_offsets must be two non-negative integers");
  e.begin = off[0].get<uint64_t>();
  e.end = off[1].get<uint64_t>();
  MESHRT_CHECK(e.begin <= e.end && e.end <= data_size,
               where << ": data_offsets [" << e.begin << ", " << e.end << "] out of range of the "
                     << data_size << "-byte data section");
  const Shape& s = e.shape;
  int64_t numel = s.numel();
  uint64_t expect;
  MESHRT_CHECK(!__builtin_mul_overflow(static_cast<uint64_t>(numel), dtype_size(e.dtype), &expect),
               where << ": byte size overflows");
  MESHRT_CHECK(expect == e.end - e.begin, where << ": shape " << s.str() << " of " << ds
                                                << " needs " << expect << " bytes but "
                                                << "data_offsets span " << e.end - e.begin);
  return e;
}

// The entries in data order, which must cover the data section exactly: no overlap, no gap (as
// the reference reader).
std::vector<StEntry> st_in_data_order(const std::string& path, std::vector<StEntry> entries,
                                      uint64_t data_size) {
  std::stable_sort(entries.begin(), entries.end(), [](const StEntry& a, const StEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t cursor = 0;
  for (const StEntry& e : entries) {
    MESHRT_CHECK(e.begin >= cursor, "load_safetensors(" << path << "): tensor '" << e.name
                                                        << "' at [" << e.begin << ", " << e.end
                                                        << "] overlaps the previous tensor "
                                                           "(which ends at "
                                                        << cursor << ")");
    MESHRT_CHECK(e.begin == cursor, "load_safetensors(" << path << "): gap of " << e.begin - cursor
                                                        << " bytes before "
                                                        << "tensor '" << e.name << "'");
    cursor = e.end;
  }
  MESHRT_CHECK(cursor == data_size, "load_safetensors(" << path << "): " << data_size - cursor
                                                        << " trailing bytes after the last tensor");
  return entries;
}

}  // namespace

void SafetensorsReader::parse() {
  const std::string& path = path_;
  struct stat sb {};
  MESHRT_CHECK(::fstat(fd_, &sb) == 0 && S_ISREG(sb.st_mode),
               "load_safetensors(" << path << "): not a regular file");
  const uint64_t file_size = static_cast<uint64_t>(sb.st_size);
  file_size_ = file_size;
  MESHRT_CHECK(file_size >= 8, "load_safetensors(" << path << "): file is " << file_size
                                                   << " bytes, shorter than the 8-byte header "
                                                      "length; not a safetensors file");
  unsigned char le[8];
  read_at(0, 8, le);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(le[i]) << (8 * i);
  MESHRT_CHECK(n <= kMaxHeaderBytes, "load_safetensors(" << path << "): header length " << n
                                                         << " exceeds the " << kMaxHeaderBytes
                                                         << "-byte limit");
  MESHRT_CHECK(n <= file_size - 8, "load_safetensors(" << path << "): header length " << n
                                                       << " runs past the end of the " << file_size
                                                       << "-byte file (truncated?)");
  std::string hs(n, '\0');
  read_at(8, n, hs.data());
  const nlohmann::json header = st_parse_header(path, hs);
  const uint64_t data_size = file_size - 8 - n;
  data_start_ = 8 + n;
  std::vector<Entry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__")
      st_read_metadata(path, it.value(), metadata_);
    else
      entries.push_back(st_entry(path, it.key(), it.value(), data_size));
  }
  entries_ = st_in_data_order(path, std::move(entries), data_size);
}

void SafetensorsReader::read_at(uint64_t pos, uint64_t bytes, void* dst) const {
  char* p = static_cast<char*>(dst);
  while (bytes > 0) {
    const ssize_t r = ::pread(fd_, p, bytes, static_cast<off_t>(pos));
    if (r < 0 && errno == EINTR) continue;
    MESHRT_CHECK(r > 0, "load_safetensors(" << path_ << "): short read at byte " << pos << ": "
                                            << (r == 0 ? "end of file" : std::strerror(errno)));
    p += r;
    pos += static_cast<uint64_t>(r);
    bytes -= static_cast<uint64_t>(r);
  }
}

const SafetensorsReader::Entry* SafetensorsReader::find(const std::string& name) const {
  for (auto& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

const SafetensorsReader::Entry& SafetensorsReader::at(const std::string& name) const {
  const Entry* e = find(name);
  MESHRT_CHECK(e, "load_safetensors(" << path_ << "): no tensor named '" << name << "'");
  return *e;
}

void SafetensorsReader::read(const Entry& e, uint64_t offset, uint64_t bytes, void* dst) const {
  MESHRT_CHECK(offset <= e.end - e.begin && bytes <= e.end - e.begin - offset,
               "load_safetensors(" << path_ << "): bytes [" << offset << ", " << offset + bytes
                                   << ") are outside tensor '" << e.name << "' (" << e.end - e.begin
                                   << " bytes)");
  read_at(data_start_ + e.begin + offset, bytes, dst);
}

SafetensorsFile load_safetensors(const std::string& path, const std::shared_ptr<Allocator>& host) {
  SafetensorsReader r(path);
  SafetensorsFile out;
  out.path = path;
  out.metadata = r.metadata();
  for (const auto& e : r.entries()) {
    Tensor t = Tensor::empty(e.shape, e.dtype, host);
    r.read(e, 0, e.end - e.begin, t.data_ptr());
    out.tensors.emplace_back(e.name, t);
  }
  return out;
}

}  // namespace meshrt
