// ckptool._core.Checkpoint: one opened checkpoint (checkpoint/opened_checkpoint.h) with its
// tensors' descriptions and bytes, read into buffers the package allocates (a torch tensor's or a
// numpy array's), with the GIL released.
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <string>

#include "base/error.h"
#include "checkpoint/opened_checkpoint.h"
#include "python/bindings.h"
#include "torch/dtype.h"

namespace py = pybind11;

namespace ckpt::python {

namespace {

using Opened = std::unique_ptr<OpenedCheckpoint>;

// A writable C-contiguous buffer of exactly `size` bytes, or an error.
py::buffer_info WritableBuffer(const py::buffer& b, uint64_t size, const std::string& what) {
  py::buffer_info info = b.request(true);
  uint64_t bytes = static_cast<uint64_t>(info.size) * static_cast<uint64_t>(info.itemsize);
  if (bytes != size) Fail("{}: the buffer holds {} bytes, not {}", what, bytes, size);
  if (info.ndim > 1) {
    py::ssize_t expect = info.itemsize;
    for (py::ssize_t d = info.ndim - 1; d >= 0; --d) {
      if (info.shape[d] > 1 && info.strides[d] != expect)
        Fail("{}: the buffer is not contiguous", what);
      expect *= info.shape[d];
    }
  }
  return info;
}

// Streams `read`'s spans into `dst` (exactly `size` bytes), the GIL released.
template <typename Read>
void Fill(char* dst, uint64_t size, const std::string& what, Read&& read) {
  py::gil_scoped_release release;
  uint64_t at = 0;
  read([&](Bytes span) {
    if (span.size() > size - at) Fail("{}: the input holds more bytes than its shape", what);
    std::memcpy(dst + at, span.data(), span.size());
    at += span.size();
  });
  if (at != size) Fail("{}: the input gave {} of {} bytes", what, at, size);
}

const LogicalTensor& TensorNamed(const OpenedCheckpoint& c, const std::string& name) {
  int64_t i = c.Find(name);
  if (i < 0) {
    PyErr_SetString(PyExc_KeyError, name.c_str());
    throw py::error_already_set();
  }
  return c.model().tensors[static_cast<size_t>(i)];
}

const torch::Model& TorchModel(const OpenedCheckpoint& c, size_t source) {
  if (source >= c.files().size() || !c.files()[source]->torch)
    Fail("{}: file {} is no torch file", c.path(), source);
  return c.files()[source]->torch->model;
}

py::tuple Tuple(const auto& values) {
  py::tuple t(values.size());
  size_t i = 0;
  for (auto v : values) t[i++] = py::int_(v);
  return t;
}

}  // namespace

void BindCheckpoint(py::module_& module) {
  py::class_<OpenedCheckpoint, Opened>(module, "Checkpoint")
      .def_static(
          "open",
          [](const std::string& path, unsigned threads, const std::string& tag) {
            OpenOptions o;
            o.threads = threads;
            o.tag = tag;
            py::gil_scoped_release release;
            return OpenedCheckpoint::Open(path, o);
          },
          py::arg("path"), py::arg("threads") = 0, py::arg("tag") = "")
      .def_property_readonly("path", &OpenedCheckpoint::path)
      .def_property_readonly("kind", &OpenedCheckpoint::kind)
      .def_property_readonly("archived", &OpenedCheckpoint::archived)
      .def_property_readonly("description",
                             [](const OpenedCheckpoint& c) { return c.model().description; })
      .def_property_readonly("warnings", [](const OpenedCheckpoint& c) { return c.Warnings(); })
      .def("names", &OpenedCheckpoint::Names)
      .def("metadata", &OpenedCheckpoint::metadata)
      .def("__contains__",
           [](const OpenedCheckpoint& c, const std::string& name) { return c.Find(name) >= 0; })
      .def("info",
           [](const OpenedCheckpoint& c, const std::string& name) {
             const LogicalTensor& t = TensorNamed(c, name);
             const std::string* file = c.DirectFile(t);
             py::dict d;
             d["name"] = t.name;  // the owner's name when `name` is an alias
             d["dtype"] = std::string(torch::Name(t.stored));
             d["shape"] = Tuple(t.shape);
             d["numel"] = t.numel;
             d["nbytes"] = t.numel * torch::ElementSize(t.stored);
             d["file"] = file ? py::object(py::str(*file)) : py::object(py::none());
             d["offset"] = file ? t.offset : 0;
             return d;
           })
      .def("read_into",
           [](const OpenedCheckpoint& c, const std::string& name, const py::buffer& out) {
             const LogicalTensor& t = TensorNamed(c, name);
             uint64_t size = t.numel * torch::ElementSize(t.stored);
             py::buffer_info b = WritableBuffer(out, size, name);
             Fill(static_cast<char*>(b.ptr), size, name,
                  [&](const SpanSink& sink) { t.read(0, t.numel, sink); });
           })
      // A torch file's own tables, for load(): tensors by index into the file's tensor
      // table, and their storages.
      .def("sources", [](const OpenedCheckpoint& c) { return c.files().size(); })
      .def("is_torch",
           [](const OpenedCheckpoint& c, size_t source) {
             return source < c.files().size() && c.files()[source]->torch.has_value();
           })
      .def("torch_tensor",
           [](const OpenedCheckpoint& c, size_t source, size_t index) {
             const torch::Model& m = TorchModel(c, source);
             if (index >= m.tensors.size()) Fail("{}: no tensor {}", c.path(), index);
             const torch::Tensor& t = m.tensors[index];
             py::dict d;
             d["name"] = t.names.empty() ? std::string() : std::string(t.names.front());
             d["kind"] = t.kind;
             d["dtype"] = std::string(torch::Name(t.dtype));
             d["shape"] = Tuple(t.shape);
             d["stride"] = Tuple(t.stride);
             d["offset"] = t.offset;
             d["storage"] = t.storage;
             d["requires_grad"] = t.requires_grad;
             return d;
           })
      .def("torch_storage",
           [](const OpenedCheckpoint& c, size_t source, size_t index) {
             const torch::Model& m = TorchModel(c, source);
             if (index >= m.storages.size()) Fail("{}: no storage {}", c.path(), index);
             const torch::Storage& s = m.storages[index];
             py::dict d;
             d["key"] = s.key;
             d["nbytes"] = s.nbytes;
             d["dtype"] = std::string(torch::Name(s.dtype));
             d["untyped"] = s.dtype == torch::DType::kUntyped;
             bool direct = s.present && !s.compressed && !c.archived();
             d["file"] = direct ? py::object(py::str(c.files()[source]->path)) : py::none();
             d["offset"] = s.data_offset;
             return d;
           })
      .def("read_storage_into",
           [](const OpenedCheckpoint& c, size_t source, size_t index, const py::buffer& out) {
             const torch::Model& m = TorchModel(c, source);
             if (index >= m.storages.size()) Fail("{}: no storage {}", c.path(), index);
             const torch::Storage& s = m.storages[index];
             std::string what = "storage " + s.key;
             if (!s.present) Fail("{}: {} has no data record", c.path(), what);
             if (s.compressed) Fail("{}: {}'s record is compressed", c.path(), what);
             py::buffer_info b = WritableBuffer(out, s.nbytes, what);
             const MappedFile& map = c.files()[source]->map;
             Fill(static_cast<char*>(b.ptr), s.nbytes, what, [&](const SpanSink& sink) {
               for (uint64_t done = 0; done < s.nbytes;) {
                 uint64_t n = std::min<uint64_t>(s.nbytes - done, 1 << 20);
                 MappedFile::Window w(map, s.data_offset + done, n);
                 sink(w.bytes());
                 done += n;
               }
             });
           });
}

}  // namespace ckpt::python
