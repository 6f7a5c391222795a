#include "cli/command_table.h"

namespace ckpt::cli {

namespace {

constexpr CommandInfo kCommands[] = {
    {"inspect", "Account for every byte of checkpoints: tensors, storages, waste, globals",
     AddInspect, false, true},
    {"verify", "Check CRCs, structure and views; exit 1 on any problem", AddVerify, true, true},
    {"shrink", "Drop storage bytes no tensor uses; rewrite safely in place or to --output-dir",
     AddShrink, true, false},
    {"convert",
     "Store float32 tensors as bf16 or fp16 (torch and safetensors files, model folders)",
     AddConvert, true, false},
    {"export", "Write a checkpoint's tensors as safetensors (optionally bf16/fp16, sharded)",
     AddExport, true, false},
    {"strip", "Remove optimizer/scheduler/RNG state (or --drop paths) from checkpoints", AddStrip,
     true, false},
    {"prune", "Retention policy for a folder of checkpoints (dry run unless --yes)", AddPrune,
     false, false},
    {"compress", "Lossless tensor-aware archive of files or folders (PATH -> PATH.ckz)",
     AddCompress, true, false},
    {"decompress", "Restore a .ckz archive bit for bit (X.ckz -> X)", AddDecompress, true, false},
    {"apply", "Run the team's policy (ckptool.toml) once over every complete checkpoint", AddApply,
     false, false},
    {"watch", "Run the policy on each checkpoint as it completes, beside training", AddWatch, false,
     false},
    {"latest", "Print the newest checkpoint under a folder that is complete and verifies",
     AddLatest, false, true},
    {"manifest", "Write a manifest of a checkpoint: SHA-256 of every file, digest of every tensor",
     AddManifest, false, false},
    {"reshard",
     "Rewrite a DeepSpeed ZeRO checkpoint for another world size (universal, or M ranks' files)",
     AddReshard, true, false},
};

}  // namespace

std::span<const CommandInfo> Commands() {
  return kCommands;
}

const CommandInfo* FindCommand(std::string_view name) {
  for (const CommandInfo& c : kCommands) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

}  // namespace ckpt::cli
