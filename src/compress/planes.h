// The dtype-aware byte-plane transform: a chunk's elements are split into planes of one byte
// per element, so that the floating-point exponents (which carry nearly all the redundancy of
// trained weights, and which byte-oriented LZ coders cannot see) sit together in one plane:
//
//   bf16  s eeeeeeee mmmmmmm           -> [eeeeeeee] [s mmmmmmm]
//   f32   s eeeeeeee mmmmmmm m8 m8     -> [eeeeeeee] [s mmmmmmm] [bits 15..8] [bits 7..0]
//   f16   hi lo                        -> [hi] [lo]
//   f64   b7 .. b0                     -> [b7] [b6] ... [b0]
//   bytes                              -> one plane, as they are
//
// Planes are laid out back to back in PlaneShapes() order (format.h); their sizes add up to
// the chunk's length. Split and Join are exact inverses for every bit pattern (NaNs,
// subnormals, negative zero).
#pragma once

#include <cstdint>
#include <vector>

#include "base/byte_cursor.h"
#include "compress/format.h"

namespace ckpt::ckz {

// `src` holds the chunk (runs in order, lengths adding up to src.size()); writes the planes
// to `dst` (src.size() bytes).
void SplitPlanes(Bytes src, const std::vector<Run>& runs, uint8_t* dst);

// The inverse: `planes` (the chunk's length in bytes) back into the chunk at `dst`.
void JoinPlanes(const uint8_t* planes, const std::vector<Run>& runs, uint8_t* dst);
// The same with each plane where it is (one pointer per plane, in PlaneShapes() order), so
// raw planes are read where they are stored.
void JoinPlanes(const std::vector<const uint8_t*>& planes, const std::vector<Run>& runs,
                uint8_t* dst);

}  // namespace ckpt::ckz
