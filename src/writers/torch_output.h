// The verified writer of a new torch file from tensors (writers/tensor_source.h), the torch twin
// of WriteSafetensorsModel: what `torch.save(state_dict, path)` writes for an OrderedDict of
// contiguous CPU tensors, one storage each (torch 1.13 .. 2.x layout, pickle protocol 2, the
// records 64-byte aligned), loadable with torch.load(weights_only=True). Aliases become the
// same tensor object under a second key, as `sd[alias] = sd[owner]` pickles. The file is
// written in parallel pieces to a temp file, fsynced, read back with ckptool's own reader and
// checked (names, dtypes, shapes, every record's CRC) before it is renamed into place.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "io/mapped_file.h"
#include "pickle/graph.h"
#include "writers/tensor_source.h"

namespace ckpt {

struct TorchOutputOptions {
  unsigned threads = 1;
  std::vector<const MappedFile*> inputs;  // refused at commit if any changed meanwhile
  // What the pickle's root is: the state dict (an OrderedDict name -> tensor); DeepSpeed's
  // universal checkpoint parameter file, the dict {'cat_dim': 0, 'param': T} of the one tensor
  // given (its name is not written); or the one tensor itself.
  enum class Root { kStateDict, kUniversalParam, kTensor };
  Root root = Root::kStateDict;
};

// Writes `tensors` (in this order, then `aliases`: alias -> kept name) to the file `path`.
// Returns the tensor bytes written.
uint64_t WriteTorchModel(const std::string& path, std::vector<TensorSource> tensors,
                         const std::map<std::string, std::string>& aliases,
                         const TorchOutputOptions& options);

// A tensor of an object graph to write: the call node that becomes it (a new one, or a tensor's
// rebuild call whose bytes are replaced) and what it holds.
struct GraphTensor {
  pickle::NodeId node = pickle::kNil;
  TensorSource source;
};

// Writes the object graph `graph` (from its root) as a torch file, each of `tensors` a
// contiguous tensor with a storage of its own (record i holds tensors[i]); read back and checked
// like WriteTorchModel. Every tensor the graph reaches must be one of `tensors`: a rebuild call
// left as it was would name a storage the file does not hold, and is refused at the read-back.
// Returns the tensor bytes written.
uint64_t WriteTorchObject(const std::string& path, pickle::Graph graph,
                          std::vector<GraphTensor> tensors, const TorchOutputOptions& options);

}  // namespace ckpt
