#include "bench/common/host_gemm_report.h"

#include "kernels/host/gemm_f32_path.h"

namespace meshrt::bench {

nlohmann::json host_f32_gemm_json() {
  nlohmann::json rows = nlohmann::json::array();
  for (const kernels::host::F32Choice& c : kernels::host::f32_choices()) {
    rows.push_back({{"m", c.m},
                    {"n", c.n},
                    {"k", c.k},
                    {"trans_a", c.trans_a},
                    {"trans_b", c.trans_b},
                    {"path", kernels::host::f32_path_name(c.path)},
                    {"forced", c.forced}});
  }
  return {{"mode", kernels::host::host_gemm_f32_info()}, {"choices", rows}};
}

std::string host_f32_gemm_calibration_note() {
  if (!kernels::host::f32_bf16_math()) return "";
  return kernels::host::f32_bf16_products()
             ? " with bf16 products (MESHRT_HOST_F32_GEMM=bf16)"
             : " on oneDNN in f32 arithmetic (MESHRT_HOST_F32_GEMM=bf16, but oneDNN has no "
               "bf16-product f32 matmul for this CPU)";
}

void print_host_f32_gemm(std::ostream& os) {
  const std::vector<kernels::host::F32Choice> cs = kernels::host::f32_choices();
  if (cs.empty()) return;
  os << "f32 GEMM tiles: " << kernels::host::host_gemm_f32_info() << "\n";
  for (const kernels::host::F32Choice& c : cs) {
    os << "  " << c.m << "x" << c.n << "x" << c.k << " " << (c.trans_a ? "T" : "N")
       << (c.trans_b ? "T" : "N") << "  " << kernels::host::f32_path_name(c.path);
    os << (c.forced ? " (forced)\n" : " (table)\n");
  }
  os << "\n";
}

}  // namespace meshrt::bench
