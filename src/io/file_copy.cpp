#include "io/file_copy.h"

#include "io/atomic_output.h"

namespace ckpt {

void CopyFileAtomically(const MappedFile& in, const std::string& dest) {
  AtomicOutput out = AtomicOutput::Create(dest, in.size());
  out.RequireUnchanged(in);
  out.CopyFrom(in, 0, 0, in.size());
  out.SetMode(in.mode(), in.uid(), in.gid());
  out.Commit();
}

}  // namespace ckpt
