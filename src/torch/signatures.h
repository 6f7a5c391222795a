// The declared signatures of the data constructors a pickle may call: for each allowlisted
// callable, the kind of value each argument position takes and the kind of value the call
// returns. The verdict (torch/value_kinds.h) accepts a call only when every argument fits.
//
// Two rules make the declarations short and the verdict sound:
//   - An argument position takes *data* unless declared otherwise: None, numbers, strings,
//     bytes, storages, tensors, instances of allowlisted classes, allowlisted constants
//     (dtypes, layouts, Enum members) and containers holding only those. Data is never
//     callable, so whatever a constructor does with data, it cannot run a function the
//     file chose.
//   - A callable (a function or class the pickle imported) is accepted only in a position
//     declared to take one, and only from that position's declared set: the tensor rebuild
//     functions for _rebuild_from_type_v2's `func`, the tensor classes for its `new_type`,
//     the data types for defaultdict's factory... These are the places where the constructor
//     calls what it is given (torch/_tensor.py, Lib/copyreg.py, numpy/random/_pickle.py).
#pragma once

#include <cstdint>
#include <string_view>

namespace ckpt::torch {

// What a value is, as far as the verdict is concerned (one bit each, so a position can take
// several).
enum ValueKind : uint16_t {
  kVNone = 1 << 0,
  kVBool = 1 << 1,
  kVInt = 1 << 2,
  kVFloat = 1 << 3,
  kVStr = 1 << 4,
  kVBytes = 1 << 5,
  kVTuple = 1 << 6,
  kVList = 1 << 7,
  kVDict = 1 << 8,
  kVSet = 1 << 9,
  kVStorage = 1 << 10,
  kVTensor = 1 << 11,
  kVInstance = 1 << 12,  // made by an accepted call of an allowlisted (or trusted) class
  kVConst = 1 << 13,     // an allowlisted global that is a value: a dtype, an Enum member...
  kVData = (1 << 14) - 1,
  kVCallable = 1 << 14,  // an imported function or class
  kVOpaque = 1 << 15,    // anything else: an unlisted import, the result of a refused call
  kVAny = 0xffff,        // a position that only hands its argument to type slots (a | b)
};

// The sets of callables a position may be declared to take.
enum class CallableSet : uint8_t {
  kNone,
  kTensorRebuilders,  // torch._utils._rebuild_tensor_v2 and the other rebuild functions
  kTensorClasses,     // torch.Tensor, Parameter, Buffer, the legacy torch.*Tensor types
  kDataTypes,         // builtins.list, dict, set, int...: what defaultdict may call
  kClasses,           // any allowlisted or trusted class (what copyreg makes)
  kReconstructBases,  // builtins.object and the builtin data types (copyreg._reconstructor)
  kArrayClasses,      // numpy.ndarray (numpy's _reconstruct)
  kBitGenerators,     // numpy's bit generator classes
  kBitGeneratorCtor,  // numpy.random._pickle.__bit_generator_ctor
};

struct Param {
  uint16_t kinds = kVData;
  CallableSet callables = CallableSet::kNone;
  bool optional = false;
};

// What a call returns.
enum class Returns : uint8_t {
  kData,      // a value that is not an instance BUILD may give state to (len, encode...)
  kInstance,  // an instance of the class called (or of the class it was given)
  kTensor,    // a tensor (BUILD may give it state, as torch's own pickles of old did)
  kCombined,  // data when every argument is; else opaque (operator.or_ of two Flags)
};

struct Signature {
  static constexpr int kMaxParams = 8;
  Param params[kMaxParams];
  uint8_t count = 0;     // declared positions
  bool variadic = true;  // more arguments than `count` take data
  bool keywords = true;  // keyword arguments (NEWOBJ_EX) take data
  Returns returns = Returns::kData;
};

// The signature of the allowlisted callable `display` ("torch._utils._rebuild_tensor_v2", as
// DisplayGlobal spells it). Callables not declared take data in every position; they return
// an instance when they are classes.
Signature SignatureOf(std::string_view display);

// Is the allowlisted global `display` a class (an instance-making callable) rather than a
// function or a constant?
bool IsAllowedClass(std::string_view display);

// Is it a constant rather than a callable (dtypes, layouts, memory formats, qschemes, the
// legacy storage types torch.load maps to StorageType)?
bool IsAllowedConstant(std::string_view display);

// Is it an Enum whose members a pickle may read as getattr(Class, 'NAME')?
bool IsAllowedEnum(std::string_view display);

// Is `display` in the set?
bool InCallableSet(CallableSet set, std::string_view display);
const char* CallableSetName(CallableSet set);  // "a tensor rebuild function"...

}  // namespace ckpt::torch
