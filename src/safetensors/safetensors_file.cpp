#include "safetensors/safetensors_file.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
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
    {"F4", 4, "float4_e2m1"},
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

uint32_t DTypeBits(const std::string& dtype) {
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

// A SAX pass that finds the first top-level key given twice. (A parse callback could do it
// in the same pass, but nlohmann's callback parser rescans the parent object at the end of
// every child object: quadratic in the number of tensors.)
struct DuplicateKeys : nlohmann::json_sax<nlohmann::json> {
  std::unordered_set<std::string> seen;
  std::string first;
  int depth = 0;

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return ++depth, true; }
  bool end_object() override { return --depth, true; }
  bool start_array(std::size_t) override { return ++depth, true; }
  bool end_array() override { return --depth, true; }
  bool key(string_t& k) override {
    if (depth == 1 && first.empty() && !seen.insert(k).second) first = k;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }
};

}  // namespace

File Parse(Bytes file) {
  ByteCursor c(file);
  if (file.size() < 8) Fail("file too small for a safetensors header ({} bytes)", file.size());
  File f;
  f.header_size = c.ReadLE<uint64_t>();
  if (f.header_size > kMaxHeaderSize) {
    Fail("header length {} exceeds the {} byte limit", f.header_size, kMaxHeaderSize);
  }
  if (f.header_size > c.remaining()) {
    Fail("header length {} runs past the end of the file ({} bytes)", f.header_size, file.size());
  }
  std::string_view text = c.ReadText(f.header_size);
  f.data_offset = 8 + f.header_size;
  if (!ValidUtf8(text)) Fail("header is not valid UTF-8");

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    Fail("header is not valid JSON: {}", e.what());
  }
  // The DOM keeps one value per key; the stream is read again for the names it repeats.
  DuplicateKeys duplicates;
  nlohmann::json::sax_parse(text.begin(), text.end(), &duplicates);
  if (!duplicates.first.empty())
    Fail("tensor name '{}' appears twice in the header", duplicates.first);
  if (!header.is_object()) Fail("header is not a JSON object");

  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) Fail("__metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) Fail("__metadata__ value for '{}' is not a string", m.key());
        f.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    f.tensors.push_back(ReadEntry(it.key(), *it));
  }
  std::stable_sort(f.tensors.begin(), f.tensors.end(),
                   [](const TensorEntry& a, const TensorEntry& b) {
                     return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
                   });
  uint64_t expected = 0;
  for (const TensorEntry& t : f.tensors) {
    if (t.begin != expected) {
      Fail("tensor '{}' starts at {} but the previous tensor ends at {} ({})", t.name, t.begin,
           expected, t.begin < expected ? "overlap" : "hole");
    }
    expected = t.end;
  }
  uint64_t buffer = file.size() - f.data_offset;
  if (expected != buffer) {
    Fail("tensors cover {} bytes of data but the file has {} bytes after the header", expected,
         buffer);
  }
  return f;
}

}  // namespace ckpt::safetensors
