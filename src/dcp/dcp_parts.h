// What the files of the torch.distributed.checkpoint reader share (dcp_checkpoint.cpp: opening
// and metadata; dcp_items.cpp: one item's archive; dcp_resolve.cpp: items to tensors and the
// chunk grid; dcp_read.cpp: range reads). Not for use outside dcp/.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dcp/dcp_checkpoint.h"

namespace ckpt::dcp {

// "(0, 128)", "(4,)": offsets and shapes as Python prints them.
std::string OffsetsText(const std::vector<int64_t>& v);
// An item's key: its fqn and chunk offsets.
std::string KeyOf(const std::string& fqn, const std::vector<int64_t>& offsets);

// Reads one item's archive (decompressed when transformed) and what it holds: the object's
// bytes, or the chunk's tensor, checked against the metadata's description of it.
void ReadItem(Checkpoint& c, Item& item, const EntryMeta* meta, const ChunkMeta* chunk);

// From c.meta and c.files: the items, the tensors and their chunk grids, and every problem.
void Resolve(Checkpoint& c);

}  // namespace ckpt::dcp
