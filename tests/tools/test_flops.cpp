// FLOP counting and the GPU peak table against hand-computed numbers; sweep helpers.
#include <catch2/catch.hpp>

#include "bench/block/flops.h"
#include "bench/sweep/sweep.h"
#include "model/block_desc.h"
#include "runtime/error.h"

using namespace meshrt;

TEST_CASE("layer FLOPs follow the standard counts", "[unit]") {
  // B=2, s=128, h=256, ffn=1024, worked out by hand:
  //   QKV 6*2*128*256^2 = 100663296, scores+values 4*2*128^2*256 = 33554432 (half: 16777216),
  //   out-proj 2*2*128*256^2 = 33554432, MLP 4*2*128*256*1024 = 268435456.
  LayerFlops f = layer_flops(LayerKind::Transformer, 2, 128, 256, 1024, true);
  CHECK(f.qkv == 100663296.0);
  CHECK(f.attn_full == 33554432.0);
  CHECK(f.attn == 16777216.0);
  CHECK(f.proj == 33554432.0);
  CHECK(f.mlp == 268435456.0);
  CHECK(f.forward() == 419430400.0);
  // forward + backward (2x forward) over 2 layers, and forward only.
  CHECK(step_flops(f, 2, false) == 2516582400.0);
  CHECK(step_flops(f, 2, true) == 838860800.0);

  LayerFlops full = layer_flops(LayerKind::Transformer, 2, 128, 256, 1024, false);
  CHECK(full.attn == 33554432.0);

  LayerFlops mlp = layer_flops(LayerKind::Mlp, 2, 128, 256, 1024);
  CHECK(mlp.forward() == 268435456.0);
  CHECK(mlp.qkv == 0.0);
  LayerFlops attn = layer_flops(LayerKind::Attention, 2, 128, 256, 1024);
  CHECK(attn.forward() == 100663296.0 + 16777216.0 + 33554432.0);
  CHECK(attn.mlp == 0.0);

  // The default CPU configuration: B=1, s=512, h=1024, ffn=4096 -> 13.42 GFLOP forward.
  LayerFlops d = layer_flops(LayerKind::Transformer, 1, 512, 1024, 4096);
  CHECK(d.forward() == 6.0 * 512 * 1024 * 1024 + 2.0 * 512 * 512 * 1024 + 2.0 * 512 * 1024 * 1024 +
                           4.0 * 512 * 1024 * 4096);
  CHECK(d.forward() == 13421772800.0);
}

TEST_CASE("block kinds parse with a helpful error", "[unit]") {
  CHECK(parse_layer_kind("block") == LayerKind::Transformer);
  CHECK(parse_layer_kind("mlp") == LayerKind::Mlp);
  CHECK(parse_layer_kind("attn") == LayerKind::Attention);
  CHECK_THROWS_WITH(parse_layer_kind("moe"), Catch::Contains("use block"));
}

TEST_CASE("GPU peak table matches names as whole words", "[unit]") {
  std::string m;
  CHECK(gpu_peak_tflops("NVIDIA H200", DType::bf16, &m) == Approx(989.4));
  CHECK(m == "H200");
  CHECK(gpu_peak_tflops("NVIDIA H100 80GB HBM3", DType::bf16) == Approx(989.4));
  CHECK(gpu_peak_tflops("NVIDIA H100 PCIe", DType::bf16) == Approx(756));
  CHECK(gpu_peak_tflops("NVIDIA H200 NVL", DType::f16) == Approx(835));
  CHECK(gpu_peak_tflops("NVIDIA A100-SXM4-80GB", DType::f32) == Approx(19.5));
  CHECK(gpu_peak_tflops("NVIDIA L40S", DType::bf16) == Approx(362));
  CHECK(gpu_peak_tflops("NVIDIA L4", DType::bf16) == Approx(121));
  CHECK(gpu_peak_tflops("Tesla V100-SXM2-16GB", DType::f16) == Approx(125));
  CHECK(gpu_peak_tflops("Tesla V100-SXM2-16GB", DType::bf16) == 0.0);  // no bf16 units
  CHECK(gpu_peak_tflops("NVIDIA A10G", DType::bf16, &m) == 0.0);       // not "A10"
  CHECK(m.empty());
  CHECK(gpu_peak_tflops("", DType::bf16) == 0.0);
}

TEST_CASE("sweep helpers: int lists and mesh factorisations", "[unit]") {
  CHECK(parse_int_list("1,2,4", "--batches") == std::vector<int64_t>{1, 2, 4});
  CHECK(parse_int_list("8", "--batches") == std::vector<int64_t>{8});
  CHECK_THROWS_WITH(parse_int_list("1,,2", "--batches"), Catch::Contains("not an integer >= 1"));
  CHECK_THROWS_WITH(parse_int_list("0", "--batches"), Catch::Contains("not an integer >= 1"));
  CHECK_THROWS_WITH(parse_int_list("", "--batches"), Catch::Contains("is empty"));
  using P = std::vector<std::pair<int, int>>;
  CHECK(mesh_factorisations(1) == P{{1, 1}});
  CHECK(mesh_factorisations(2) == P{{2, 1}, {1, 2}});
  CHECK(mesh_factorisations(8) == P{{8, 1}, {4, 2}, {2, 4}, {1, 8}});
  CHECK(mesh_factorisations(6) == P{{6, 1}, {3, 2}, {2, 3}, {1, 6}});
}
