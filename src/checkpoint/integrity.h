// Damage, as opposed to danger: what `verify` finds wrong with the bytes and structure of a
// checkpoint (a record failing its CRC32, a safetensors file shorter than its header says, a DCP
// item beyond the end of its file, a ZeRO rank missing, an archive chunk failing its checksum),
// leaving out what would run code when loaded (an intact file can be unsafe; the commands judge
// that on their own, with --trust).
//
// Every command that writes from a checkpoint's bytes without rewriting them record by record
// (compress; the policy's retention and steps) asks here first, so that a damaged checkpoint is
// refused or reported, never carried into an archive whose checksums would then vouch for it,
// and never counted as a good checkpoint kept.
#pragma once

#include <string>
#include <vector>

#include "torch/model.h"

namespace ckpt {

// The damage verify finds in every checkpoint at `path` (a file, a folder of checkpoints, a
// model, ZeRO or DCP folder, or a .ckz archive), each named "checkpoint path: where". A
// checkpoint that cannot be opened at all is one problem with its error. A folder holding no
// checkpoint has none. Reads every byte a checksum covers (`threads` at a time).
// `checksums` false: structure only (sizes, headers, directories, ranks, chunks), without the
// pass that reads every byte of a torch file for its CRC32s: catches what a cut or missing file
// does, not a flipped bit.
std::vector<torch::Problem> FindDamage(const std::string& path, unsigned threads,
                                       bool checksums = true);

// "where: what" of the first damage ("; N problems in all" when there are more), its place
// named below `path`: for the reports of the folders that hold the checkpoints.
std::string DescribeDamage(const std::vector<torch::Problem>& damage, const std::string& path);

// Throws ckpt::Error naming the first damage and how many there are in all, with `refusal`
// ("not compressed") said; does nothing when FindDamage finds none.
void RefuseDamaged(const std::string& path, unsigned threads, const std::string& refusal);

}  // namespace ckpt
