// ckptool._core.load_graph: a torch file's pickle as the Python objects torch.load would
// return, built from the parsed graph (pickle/graph.h) without importing or calling anything
// the pickle names, except the globals the reviewed allowlist (torch/global_policy.h) or the
// caller's trust accepts. Containers, numbers, strings and bytes are made here; tensors,
// storages, accepted globals and inert records of everything else come from the package's
// hooks (python/ckptool/_load.py).
#include <pybind11/stl.h>

#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "base/error.h"
#include "checkpoint/opened_checkpoint.h"
#include "python/bindings.h"
#include "torch/global_policy.h"

namespace py = pybind11;

namespace ckpt::python {

namespace {

using pickle::Construct;
using pickle::Graph;
using pickle::Kind;
using pickle::kNil;
using pickle::NodeId;

// Deeper nesting than this is refused, as Python's own recursion limit would.
constexpr int kMaxDepth = 1000;

class GraphLoader {
 public:
  GraphLoader(const OpenedCheckpoint& c, size_t source, py::object hooks,
              const std::vector<std::string>& trust)
      : g_(c.files()[source]->torch->model.graph),
        m_(c.files()[source]->torch->model),
        source_(source),
        hooks_(std::move(hooks)) {
    torch::Trust t;
    t.patterns = trust;
    // Only what the verdict accepted node by node is built for real: a call whose callable and
    // every argument fit a declared data constructor, a global that may be imported. Anything
    // else becomes an inert record, so nothing the verdict refused can run here.
    accepted_ = torch::ScanPickle(g_, t).accepted;
    for (size_t i = 0; i < m_.tensors.size(); ++i) {
      if (m_.tensors[i].node != kNil) tensor_of_.emplace(m_.tensors[i].node, i);
    }
    for (const auto& [node, storage] : m_.bare_refs) storage_of_.emplace(node, storage);
    ordered_dict_ = py::module_::import("collections").attr("OrderedDict");
  }

  py::object Root() {
    if (g_.root == kNil) Fail("the pickle holds no object");
    return Convert(g_.root, 0);
  }

 private:
  py::object Convert(NodeId id, int depth) {
    if (auto it = memo_.find(id); it != memo_.end()) return it->second;
    if (depth > kMaxDepth) Fail("the pickle nests objects more than {} levels deep", kMaxDepth);
    const pickle::Node& n = g_.at(id);
    switch (n.kind) {
      case Kind::kNone:
        return py::none();
      case Kind::kBool:
        return py::bool_(n.boolean);
      case Kind::kInt:
        return py::int_(n.integer);
      case Kind::kBigInt: {
        std::string_view b = g_.text(id);
        py::bytes raw(b.data(), b.size());
        return py::module_::import("builtins")
            .attr("int")
            .attr("from_bytes")(raw, "little", py::arg("signed") = true);
      }
      case Kind::kFloat:
        return py::float_(n.real);
      case Kind::kStr: {
        std::string_view s = g_.text(id);
        // Strings are kept as the stream's UTF-8; lone surrogates (which pickle allows) are
        // kept with surrogatepass, as _pickle.c does.
        PyObject* o =
            PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "surrogatepass");
        if (!o) throw py::error_already_set();
        return Memo(id, py::reinterpret_steal<py::object>(o));
      }
      case Kind::kBytes: {
        std::string_view s = g_.text(id);
        return Memo(id, py::bytes(s.data(), s.size()));
      }
      case Kind::kByteArray: {
        std::string_view s = g_.text(id);
        return Memo(id, py::bytearray(s.data(), s.size()));
      }
      case Kind::kTuple:
        return Tuple(id, depth);
      case Kind::kList: {
        py::list l;
        Memo(id, l);
        for (NodeId c : g_.items(id)) l.append(Convert(c, depth + 1));
        return l;
      }
      case Kind::kDict: {
        py::dict d;
        Memo(id, d);
        FillPairs(d, id, depth);
        return d;
      }
      case Kind::kSet:
      case Kind::kFrozenSet: {
        py::list items;
        for (NodeId c : g_.items(id)) items.append(Convert(c, depth + 1));
        py::object s = n.kind == Kind::kSet
                           ? py::object(py::set(items))
                           : py::reinterpret_steal<py::object>(PyFrozenSet_New(items.ptr()));
        if (!s) throw py::error_already_set();
        return Memo(id, s);
      }
      case Kind::kGlobal:
        return Memo(id, Global(id));
      case Kind::kPersId:
        if (auto it = storage_of_.find(id); it != storage_of_.end())
          return Memo(id, hooks_.attr("storage")(source_, it->second));
        return Memo(id, hooks_.attr("persistent")(Convert(g_.compound(id).args, depth + 1)));
      case Kind::kObject:
        return Object(id, depth);
    }
    Fail("internal: node {} of an unknown kind", id);
  }

  py::object Memo(NodeId id, py::object o) {
    memo_.emplace(id, o);
    return o;
  }

  py::object Tuple(NodeId id, int depth) {
    if (!building_.insert(id).second)
      Fail("a tuple holds itself (through a list or dict): not supported");
    auto items = g_.items(id);
    py::tuple t(items.size());
    for (size_t i = 0; i < items.size(); ++i) t[i] = Convert(items[i], depth + 1);
    building_.erase(id);
    // A child may have reached this tuple through the memo meanwhile: keep that one.
    if (auto it = memo_.find(id); it != memo_.end()) return it->second;
    return Memo(id, std::move(t));
  }

  void FillPairs(py::object target, NodeId id, int depth) {
    auto p = g_.pairs(id);
    for (size_t i = 0; i + 1 < p.size(); i += 2) {
      py::object k = Convert(p[i], depth + 1);
      target[k] = Convert(p[i + 1], depth + 1);
    }
  }

  py::object Global(NodeId id) {
    std::string module(g_.global_module(id)), name(g_.global_name(id));
    if (accepted_[id]) return hooks_.attr("resolve")(module, name);
    return hooks_.attr("pickled")(module, name, false);
  }

  py::object Object(NodeId id, int depth) {
    if (auto t = tensor_of_.find(id); t != tensor_of_.end())
      return Memo(id, hooks_.attr("tensor")(source_, t->second));
    const pickle::Compound& c = g_.compound(id);
    NodeId fn = c.callable;
    bool global = fn != kNil && g_.kind(fn) == Kind::kGlobal;
    std::string text = global ? g_.GlobalText(fn) : std::string();
    auto args = [&]() -> py::object {
      return c.args == kNil ? py::object(py::tuple()) : Convert(c.args, depth + 1);
    };
    py::object obj;
    bool accepted = accepted_[id] != 0;
    if (std::string read = AttributeRead(id); !read.empty()) {
      // getattr(Class, 'NAME'): how Python 3.11 pickles an Enum member. Judged as the read
      // Class.NAME (torch/global_policy.h): resolved when accepted, else an inert record of
      // the name; getattr itself is never called.
      NodeId cls = g_.Arg(id, 0);
      std::string module(g_.global_module(cls));
      std::string name =
          std::string(g_.global_name(cls)) + "." + std::string(g_.text(g_.Arg(id, 1)));
      if (accepted) return Memo(id, hooks_.attr("resolve")(module, name));
      return Memo(id, hooks_.attr("pickled")(module, name, false));
    } else if (accepted && text == "collections.OrderedDict") {
      obj = ordered_dict_();
      Memo(id, obj);
      // OrderedDict([(k, v), ...]): the pairs as its argument.
      if (c.args != kNil && g_.ArgCount(id) == 1)
        obj.attr("update")(Convert(g_.Arg(id, 0), depth + 1));
    } else if (accepted && text == "_codecs.encode" && g_.ArgCount(id) == 2 &&
               g_.kind(g_.Arg(id, 0)) == Kind::kStr && g_.kind(g_.Arg(id, 1)) == Kind::kStr) {
      // Protocol 2's bytes: encode(text, 'latin1').
      py::str s = Convert(g_.Arg(id, 0), depth + 1);
      obj = Memo(id, s.attr("encode")(Convert(g_.Arg(id, 1), depth + 1)));
    } else if (global && accepted) {
      py::object callee = Convert(fn, depth + 1);
      py::object kwargs = c.kwargs == kNil ? py::object(py::dict()) : Convert(c.kwargs, depth + 1);
      obj = Memo(id, hooks_.attr("call")(callee, args(), kwargs, static_cast<int>(c.construct)));
    } else {
      std::string module = global ? std::string(g_.global_module(fn)) : std::string();
      std::string name = global ? std::string(g_.global_name(fn)) : std::string("<computed>");
      obj = Memo(id, hooks_.attr("pickled")(module, name, true));
      obj.attr("args") = args();
      if (c.kwargs != kNil) obj.attr("kwargs") = Convert(c.kwargs, depth + 1);
      if (!global) obj.attr("callable") = Convert(fn, depth + 1);
      auto states = g_.states(id);
      if (!states.empty()) obj.attr("state") = Convert(states.back(), depth + 1);
      py::list items;
      for (NodeId i : g_.items(id)) items.append(Convert(i, depth + 1));
      if (!items.empty()) obj.attr("items") = items;
      py::list pairs;
      auto p = g_.pairs(id);
      for (size_t i = 0; i + 1 < p.size(); i += 2)
        pairs.append(py::make_tuple(Convert(p[i], depth + 1), Convert(p[i + 1], depth + 1)));
      if (!pairs.empty()) obj.attr("pairs") = pairs;
      return obj;
    }
    // What BUILD, APPEND(S) and SETITEM(S) applied to an object the allowlist accepts.
    for (NodeId s : g_.states(id)) {
      py::object r = hooks_.attr("build")(obj, Convert(s, depth + 1));
      if (!r.is_none()) obj = r;
    }
    for (NodeId i : g_.items(id)) obj.attr("append")(Convert(i, depth + 1));
    FillPairs(obj, id, depth);
    return obj;
  }

  // "pkg.Class.NAME" for a call getattr(Class, 'NAME') with exactly those arguments (a global
  // and a str, no keywords, made by REDUCE); "" otherwise.
  std::string AttributeRead(NodeId id) const {
    NodeId fn = g_.compound(id).callable;
    if (fn == kNil || g_.kind(fn) != Kind::kGlobal) return "";
    std::string_view module = g_.global_module(fn), name = g_.global_name(fn);
    if (name != "getattr" || (module != "builtins" && module != "__builtin__")) return "";
    if (g_.compound(id).kwargs != kNil || g_.compound(id).construct != Construct::kReduce ||
        g_.ArgCount(id) != 2)
      return "";
    NodeId cls = g_.Arg(id, 0), attr = g_.Arg(id, 1);
    if (g_.kind(cls) != Kind::kGlobal || g_.kind(attr) != Kind::kStr || g_.text(attr).empty())
      return "";
    return g_.GlobalText(cls) + "." + std::string(g_.text(attr));
  }

  const Graph& g_;
  const torch::Model& m_;
  size_t source_;
  py::object hooks_;
  py::object ordered_dict_;
  std::vector<uint8_t> accepted_;  // per node (torch::PickleScan::accepted)
  std::unordered_map<NodeId, size_t> tensor_of_;
  std::unordered_map<NodeId, int32_t> storage_of_;
  std::unordered_map<NodeId, py::object> memo_;
  std::unordered_set<NodeId> building_;
};

}  // namespace

void BindLoad(py::module_& m) {
  m.def(
      "load_graph",
      [](const OpenedCheckpoint& c, size_t source, py::object hooks,
         const std::vector<std::string>& trust) {
        if (source >= c.files().size() || !c.files()[source]->torch)
          Fail("{}: file {} is no torch file", c.path(), source);
        GraphLoader loader(c, source, std::move(hooks), trust);
        return loader.Root();
      },
      py::arg("checkpoint"), py::arg("source"), py::arg("hooks"), py::arg("trust"));
}

}  // namespace ckpt::python
