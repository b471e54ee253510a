#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "runtime/context.h"
#include "runtime/error.h"
#include "runtime/safetensors.h"

using namespace meshrt;
namespace fs = std::filesystem;

namespace {

std::string tmp_path(const std::string& name) {
  return (fs::temp_directory_path() / ("meshrt_test_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

// Writes a raw safetensors file: 8-byte little-endian header length, header, data.
void write_raw(const std::string& path, const std::string& header, const std::string& data,
               uint64_t declared_len = UINT64_MAX) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  uint64_t n = declared_len == UINT64_MAX ? header.size() : declared_len;
  for (int i = 0; i < 8; ++i) f.put(static_cast<char>(n >> (8 * i)));
  f << header << data;
}

}  // namespace

TEST_CASE("safetensors round trip keeps names, dtypes, shapes, values and metadata",
          "[safetensors]") {
  Context ctx(Device::cpu());
  Stream& s = ctx.compute_stream();
  Tensor a = ctx.empty({3, 4}, DType::f32), b = ctx.empty({5}, DType::bf16),
         c = ctx.empty({2, 2, 2}, DType::i64), e = ctx.empty({0, 3}, DType::f16);
  a.init_philox_({1, 1}, s);
  b.init_philox_({1, 2}, s);
  c.fill_(-7, s);
  Tensor at = a.transpose(0, 1);  // non-contiguous input is written contiguous
  std::string p = tmp_path("rt.safetensors");
  save_safetensors(p, {{"w.t", at}, {"b", b}, {"idx", c}, {"empty", e}}, s,
                   {{"format", "pt"}, {"meshrt", "test"}});
  REQUIRE(!fs::exists(p + ".tmp"));
  auto f = load_safetensors(p, ctx.host_allocator());
  REQUIRE(f.tensors.size() == 4);
  REQUIRE(f.tensors[0].first == "w.t");
  REQUIRE(f.at("w.t").shape() == Shape({4, 3}));
  REQUIRE(f.at("w.t").to_vector() == at.to_vector());
  REQUIRE(f.at("b").dtype() == DType::bf16);
  REQUIRE(f.at("b").to_vector() == b.to_vector());
  REQUIRE(f.at("idx").to_vector() == std::vector<double>(8, -7.0));
  REQUIRE(f.at("empty").numel() == 0);
  REQUIRE(f.metadata.at("meshrt") == "test");
  REQUIRE_THROWS_WITH(f.at("nope"), Catch::Contains("no tensor named 'nope'"));
  fs::remove(p);
}

TEST_CASE("malformed safetensors files are rejected with a clear error", "[safetensors]") {
  auto host = make_host_caching_allocator();
  std::string p = tmp_path("bad.safetensors");
  auto expect = [&](const std::string& what) {
    REQUIRE_THROWS_WITH(load_safetensors(p, host), Catch::Contains(what));
  };
  const std::string ok_entry = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";

  {
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f << "abc";
  }
  expect("shorter than the 8-byte header");

  write_raw(p, "{}", "", uint64_t{1} << 40);
  expect("exceeds the");

  write_raw(p, "{" + ok_entry + "}", "", 500);
  expect("runs past the end");

  write_raw(p, "{not json", "");
  expect("not a JSON object");

  write_raw(p, R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", std::string(8, 'x'));
  expect("unsupported dtype 'F64'");

  write_raw(p, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", std::string(8, 'x'));
  expect("out of range");

  write_raw(p, R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, 'x'));
  expect("needs 12 bytes but data_offsets span 8");

  write_raw(p,
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
            std::string(12, 'x'));
  expect("overlaps");

  write_raw(p, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", std::string(8, 'x'));
  expect("gap of 4 bytes");

  write_raw(p, "{" + ok_entry + "}", std::string(12, 'x'));
  expect("4 trailing bytes");

  write_raw(p, R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", std::string(8, 'x'));
  expect("negative extent");

  write_raw(p, R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", std::string(8, 'x'));
  expect("needs dtype, shape and data_offsets");

  write_raw(p, R"({"__metadata__":{"k":1}})", "");
  expect("metadata 'k' is not a string");

  write_raw(p, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", std::string(8, 'x'));
  expect("out of range");

  // No element, but strides of 2^124: refused before any stride is computed.
  write_raw(p,
            R"({"a":{"dtype":"F32","shape":[0,4611686018427387904,4611686018427387904],)"
            R"("data_offsets":[0,0]}})",
            "");
  expect("overflows 64-bit strides");
  // nlohmann keeps the last of repeated keys: the first must not vanish into a "gap".
  write_raw(p, "{" + ok_entry + "," + ok_entry + "}", std::string(8, 'x'));
  expect("names 'a' twice");
  write_raw(p, R"({"":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", std::string(8, 'x'));
  expect("empty name");
  // Every message names the file.
  for (const std::string& h : {std::string("{\"\":1}"), std::string("{" + ok_entry + "}")}) {
    write_raw(p, h, "");
    REQUIRE_THROWS_WITH(load_safetensors(p, host), Catch::Contains(p));
  }
  {
    const std::string dir = tmp_path("a-directory.safetensors");
    fs::create_directories(dir);
    REQUIRE_THROWS_WITH(load_safetensors(dir, host),
                        Catch::Contains(dir) && Catch::Contains("not a regular file"));
    fs::remove(dir);
  }
  {
    Context ctx(Device::cpu());
    save_safetensors(p, {{"t", ctx.zeros({2}, DType::f32)}}, ctx.compute_stream());
    REQUIRE_THROWS_WITH(load_safetensors(p, host).at("u"),
                        Catch::Contains(p) && Catch::Contains("no tensor named 'u'"));
  }

  REQUIRE_THROWS_WITH(load_safetensors(tmp_path("does-not-exist"), host),
                      Catch::Contains("cannot open"));
  // A truncated real file.
  {
    Context ctx(Device::cpu());
    Tensor t = ctx.zeros({64}, DType::f32);
    save_safetensors(p, {{"t", t}}, ctx.compute_stream());
    fs::resize_file(p, fs::file_size(p) - 10);
  }
  expect("out of range");
  fs::remove(p);
}
