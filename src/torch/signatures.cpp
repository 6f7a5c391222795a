#include "torch/signatures.h"

#include <string>
#include <string_view>
#include <unordered_map>

#include "base/error.h"
#include "torch/dtype.h"

namespace ckpt::torch {

namespace {

// A declaration: the callable as DisplayGlobal spells it, its positions and what it returns.
// Positions, separated by spaces: kinds joined by '|' (data none bool int float str bytes
// tuple list dict set storage tensor inst const, and any: whatever, callables included, for a
// position that hands its argument only to type slots), callable sets ('@rebuilders',
// '@tensor_classes', '@data_types', '@classes', '@bases', '@arrays', '@bitgens',
// '@bitgen_ctor'), '?' before an optional position, and a last '...' when more arguments
// (and keyword arguments) may follow, each taking data.
struct Declaration {
  std::string_view callable;
  std::string_view params;
  Returns returns;
};

// clang-format off
constexpr Declaration kDeclarations[] = {
    // torch/_utils.py: the tensor rebuild functions (argument lists in FORMATS.md, section 2).
    // backward_hooks is an OrderedDict (an instance), metadata a dict.
    {"torch._utils._rebuild_tensor", "storage int tuple tuple", Returns::kTensor},
    {"torch._utils._rebuild_tensor_v2",
     "storage int tuple tuple bool dict|inst|none ?dict|inst|none", Returns::kTensor},
    {"torch._utils._rebuild_tensor_v3",
     "storage int tuple tuple bool dict|inst|none const ?dict|inst|none", Returns::kTensor},
    {"torch._utils._rebuild_parameter", "tensor bool dict|inst|none", Returns::kTensor},
    {"torch._utils._rebuild_parameter_with_state", "tensor bool dict|inst|none data",
     Returns::kTensor},
    {"torch._utils._rebuild_qtensor", "storage int tuple tuple tuple bool dict|inst|none",
     Returns::kTensor},
    {"torch._utils._rebuild_sparse_tensor", "const tuple", Returns::kTensor},
    {"torch._utils._rebuild_sparse_csr_tensor", "const tuple", Returns::kTensor},
    {"torch._utils._rebuild_nested_tensor", "tensor tensor tensor tensor", Returns::kTensor},
    {"torch._utils._rebuild_meta_tensor_no_storage", "const tuple tuple bool", Returns::kTensor},
    // Tensor._make_wrapper_subclass(cls, ...): cls must be a tensor class.
    {"torch._utils._rebuild_wrapper_subclass",
     "@tensor_classes const tuple tuple int const data bool", Returns::kTensor},
    {"torch._utils._rebuild_device_tensor_from_numpy", "inst const data bool", Returns::kTensor},
    {"torch._utils._rebuild_device_tensor_from_cpu_tensor", "tensor const data bool",
     Returns::kTensor},
    {"torch.nested._internal.nested_tensor._rebuild_njt", "...", Returns::kTensor},
    // torch/_tensor.py: ret = func(*args); ret.as_subclass(new_type); then the state.
    {"torch._tensor._rebuild_from_type_v2", "@rebuilders @tensor_classes tuple data",
     Returns::kTensor},
    // Lib/copyreg.py: _reconstructor(cls, base, state) is base.__new__(cls, state) and, unless
    // base is object, base.__init__(obj, state); __newobj__(cls, *args) is cls.__new__(cls,
    // *args); __newobj_ex__(cls, args, kwargs) likewise with keywords.
    {"copyreg._reconstructor", "@classes @bases data", Returns::kInstance},
    {"copyreg.__newobj__", "@classes ...", Returns::kInstance},
    {"copyreg.__newobj_ex__", "@classes tuple dict", Returns::kInstance},
    // defaultdict calls its factory with no arguments for a missing key.
    {"collections.defaultdict", "?none|@data_types ...", Returns::kInstance},
    {"_collections.defaultdict", "?none|@data_types ...", Returns::kInstance},
    // numpy: _reconstruct(subtype, shape, dtype) is ndarray.__new__(subtype, ...); the random
    // state constructors call a bit generator class given in place of its name.
    {"numpy.core.multiarray._reconstruct", "@arrays tuple|int bytes|str", Returns::kInstance},
    {"numpy._core.multiarray._reconstruct", "@arrays tuple|int bytes|str", Returns::kInstance},
    {"numpy.random._pickle.__randomstate_ctor", "?str|inst|@bitgens ?@bitgen_ctor",
     Returns::kInstance},
    {"numpy.random._pickle.__generator_ctor", "?str|inst|@bitgens ?@bitgen_ctor",
     Returns::kInstance},
    {"numpy.random._pickle.__bit_generator_ctor", "?str|@bitgens", Returns::kInstance},
    // Functions that build plain values from data.
    {"_codecs.encode", "str ?str ?str", Returns::kData},
    {"codecs.encode", "str ?str ?str", Returns::kData},
    {"re._compile", "str|bytes int|inst", Returns::kData},
    // How Python >= 3.11 pickles a combined Flag: or_(Flag.A, Flag.B) runs type(a).__or__, a
    // method of the Flag's class, on the two members (of a project's own Flag: opaque).
    {"_operator.or_", "any any", Returns::kCombined},
    {"operator.or_", "any any", Returns::kCombined},
    {"torch.serialization._get_layout", "str", Returns::kData},
};

// Builtin types: classes, and what copyreg may use as a base or defaultdict as a factory.
constexpr std::string_view kBuiltinTypes[] = {
    "builtins.list",      "builtins.dict",  "builtins.set",   "builtins.frozenset",
    "builtins.tuple",     "builtins.int",   "builtins.float", "builtins.str",
    "builtins.bytes",     "builtins.bytearray", "builtins.complex", "builtins.bool",
    "builtins.slice",     "builtins.range", "builtins.object",
};

constexpr std::string_view kDataTypes[] = {
    "builtins.list", "builtins.dict", "builtins.set", "builtins.frozenset", "builtins.tuple",
    "builtins.int", "builtins.float", "builtins.str", "builtins.bytes", "builtins.bytearray",
    "builtins.complex", "builtins.bool", "collections.OrderedDict", "collections.Counter",
    "collections.deque", "collections.defaultdict", "_collections.deque",
    "_collections.defaultdict", "_collections.OrderedDict",
};

constexpr std::string_view kReconstructBases[] = {
    "builtins.object", "builtins.list", "builtins.dict", "builtins.set", "builtins.frozenset",
    "builtins.tuple", "builtins.int", "builtins.float", "builtins.str", "builtins.bytes",
    "builtins.bytearray", "builtins.complex",
};

constexpr std::string_view kTensorClasses[] = {
    "torch.Tensor", "torch.nn.parameter.Parameter", "torch.nn.parameter.Buffer",
    "torch.nn.parameter.UninitializedParameter",
    "torch.nested._internal.nested_tensor.NestedTensor",
};

constexpr std::string_view kArrayClasses[] = {"numpy.ndarray"};

constexpr std::string_view kBitGenerators[] = {
    "numpy.random._mt19937.MT19937", "numpy.random._pcg64.PCG64",
    "numpy.random._pcg64.PCG64DXSM", "numpy.random._philox.Philox", "numpy.random._sfc64.SFC64",
};

// Allowlisted names that are values, not callables (besides dtypes and storage types).
constexpr std::string_view kConstants[] = {
    "torch.per_tensor_affine", "torch.per_channel_affine", "torch.per_tensor_symmetric",
    "torch.per_channel_symmetric", "torch.per_channel_affine_float_qparams",
    "torch.contiguous_format", "torch.channels_last", "torch.channels_last_3d",
    "torch.preserve_format", "torch.strided", "torch.sparse_coo", "torch.sparse_csr",
    "torch.sparse_csc", "torch.sparse_bsr", "torch.sparse_bsc", "torch._mkldnn", "torch.jagged",
    "builtins.Ellipsis", "builtins.NotImplemented", "deepspeed.checkpoint.constants.ZERO_STAGE",
};

// Allowlisted functions (lowercase names that are not types).
constexpr std::string_view kFunctions[] = {
    "builtins.len", "builtins.abs", "builtins.min", "builtins.max", "builtins.sum",
    "builtins.round", "builtins.sorted", "builtins.any", "builtins.all", "builtins.divmod",
    "_operator.or_", "operator.or_", "numpy.core.multiarray.scalar",
    "numpy._core.multiarray.scalar", "numpy.core.numeric._frombuffer",
    "numpy._core.numeric._frombuffer",
};

// Enums whose members pickle as getattr(Class, 'NAME') (Python >= 3.11).
constexpr std::string_view kEnums[] = {
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.runtime.zero.offload_config.OffloadDeviceEnum",
    "transformers.trainer_utils.IntervalStrategy", "transformers.trainer_utils.SchedulerType",
    "transformers.trainer_utils.HubStrategy", "transformers.trainer_utils.SaveStrategy",
    "transformers.trainer_utils.EvaluationStrategy", "transformers.trainer_utils.FSDPOption",
    "transformers.trainer_utils.ShardedDDPOption", "transformers.training_args.OptimizerNames",
    "transformers.training_args.ParallelMode", "transformers.debug_utils.DebugOption",
    "transformers.utils.generic.PaddingStrategy", "transformers.utils.generic.TensorType",
    "accelerate.utils.dataclasses.DistributedType", "accelerate.utils.dataclasses.PrecisionType",
    "accelerate.utils.dataclasses.DynamoBackend", "accelerate.utils.dataclasses.RNGType",
    "megatron.core.enums.ModelType", "megatron.core.transformer.enums.AttnMaskType",
    "megatron.core.transformer.enums.AttnType", "megatron.core.transformer.enums.AttnBackend",
    "megatron.core.transformer.enums.ModelType", "megatron.model.enums.AttnMaskType",
    "megatron.model.enums.AttnType", "megatron.model.enums.LayerType",
    "megatron.model.enums.PositionEmbeddingType",
    "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING",
    "torch.distributed._shard.sharded_tensor.metadata.MEM_FORMAT_ENCODING",
    "torch.distributed.checkpoint.planner.WriteItemType",
    "torch.distributed.checkpoint.planner.LoadItemType", "uuid.SafeUUID",
    "lightning.pytorch.trainer.states.TrainerStatus", "lightning.pytorch.trainer.states.TrainerFn",
    "lightning.pytorch.trainer.states.RunningStage",
    "pytorch_lightning.trainer.states.TrainerStatus",
    "pytorch_lightning.trainer.states.TrainerFn",
    "pytorch_lightning.trainer.states.RunningStage",
};
// clang-format on

template <size_t N>
bool In(std::string_view name, const std::string_view (&list)[N]) {
  for (std::string_view s : list) {
    if (s == name) return true;
  }
  return false;
}

std::string_view LastPart(std::string_view display) {
  size_t dot = display.rfind('.');
  return dot == std::string_view::npos ? display : display.substr(dot + 1);
}

uint16_t KindOfWord(std::string_view w) {
  static const std::pair<std::string_view, uint16_t> kWords[] = {
      {"data", kVData},     {"none", kVNone},     {"bool", kVBool},   {"int", kVInt | kVBool},
      {"float", kVFloat},   {"str", kVStr},       {"bytes", kVBytes}, {"tuple", kVTuple},
      {"list", kVList},     {"dict", kVDict},     {"set", kVSet},     {"storage", kVStorage},
      {"tensor", kVTensor}, {"inst", kVInstance}, {"const", kVConst}, {"any", kVAny},
  };
  for (const auto& [word, kinds] : kWords) {
    if (word == w) return kinds;
  }
  throw Error("internal: unknown kind '" + std::string(w) + "' in a signature");
}

CallableSet SetOfWord(std::string_view w) {
  static const std::pair<std::string_view, CallableSet> kSets[] = {
      {"rebuilders", CallableSet::kTensorRebuilders},
      {"tensor_classes", CallableSet::kTensorClasses},
      {"data_types", CallableSet::kDataTypes},
      {"classes", CallableSet::kClasses},
      {"bases", CallableSet::kReconstructBases},
      {"arrays", CallableSet::kArrayClasses},
      {"bitgens", CallableSet::kBitGenerators},
      {"bitgen_ctor", CallableSet::kBitGeneratorCtor},
  };
  for (const auto& [word, set] : kSets) {
    if (word == w) return set;
  }
  throw Error("internal: unknown callable set '@" + std::string(w) + "' in a signature");
}

Signature Parse(std::string_view text, Returns returns) {
  Signature s;
  s.variadic = false;
  s.keywords = false;
  s.returns = returns;
  while (!text.empty()) {
    size_t space = text.find(' ');
    std::string_view word = text.substr(0, space);
    text = space == std::string_view::npos ? std::string_view() : text.substr(space + 1);
    if (word == "...") {
      s.variadic = s.keywords = true;
      continue;
    }
    Param p;
    p.kinds = 0;
    if (word.starts_with('?')) {
      p.optional = true;
      word.remove_prefix(1);
    }
    while (!word.empty()) {
      size_t bar = word.find('|');
      std::string_view alt = word.substr(0, bar);
      word = bar == std::string_view::npos ? std::string_view() : word.substr(bar + 1);
      if (alt.starts_with('@')) {
        p.callables = SetOfWord(alt.substr(1));
      } else {
        p.kinds |= KindOfWord(alt);
      }
    }
    if (s.count == Signature::kMaxParams) throw Error("internal: a signature too long");
    s.params[s.count++] = p;
  }
  return s;
}

const std::unordered_map<std::string_view, Signature>& Declared() {
  static const std::unordered_map<std::string_view, Signature> table = [] {
    std::unordered_map<std::string_view, Signature> t;
    for (const Declaration& d : kDeclarations) t.emplace(d.callable, Parse(d.params, d.returns));
    return t;
  }();
  return table;
}

bool IsTensorClass(std::string_view display) {
  if (In(display, kTensorClasses)) return true;
  // The legacy tensor types: torch.FloatTensor, torch.cuda.HalfTensor...
  std::string_view module = display.substr(0, display.size() - LastPart(display).size());
  return (module == "torch." || module == "torch.cuda.") && LastPart(display).ends_with("Tensor") &&
         LastPart(display) != "Tensor";
}

}  // namespace

Signature SignatureOf(std::string_view display) {
  const auto& t = Declared();
  if (auto it = t.find(display); it != t.end()) return it->second;
  Signature s;  // data everywhere
  s.returns = IsAllowedClass(display) ? Returns::kInstance : Returns::kData;
  if (display.starts_with("torch._utils._rebuild_")) s.returns = Returns::kTensor;
  return s;
}

bool IsAllowedConstant(std::string_view display) {
  if (In(display, kConstants)) return true;
  std::string_view name = LastPart(display);
  if (display == std::string("torch.") + std::string(name) && FromName(name)) return true;
  // Legacy storage types (torch.FloatStorage...): torch.load maps any name holding "Storage"
  // to a StorageType it never calls (torch/serialization.py, UnpicklerWrapper.find_class).
  return (display.starts_with("torch.") && name.ends_with("Storage"));
}

bool IsAllowedEnum(std::string_view display) {
  return In(display, kEnums);
}

bool IsAllowedClass(std::string_view display) {
  if (IsAllowedConstant(display) || In(display, kFunctions)) return false;
  if (In(display, kBuiltinTypes) || IsTensorClass(display) || In(display, kDataTypes)) return true;
  std::string_view name = LastPart(display);
  size_t first = name.find_first_not_of('_');
  if (first == std::string_view::npos) return false;
  if (name[first] >= 'A' && name[first] <= 'Z') return true;
  // Lowercase classes of the allowlist.
  static constexpr std::string_view kLowercase[] = {
      "numpy.dtype",
      "numpy.ndarray",
      "datetime.datetime",
      "datetime.date",
      "datetime.time",
      "datetime.timedelta",
      "datetime.timezone",
      "torch.device",
      "builtins.NoneType",
      "builtins.reversed",
      "builtins.enumerate",
      "builtins.zip",
      "deepspeed.utils.tensor_fragment.fragment_address",
  };
  return In(display, kLowercase);
}

bool InCallableSet(CallableSet set, std::string_view display) {
  switch (set) {
    case CallableSet::kNone:
      return false;
    case CallableSet::kTensorRebuilders:
      return display.starts_with("torch._utils._rebuild_") ||
             display == "torch.nested._internal.nested_tensor._rebuild_njt";
    case CallableSet::kTensorClasses:
      return IsTensorClass(display);
    case CallableSet::kDataTypes:
      return In(display, kDataTypes);
    case CallableSet::kClasses:
      return IsAllowedClass(display);
    case CallableSet::kReconstructBases:
      return In(display, kReconstructBases);
    case CallableSet::kArrayClasses:
      return In(display, kArrayClasses);
    case CallableSet::kBitGenerators:
      return In(display, kBitGenerators);
    case CallableSet::kBitGeneratorCtor:
      return display == "numpy.random._pickle.__bit_generator_ctor";
  }
  return false;
}

const char* CallableSetName(CallableSet set) {
  switch (set) {
    case CallableSet::kNone:
      return "no callable";
    case CallableSet::kTensorRebuilders:
      return "a tensor rebuild function";
    case CallableSet::kTensorClasses:
      return "a tensor class";
    case CallableSet::kDataTypes:
      return "a builtin data type";
    case CallableSet::kClasses:
      return "an allowlisted class";
    case CallableSet::kReconstructBases:
      return "object or a builtin data type";
    case CallableSet::kArrayClasses:
      return "numpy.ndarray";
    case CallableSet::kBitGenerators:
      return "a numpy bit generator class";
    case CallableSet::kBitGeneratorCtor:
      return "numpy's bit generator constructor";
  }
  return "?";
}

}  // namespace ckpt::torch
