#include "mesh/dump.h"

#include "runtime/error.h"
#include "runtime/safetensors.h"

namespace meshrt {

void add_param_entries(const std::vector<Param*>& params, std::vector<DumpEntry>& out) {
  for (Param* p : params) {
    out.push_back({p->name, p->value, p->placements});
    out.push_back({p->name + ".grad", p->grad, p->placements});
  }
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
  save_safetensors(path, full, s, md);
  return static_cast<int>(full.size());
}

}  // namespace meshrt
