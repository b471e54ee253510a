#include "model/dump.h"

#include <cstdio>

#include "runtime/error.h"
#include "runtime/safetensors.h"

namespace meshrt {

void add_param_entries(const std::vector<Param*>& params, std::vector<DumpEntry>& out) {
  for (Param* p : params) {
    out.push_back({p->name, p->value, p->placements});
    out.push_back({p->name + ".grad", p->grad, p->placements});
  }
}

namespace {
// Round-trips a float: 9 significant digits.
std::string exact(double v) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.9g", v);
  return b;
}
}  // namespace

std::map<std::string, std::string> block_metadata(const BlockConfig& cfg) {
  return {{"meshrt.hidden", std::to_string(cfg.hidden)},
          {"meshrt.ffn", std::to_string(cfg.ffn)},
          {"meshrt.heads", std::to_string(cfg.heads)},
          {"meshrt.norm", cfg.norm == NormKind::LayerNorm ? "layernorm" : "rmsnorm"},
          {"meshrt.norm_eps", exact(cfg.eps)},
          {"meshrt.gelu", ops::gelu_kind_name(cfg.gelu)},
          {"meshrt.bias", cfg.bias ? "1" : "0"},
          {"meshrt.init_std", exact(cfg.init_std)},
          {"meshrt.param_noise", exact(cfg.param_noise)},
          {"meshrt.seed", std::to_string(cfg.seed)},
          {"meshrt.dtype", dtype_name(cfg.dtype)},
          {"meshrt.causal", cfg.causal ? "1" : "0"}};
}

int dump_safetensors(const std::string& path, const DeviceMesh& mesh,
                     const std::vector<DumpEntry>& entries,
                     const std::map<std::string, std::string>& metadata) {
  MESHRT_CHECK(!path.empty(), "dump: empty file name");
  Stream& s = mesh.ctx().compute_stream();
  NamedTensors full;
  for (const DumpEntry& e : entries) {
    MESHRT_CHECK(e.local.defined(), "dump: tensor '" << e.name << "' is undefined");
    full.emplace_back(e.name, full_tensor(e.local, mesh, e.placements, s));
  }
  s.synchronize();
  if (mesh.rank() != 0) return 0;
  std::map<std::string, std::string> md = metadata;
  md["meshrt.mesh"] = mesh.str();
  SafetensorsWriteOptions wo;
  wo.what = "--dump";
  save_safetensors(path, full, s, md, wo);
  return static_cast<int>(full.size());
}

}  // namespace meshrt
