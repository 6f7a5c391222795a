#include "safetensors/safetensors_file.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <functional>
#include <unordered_set>

#include "base/checked.h"
#include "base/error.h"
#include "base/utf8.h"
#include "safetensors/safetensors_writer.h"

namespace ckpt::safetensors {

namespace {

struct DTypeRow {
  std::string_view name;
  uint32_t bits;
  std::string_view torch;
};

constexpr std::array<DTypeRow, 22> kDTypes = {{
    {"BOOL", 8, "bool"},
    {"F4", 4, "float4_e2m1fn_x2"},  // torch's name: two F4 values per byte
    {"F6_E2M3", 6, "float6_e2m3"},
    {"F6_E3M2", 6, "float6_e3m2"},
    {"U8", 8, "uint8"},
    {"I8", 8, "int8"},
    {"F8_E5M2", 8, "float8_e5m2"},
    {"F8_E4M3", 8, "float8_e4m3fn"},
    {"F8_E8M0", 8, "float8_e8m0fnu"},
    {"F8_E4M3FNUZ", 8, "float8_e4m3fnuz"},
    {"F8_E5M2FNUZ", 8, "float8_e5m2fnuz"},
    {"I16", 16, "int16"},
    {"U16", 16, "uint16"},
    {"F16", 16, "float16"},
    {"BF16", 16, "bfloat16"},
    {"I32", 32, "int32"},
    {"U32", 32, "uint32"},
    {"F32", 32, "float32"},
    {"C64", 64, "complex64"},
    {"F64", 64, "float64"},
    {"I64", 64, "int64"},
    {"U64", 64, "uint64"},
}};

const DTypeRow* FindDType(std::string_view name) {
  for (const DTypeRow& d : kDTypes) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

TensorEntry ReadEntry(const std::string& name, const nlohmann::json& v) {
  return WithContext(fmt::format("tensor '{}'", name), [&] {
    if (!v.is_object()) Fail("entry is not an object");
    TensorEntry t;
    t.name = name;
    auto dtype = v.find("dtype");
    auto shape = v.find("shape");
    auto offsets = v.find("data_offsets");
    if (dtype == v.end() || !dtype->is_string()) Fail("missing or non-string dtype");
    if (shape == v.end() || !shape->is_array()) Fail("missing or non-array shape");
    if (offsets == v.end() || !offsets->is_array() || offsets->size() != 2) {
      Fail("data_offsets is not a [begin, end] pair");
    }
    t.dtype = dtype->get<std::string>();
    const DTypeRow* d = FindDType(t.dtype);
    if (d == nullptr) Fail("unknown dtype '{}'", t.dtype);
    t.bits = d->bits;
    t.torch_dtype = std::string(d->torch);
    uint64_t numel = 1;
    for (const auto& dim : *shape) {
      if (!dim.is_number_unsigned())
        Fail("shape holds a non-negative-integer value {}", dim.dump());
      t.shape.push_back(dim.get<int64_t>());
      numel = CheckedMul(numel, dim.get<uint64_t>());
    }
    for (const auto& o : *offsets) {
      if (!o.is_number_unsigned()) Fail("data_offsets holds {}", o.dump());
    }
    t.begin = (*offsets)[0].get<uint64_t>();
    t.end = (*offsets)[1].get<uint64_t>();
    if (t.end < t.begin) Fail("data_offsets end {} is before begin {}", t.end, t.begin);
    uint64_t bits = CheckedMul(numel, d->bits);
    if (bits % 8) Fail("{} elements of {} do not fill whole bytes", numel, t.dtype);
    if (t.end - t.begin != bits / 8) {
      Fail("holds {} bytes but {} x {} needs {}", t.end - t.begin, t.dtype, numel, bits / 8);
    }
    return t;
  });
}

}  // namespace

uint32_t DTypeBits(std::string_view dtype) {
  const DTypeRow* d = FindDType(dtype);
  return d ? d->bits : 0;
}

bool LooksLikeSafetensors(Bytes file) {
  if (file.size() < 10) return false;
  uint64_t n = LoadLE<uint64_t>(file.data());
  if (n < 2 || n > kMaxHeaderSize || n > file.size() - 8) return false;
  for (uint64_t i = 8; i < 8 + n; ++i) {
    uint8_t c = file[i];
    if (c == '{') return true;
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') return false;
  }
  return false;
}

namespace {

// One pass over the header: each top-level value is built as a small DOM of its own, handed
// to `done` and dropped, so memory stays proportional to one entry, not to the header (a DOM
// of 10^5 entries is ~100 MB). The first top-level key given twice is remembered. (nlohmann's
// callback parser would rescan the parent object after every child: quadratic.)
struct EntryStream : nlohmann::json_sax<nlohmann::json> {
  using Done = std::function<void(const std::string& key, const nlohmann::json& value)>;
  explicit EntryStream(Done d) : done(std::move(d)) {}

  Done done;
  std::unordered_set<std::string> seen;
  std::string duplicate;
  bool top_is_object = false;
  int depth = 0;
  std::string key_at_top;
  nlohmann::json value;                // the top-level value being built
  std::vector<nlohmann::json*> open;   // containers of `value` being filled
  std::vector<std::string> open_keys;  // per open object: its pending key
  std::string error;

  bool Put(nlohmann::json v) {
    if (depth == 0 || !top_is_object) return true;  // the header is not an object
    if (open.empty()) {                             // a scalar top-level value
      done(key_at_top, v);
      return true;
    }
    nlohmann::json* c = open.back();
    if (c->is_array()) {
      c->push_back(std::move(v));
    } else {
      (*c)[open_keys.back()] = std::move(v);
    }
    return true;
  }
  bool Open(nlohmann::json v) {
    if (depth == 0) {
      ++depth;
      top_is_object = v.is_object();
      return true;
    }
    if (!top_is_object) return ++depth, true;
    nlohmann::json* slot;
    if (open.empty()) {
      value = std::move(v);
      slot = &value;
    } else {
      nlohmann::json* c = open.back();
      if (c->is_array()) {
        c->push_back(std::move(v));
        slot = &c->back();
      } else {
        slot = &((*c)[open_keys.back()] = std::move(v));
      }
    }
    open.push_back(slot);
    open_keys.emplace_back();
    ++depth;
    return true;
  }
  bool Close() {
    --depth;
    if (depth == 0 || !top_is_object) return true;
    open.pop_back();
    open_keys.pop_back();
    if (open.empty()) {
      done(key_at_top, value);
      value = nullptr;
    }
    return true;
  }

  bool null() override { return Put(nullptr); }
  bool boolean(bool b) override { return Put(b); }
  bool number_integer(number_integer_t v) override { return Put(v); }
  bool number_unsigned(number_unsigned_t v) override { return Put(v); }
  bool number_float(number_float_t v, const string_t&) override { return Put(v); }
  bool string(string_t& v) override { return Put(std::move(v)); }
  bool binary(binary_t& v) override { return Put(nlohmann::json::binary(std::move(v))); }
  bool start_object(std::size_t) override { return Open(nlohmann::json::object()); }
  bool end_object() override { return Close(); }
  bool start_array(std::size_t) override { return Open(nlohmann::json::array()); }
  bool end_array() override { return Close(); }
  bool key(string_t& k) override {
    if (!top_is_object) return true;  // refused once parsed
    if (depth == 1) {
      if (duplicate.empty() && !seen.insert(k).second) duplicate = k;
      key_at_top = k;
    } else {
      open_keys.back() = k;
    }
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    error = e.what();
    return false;
  }
};

}  // namespace

Header ParseEach(Bytes file, const std::function<void(TensorEntry&&)>& each) {
  ByteCursor c(file);
  if (file.size() < 8) Fail("file too small for a safetensors header ({} bytes)", file.size());
  Header h;
  h.header_size = c.ReadLE<uint64_t>();
  if (h.header_size > kMaxHeaderSize) {
    Fail("header length {} exceeds the {} byte limit", h.header_size, kMaxHeaderSize);
  }
  if (h.header_size > c.remaining()) {
    Fail("header length {} runs past the end of the file ({} bytes)", h.header_size, file.size());
  }
  std::string_view text = c.ReadText(h.header_size);
  h.data_offset = 8 + h.header_size;
  if (!ValidUtf8(text)) Fail("header is not valid UTF-8");

  EntryStream stream([&](const std::string& key, const nlohmann::json& v) {
    if (key == "__metadata__") {
      if (!v.is_object()) Fail("__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m->is_string()) Fail("__metadata__ value for '{}' is not a string", m.key());
        h.metadata[m.key()] = m->get<std::string>();
      }
      return;
    }
    each(ReadEntry(key, v));
  });
  if (!nlohmann::json::sax_parse(text.begin(), text.end(), &stream))
    Fail("header is not valid JSON: {}", stream.error);
  if (!stream.top_is_object) Fail("header is not a JSON object");
  if (!stream.duplicate.empty())
    Fail("tensor name '{}' appears twice in the header", stream.duplicate);
  return h;
}

void CheckTiling(std::vector<Span>& spans, uint64_t data_size,
                 const std::function<std::string_view(size_t)>& name_of) {
  // File order; ties (empty tensors at one offset) by name.
  std::sort(spans.begin(), spans.end(), [&](const Span& a, const Span& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    if (a.end != b.end) return a.end < b.end;
    return name_of(a.id) < name_of(b.id);
  });
  uint64_t expected = 0;
  for (const Span& t : spans) {
    if (t.begin != expected) {
      Fail("tensor '{}' starts at {} but the previous tensor ends at {} ({})", name_of(t.id),
           t.begin, expected, t.begin < expected ? "overlap" : "hole");
    }
    expected = t.end;
  }
  if (expected != data_size) {
    Fail("tensors cover {} bytes of data but the file has {} bytes after the header", expected,
         data_size);
  }
}

File Parse(Bytes file) {
  File f;
  Header h = ParseEach(file, [&](TensorEntry&& e) { f.tensors.push_back(std::move(e)); });
  f.header_size = h.header_size;
  f.data_offset = h.data_offset;
  f.metadata = std::move(h.metadata);
  std::vector<Span> spans;
  spans.reserve(f.tensors.size());
  for (size_t i = 0; i < f.tensors.size(); ++i)
    spans.push_back({f.tensors[i].begin, f.tensors[i].end, i});
  CheckTiling(spans, file.size() - f.data_offset,
              [&](size_t i) -> std::string_view { return f.tensors[i].name; });
  std::vector<TensorEntry> sorted;
  sorted.reserve(spans.size());
  for (const Span& t : spans) sorted.push_back(std::move(f.tensors[t.id]));
  f.tensors = std::move(sorted);
  return f;
}

}  // namespace ckpt::safetensors
