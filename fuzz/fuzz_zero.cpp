// Fuzz target: DeepSpeed ZeRO consolidation (deepspeed/zero_checkpoint.h) over rank files
// given in one input as records [u8 role: even = model states, odd = optimizer][u32 LE
// length][bytes of a torch file]. Besides not crashing, every tensor it maps must be made of
// pieces that add up to its elements and lie inside their file; so must every parameter's
// optimizer state (ConsolidateOptimizerState, what reshard writes), and every tensor of the rank
// files planned for 1 and 3 ranks (PlanRankFiles, what reshard --to zero writes), each a
// tensor node of its file's graph.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "base/endian.h"
#include "base/error.h"
#include "deepspeed/zero_checkpoint.h"
#include "deepspeed/zero_rank_plan.h"
#include "piece_checks.h"
#include "torch/torch_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ckpt;
  std::vector<Bytes> models, optims;
  for (size_t at = 0; at + 5 <= size && models.size() + optims.size() < 16;) {
    uint8_t role = data[at];
    uint32_t len = LoadLE<uint32_t>(data + at + 1);
    at += 5;
    if (len > size - at) len = static_cast<uint32_t>(size - at);
    (role % 2 ? optims : models).push_back(Bytes(data + at, len));
    at += len;
  }
  deepspeed::ZeroCheckpoint z;
  z.folder = "fuzz";
  std::vector<Bytes> inputs;
  try {
    for (const std::vector<Bytes>* group : {&models, &optims}) {
      for (Bytes b : *group) {
        auto f = std::make_unique<CheckpointFile>();
        // Named like rank 0's files: reshard --to zero names the files it plans after them.
        f->path = group == &models ? "zero_pp_rank_0_mp_rank_00_model_states.pt"
                                   : "zero_pp_rank_0_mp_rank_00_optim_states.pt";
        std::optional<Format> format = DetectFormat(b);
        if (!format || *format == Format::kSafetensors) return 0;
        f->torch =
            *format == Format::kTorchZip ? torch::ReadTorchZip(b) : torch::ReadTorchLegacy(b);
        z.files.push_back(std::move(f));
        inputs.push_back(b);
      }
      if (group == &models) z.model_files = z.files.size();
    }
    deepspeed::Consolidate(z);
  } catch (const Error&) {
    return 0;
  }
  for (const deepspeed::ZeroTensor& t : z.tensors)
    fuzz::CheckPieces(t.pieces, t.numel, t.stored, inputs);
  // The optimizer state, laid out as the fp32 weights (what reshard writes): every key's
  // pieces inside their file and adding up to the parameter's elements.
  deepspeed::ZeroOptimizerState os;
  try {
    os = deepspeed::ConsolidateOptimizerState(z);
  } catch (const Error&) {
    return 0;
  }
  if (os.dtypes.size() != os.keys.size()) std::abort();
  for (const deepspeed::ZeroOptimizerState::Param& p : os.params) {
    if (p.tensor >= z.tensors.size() || p.pieces.size() != os.keys.size()) std::abort();
    if (p.group < 0 || static_cast<size_t>(p.group) >= os.steps.size()) std::abort();
    for (size_t k = 0; k < os.keys.size(); ++k)
      fuzz::CheckPieces(p.pieces[k], z.tensors[p.tensor].numel, os.dtypes[k], inputs);
  }
  for (int world : {1, 3}) {
    try {
      deepspeed::CheckRepartition(z, os, world);
      for (int rank : {0, world - 1}) {
        for (const deepspeed::PlannedRankFile& plan :
             deepspeed::PlanRankFiles(z, os, world, rank)) {
          for (const auto& [node, t] : plan.tensors) {
            if (node >= plan.graph.nodes.size() || plan.graph.kind(node) != pickle::Kind::kObject) {
              std::abort();  // not a call node to make the tensor of
            }
            fuzz::CheckPieces(t.pieces, t.numel, t.stored, inputs, /*zeros_allowed=*/true);
          }
        }
      }
    } catch (const Error&) {
      continue;
    }
  }
  return 0;
}
