// Where a file's tensor elements are, and how the file is cut into chunks.
//
// The checkpoint readers (torch zip and legacy, safetensors) give every storage's or
// tensor's byte range and dtype; those ranges become typed ranges (bf16, f32, f16, f64;
// complex types as their float parts). Everything else (pickles, zip headers, json, other
// dtypes, files that are not checkpoints or do not parse) is plain bytes. Chunks are
// 256 KiB-1 MiB of original bytes: a tensor that does not fit in the current chunk starts a
// new one once that chunk holds 256 KiB, big tensors are cut into 1 MiB pieces at element
// boundaries, and small tensors and the bytes between them share chunks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <functional>

#include "base/byte_cursor.h"
#include "compress/format.h"

namespace ckpt::ckz {

struct FileLayout {
  FileFormat format = FileFormat::kOther;
  std::vector<TypedRange> ranges;   // sorted, disjoint, whole elements
  std::vector<TensorInfo> tensors;  // for naming chunks and for inspect
};

// Called with ranges of the file the analysis is done with (to drop them from the resident
// set of a mapping): at 10^5 tensors a torch file's records all get a page touched.
using DoneWith = std::function<void(uint64_t offset, uint64_t size)>;

// Never throws for bad input: a file that does not parse is plain bytes.
FileLayout AnalyzeFile(Bytes file, const DoneWith& done_with = {});

// One item of a torch.distributed.checkpoint data file (*.distcp): a torch.save archive of
// one tensor chunk at [offset, offset + length), as its folder's storage_data says; `name`
// names its tensors (the fqn, and the chunk's offsets when it is a piece).
struct ItemSpan {
  uint64_t offset = 0;
  uint64_t length = 0;
  std::string name;
};

// Each item analysed as a file of its own, its ranges and tensors moved to where it sits.
// Items that do not parse (or lie outside the file) stay plain bytes; the format is kOther
// when no item parsed.
FileLayout AnalyzeItems(Bytes file, const std::vector<ItemSpan>& items,
                        const DoneWith& done_with = {});

struct ChunkSpan {
  uint64_t offset = 0;
  uint32_t length = 0;
};

std::vector<ChunkSpan> PlanChunks(uint64_t size, const std::vector<TypedRange>& ranges,
                                  uint64_t min_chunk = kMinChunk, uint64_t max_chunk = kMaxChunk);

}  // namespace ckpt::ckz
