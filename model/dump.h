// Dumps of sharded tensors: every rank passes its shards, rank 0 writes the gathered full tensors
// to one safetensors file (inputs, weights, outputs, gradients), so results can be checked
// against other frameworks.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "model/blocks.h"

namespace meshrt {

struct DumpEntry {
  std::string name;
  Tensor local;
  std::vector<Placement> placements;  // one per mesh dim
};

// Adds "<param>" and "<param>.grad" entries for each parameter.
void add_param_entries(const std::vector<Param*>& params, std::vector<DumpEntry>& out);

// What a dump needs besides its tensors to recompute a block: "meshrt.hidden", ".ffn", ".heads",
// ".norm" (layernorm | rmsnorm), ".norm_eps", ".gelu" (tanh | erf), ".bias" (0 | 1),
// ".init_std", ".param_noise", ".seed", ".dtype" and ".causal" (1 unless the config turned it off).
std::map<std::string, std::string> block_metadata(const BlockConfig& cfg);

// Collective over the mesh: gathers every entry (full_tensor) and rank 0 writes them, in order,
// to `path` with `metadata`. Returns the number of tensors written (0 on other ranks).
int dump_safetensors(const std::string& path, const DeviceMesh& mesh,
                     const std::vector<DumpEntry>& entries,
                     const std::map<std::string, std::string>& metadata = {});

}  // namespace meshrt
