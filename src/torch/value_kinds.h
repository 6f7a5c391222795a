// The verdict's engine: abstract interpretation of a pickle's graph over value kinds.
//
// Every node gets a kind (torch/signatures.h: None, numbers, strings, containers, storages,
// tensors, instances, constants, callables, opaque) and a purity bit: *pure* when neither it
// nor anything it holds is callable or opaque. Every call, BUILD, APPEND(S), ADDITEMS and
// SETITEM(S) the pickle makes is then judged by what Python's unpickler (Modules/_pickle.c)
// would really do with those values:
//
//   calls      REDUCE, NEWOBJ, NEWOBJ_EX, INST and OBJ call what they name. Accepted only when
//              the callable is an imported global on torch's weights_only list or ckptool's
//              allowlist (or trusted) and every argument fits its declared position: data
//              (pure) unless the position is declared to take a callable from a named set. A
//              computed callable (what a call returned, an item of a container) is refused,
//              as is a class instantiated without a call (NEWOBJ with no arguments,
//              copyreg.__newobj__, copyreg._reconstructor) unless allowlisted: its __setstate__
//              runs.
//   BUILD      _pickle.c looks __setstate__ up on the instance, so a first BUILD's dict state
//              can plant one that a second BUILD calls. Accepted only on an instance of an
//              accepted class, at most once per object, with a pure state whose dict keys are
//              strings and no dunder names. Pure state is never callable, so whatever it
//              plants (an `extend`, a `keys`) cannot be called.
//   APPEND(S), ADDITEMS, SETITEM(S) on an object call its extend/append/add/__setitem__:
//              accepted only on an instance of an accepted class.
//   getattr    (Python >= 3.11 Enum members: getattr(Class, 'NAME')) accepted only on an
//              allowlisted Enum class (or a trusted module's class) with a public name; the
//              result is a constant. The lookup itself runs the target's code (a module's
//              __getattr__, a descriptor), so any other target is refused, and any other form
//              of getattr is an unsafe import.
//
// Impurity spreads up through containers and into the calls that receive it until nothing
// changes (a worklist over the reverse edges): linear in the graph.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "pickle/graph.h"
#include "torch/global_lists.h"
#include "torch/signatures.h"
#include "torch/trust.h"

namespace ckpt::torch {

// One thing the pickle would do that the verdict refuses.
struct Refusal {
  pickle::NodeId node = pickle::kNil;
  std::string what;    // "calls builtins.print", "BUILD twice on collections.OrderedDict"...
  std::string called;  // the unlisted global called or instantiated (what --trust would
                       // accept); else empty
};

// Does the call make an instance without calling its class (NEWOBJ or NEWOBJ_EX with no
// arguments)? Such a class's __new__ and __setstate__ run, not code the file chose to call.
bool MakesWithoutCall(const pickle::Graph& g, pickle::NodeId call);

class ValueKinds {
 public:
  ValueKinds(const pickle::Graph& g, const Trust& trust);

  // For a call (kObject): accepted as the declared data constructor it calls, with its BUILD,
  // APPEND(S) and SETITEM(S). For a global: it may be imported (on a list, or trusted, and
  // not denied). Other nodes: always.
  bool accepted(pickle::NodeId id) const { return !refused_[id]; }
  bool pure(pickle::NodeId id) const { return !impure_[id]; }
  uint16_t kind(pickle::NodeId id) const { return kind_[id]; }

  // Globals: called (by a refused call), instantiated without a call, or read through getattr.
  bool called(pickle::NodeId global) const { return use_[global] & kCalled; }
  bool rebuilt(pickle::NodeId global) const { return use_[global] & kRebuilt; }
  bool trusted(pickle::NodeId global) const { return use_[global] & kTrustedUse; }
  // A getattr global every use of which is an attribute read of read shape.
  bool reads_only(pickle::NodeId global) const { return use_[global] & kReadsOnly; }
  // For a call getattr(G, 'S') accepted as an attribute read: G (else kNil).
  bool is_attribute_read(pickle::NodeId call) const { return use_[call] & kAttributeRead; }

  // In node order.
  const std::vector<Refusal>& refusals() const { return refusals_; }

 private:
  enum : uint8_t {
    kCalled = 1,
    kRebuilt = 2,
    kTrustedUse = 4,
    kReadsOnly = 8,
    kAttributeRead = 16,
  };
  void InitLeaves();
  void BuildParents();
  void DecideGetattr();
  std::string JudgePersistentId(pickle::NodeId id);
  void Spread();
  void MarkImpure(pickle::NodeId id, pickle::NodeId witness);
  // Judges a call and what was applied to it; marks it refused (and impure) with a reason.
  void JudgeObject(pickle::NodeId id);
  std::string JudgeCall(pickle::NodeId id);
  std::string JudgeApplied(pickle::NodeId id);
  std::string JudgeAttributeRead(pickle::NodeId id);
  std::string Fits(pickle::NodeId arg, const Param& p, const std::string& callee, size_t position);
  // What the verdict knows of an imported global, looked up once per global node (torch.save
  // memoises its globals: one node serves every tensor).
  struct GlobalInfo {
    std::string name;  // DisplayGlobal
    GlobalClass cls = GlobalClass::kOther;
    bool listed = false;  // on torch's weights_only list or ckptool's allowlist
    Signature sig;
  };
  const GlobalInfo& Info(pickle::NodeId global);
  std::string Name(pickle::NodeId global) const;
  bool PlainDtypeState(pickle::NodeId call, pickle::NodeId state) const;
  std::string WhatIs(pickle::NodeId id) const;  // names what made a node impure
  void Refuse(pickle::NodeId id, std::string why, std::string called = "");

  const pickle::Graph& g_;
  const Trust& trust_;
  std::vector<uint16_t> kind_;
  std::vector<uint8_t> impure_;
  std::vector<uint8_t> refused_;
  std::vector<uint8_t> use_;
  std::vector<pickle::NodeId> witness_;  // the callable, opaque or refused node within
  // Reverse edges (compressed): the parents of node i are parents_[first_[i] .. first_[i+1]).
  std::vector<uint32_t> first_;
  std::vector<pickle::NodeId> parents_;
  std::vector<pickle::NodeId> work_;
  pickle::NodeId frontier_ = 0;  // calls below it have been judged
  std::vector<Refusal> refusals_;
  std::unordered_map<pickle::NodeId, GlobalInfo> info_;
};

}  // namespace ckpt::torch
