// torch.load tries the pre-0.4 tar format first on a file it opens itself: a file that
// Python's tarfile opens (TarInfo.frombuf accepts its first header: checksum and number
// fields, no 'ustar' magic needed) is refused, with what legacy_load would unpickle from it.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/error.h"
#include "test_util.h"
#include "torch/torch_file.h"

namespace ckpt::torch {
namespace {

using test::B;
using test::P;

bool Has(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

std::string LegacyError(const std::string& f) {
  return test::ErrorOf([&] { ReadTorchLegacy(B(f)); });
}

void Put(std::string& h, size_t at, std::string_view field) {
  h.replace(at, field.size(), field);
}

// Writes the checksum field as tarfile's calc_chksums sums the block (the field as spaces).
void Checksum(std::string& h, bool signed_sum = false) {
  Put(h, 148, "        ");
  int64_t sum = 0;
  for (char c : h) sum += signed_sum ? static_cast<int8_t>(c) : static_cast<uint8_t>(c);
  Put(h, 148, fmt::format("{:06o}", sum));
  h[154] = '\0';
  h[155] = ' ';
}

// An old V7 header (no 'ustar' magic): name, octal number fields, type.
std::string Header(std::string_view name, uint64_t size, char type = '0',
                   std::string_view linkname = "") {
  std::string h(512, '\0');
  Put(h, 0, name);
  Put(h, 100, "0000644");
  Put(h, 108, "0000000");
  Put(h, 116, "0000000");
  Put(h, 124, fmt::format("{:011o}", size));
  Put(h, 136, "00000000000");
  h[156] = type;
  Put(h, 157, linkname);
  Checksum(h);
  return h;
}

std::string Member(std::string_view name, const std::string& data) {
  return Header(name, data.size()) + data + std::string((512 - data.size() % 512) % 512, '\0');
}

std::string Tar(const std::vector<std::string>& members) {
  std::string out;
  for (const std::string& m : members) out += m;
  return out + std::string(1024, '\0');
}

std::string Count(uint8_t n) {
  return P().proto(2).op('K').op(n).stop().bytes();
}
std::string EmptyList() {
  return P().proto(2).op(']').stop().bytes();
}
std::string System() {
  return P().proto(2).global("posix", "system").str("touch x").op(0x85).op('R').stop().bytes();
}

// What torch 1.13/2.13's legacy_load reads: 'storages', 'tensors', then 'pickle'.
std::string TorchTar(const std::string& storages, const std::string& tensors,
                     const std::string& pickle) {
  return Tar({Member("storages", storages), Member("tensors", tensors), Member("pickle", pickle)});
}

const std::string kBenignObject = P().proto(2).op('}').stop().bytes();

TEST(LegacyTar, V7TarIsRefusedNamingWhatItsPickleMemberRuns) {
  std::string f = TorchTar(Count(0) + EmptyList(), Count(0), System());
  EXPECT_TRUE(LooksLikeTorchLegacy(B(f)));
  std::string err = LegacyError(f);
  EXPECT_TRUE(Has(err, "a pre-0.4 tar checkpoint")) << err;
  EXPECT_TRUE(Has(err,
                  "torch.load unpickles its 'pickle' member (the object), which imports "
                  "posix.system"))
      << err;
  EXPECT_TRUE(Has(err, "ckptool does not read this format")) << err;
}

TEST(LegacyTar, BenignTarIsStillRefused) {
  std::string f = TorchTar(Count(0) + EmptyList(), Count(0), kBenignObject);
  std::string err = LegacyError(f);
  EXPECT_TRUE(Has(err,
                  "no pickle torch.load would unpickle from it imports or calls anything "
                  "unsafe. ckptool does not read this format"))
      << err;
}

// The storages member is read as legacy_load reads it: count, then per storage a
// (key, location, class) pickle and int64 numel + numel * element size bytes, then views.
TEST(LegacyTar, StoragesAndTensorsAreFollowedToTheObject) {
  std::string args = P().proto(2)
                         .str("0")
                         .str("cpu")
                         .global("torch", "DoubleStorage")
                         .op(0x87)  // TUPLE3
                         .stop()
                         .bytes();
  std::string storages = Count(1) + args;
  AppendLE<int64_t>(storages, 3);
  storages += std::string(24, 'v');  // 3 doubles, which may hold anything
  storages += System();              // the views
  std::string tensor = P().proto(2).str("t").str("0").none().op(0x87).stop().bytes();
  std::string tensors = Count(1) + tensor;
  AppendLE<int32_t>(tensors, 2);
  tensors += std::string(4 + 16 + 16 + 8, '\0');
  std::string err = LegacyError(TorchTar(storages, tensors, System()));
  EXPECT_TRUE(Has(err,
                  "torch.load unpickles its 'storages' member (the storage views), which "
                  "imports posix.system"))
      << err;
  EXPECT_TRUE(Has(err, "; then its 'pickle' member (the object), which imports posix.system"))
      << err;
}

TEST(LegacyTar, StoragesMemberRunsFirst) {
  std::string err = LegacyError(TorchTar(System(), Count(0), kBenignObject));
  EXPECT_TRUE(Has(err, "its 'storages' member (the storage count), which imports posix.system"))
      << err;
  EXPECT_TRUE(Has(err,
                  "(the storage count) is not an int, so ckptool follows the member no "
                  "further"))
      << err;
}

TEST(LegacyTar, LinksAndMissingMembersAreSaid) {
  std::string f = Tar({Header("storages", 0, '2', "/etc/passwd"), Member("pickle", System())});
  EXPECT_TRUE(LooksLikeTorchLegacy(B(f)));
  std::string err = LegacyError(f);
  EXPECT_TRUE(Has(err, "its 'storages' member is a symbolic link to '/etc/passwd'")) << err;
  err = LegacyError(Tar({Member("pickle", System())}));
  EXPECT_TRUE(Has(err, "it has no 'storages' member, so torch.load fails there")) << err;
  EXPECT_FALSE(LooksLikeTorchLegacy(B(Tar({Member("readme", "hello")}))));
}

// The last member of a name is the one tarfile.getmember returns; a pax header's path
// renames the member after it.
TEST(LegacyTar, MembersAreNamedAsTarfileNamesThem) {
  std::string pax = "17 path=storages\n";
  std::string f = Tar({Member("storages", Count(0) + EmptyList()), Member("tensors", Count(0)),
                       Header("pax", pax.size(), 'x') + pax + std::string(512 - pax.size(), '\0'),
                       Member("whatever", System()), Member("pickle", kBenignObject)});
  std::string err = LegacyError(f);
  EXPECT_TRUE(Has(err, "its 'storages' member (the storage count), which imports posix.system"))
      << err;
}

TEST(LegacyTar, TarfileFailingOnItsMembersIsSaid) {
  std::string f = Member("storages", Count(0)) + Header("tensors", 100000);
  std::string err = LegacyError(f);
  EXPECT_TRUE(Has(err,
                  "then fails listing its members (member 'tensors' runs past the end of "
                  "the file); torch.load then reads the file from its start"))
      << err;
}

TEST(LegacyTar, EmptyTarIsSaid) {
  EXPECT_TRUE(Has(LegacyError(std::string(600, '\0')), "its first 512 bytes are all NUL"));
}

// A legacy torch file is a stream of pickles; its first 512 bytes can also be a tar header
// that tarfile accepts, and then torch.load reads the tar.
TEST(LegacyTar, LegacyMagicThatIsAlsoATarHeaderIsRefusedAsTar) {
  std::string magic = P().proto(2)
                          .raw(std::string("\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19", 12))
                          .stop()
                          .bytes();
  std::string first = Header(magic, 512);  // the name field holds the magic-number pickle
  std::string f = first + Count(0) + std::string(512 - Count(0).size(), '\0');
  f += Member("storages", Count(0) + EmptyList()) + Member("tensors", Count(0)) +
       Member("pickle", System()) + std::string(1024, '\0');
  EXPECT_TRUE(LooksLikeTorchLegacy(B(f)));
  std::string err = LegacyError(f);
  EXPECT_TRUE(Has(err, "a pre-0.4 tar checkpoint")) << err;
  EXPECT_TRUE(Has(err, "'pickle' member (the object), which imports posix.system")) << err;
  // 'ustar' alone, without a checksum tarfile accepts, is no tar.
  std::string bad = f;
  Put(bad, 257, "ustar");
  EXPECT_FALSE(Has(LegacyError(bad), "tar checkpoint")) << LegacyError(bad);
}

// tarfile.nti and calc_chksums, field by field.
TEST(LegacyTar, HeaderChecksAreTarfiles) {
  const std::string data = Count(0) + EmptyList();
  auto refused_as_tar = [&](const std::string& header) {
    std::string f = header + data + std::string(512 - data.size(), '\0');
    f += Member("tensors", Count(0)) + Member("pickle", kBenignObject) + std::string(1024, '\0');
    return Has(LegacyError(f), "a pre-0.4 tar checkpoint");
  };
  std::string h = Header("storages", data.size());
  EXPECT_TRUE(refused_as_tar(h));
  auto with = [&](size_t at, std::string_view field, bool signed_sum = false) {
    std::string copy = h;
    Put(copy, at, field);
    Checksum(copy, signed_sum);
    return copy;
  };
  // Number fields tarfile reads: spaces, sign, 0o prefix, underscores, NUL ends, base 256.
  for (std::string_view mode :
       {std::string_view("  644  \0", 8), std::string_view("+0o644\0\0", 8),
        std::string_view("0_6_4_4\0", 8), std::string_view("\0xyz\0\0\0\0", 8),
        std::string_view("\x80\0\0\0\0\0\x01\xa4", 8),
        std::string_view("\xff\xff\xff\xff\xff\xff\xff\xff", 8),
        std::string_view("-7\t\x1c\0\0\0\0", 8), std::string_view("0o_644\0\0", 8)}) {
    EXPECT_TRUE(refused_as_tar(with(100, mode))) << mode;
  }
  for (std::string_view mode :
       {std::string_view("0000648\0", 8), std::string_view("6 44\0\0\0\0", 8),
        std::string_view("_644\0\0\0\0", 8), std::string_view("64__4\0\0\0", 8),
        std::string_view("644_\0\0\0\0", 8), std::string_view("0o\0\0\0\0\0\0", 8),
        std::string_view("+\0\0\0\0\0\0\0", 8), std::string_view("\xc3\xa9\0\0\0\0\0\0", 8),
        std::string_view("0x1a4\0\0\0", 8), std::string_view("0o__644\0", 8)}) {
    EXPECT_FALSE(refused_as_tar(with(100, mode))) << mode;
  }
  // The signed sum counts too (bytes >= 0x80 in the name); one off is refused.
  std::string high = with(20, "\xe9\xe9\xe9", /*signed_sum=*/true);
  EXPECT_TRUE(refused_as_tar(high));
  std::string off = h;
  off[153]++;
  EXPECT_FALSE(refused_as_tar(off));
  // The checksum in base 256.
  std::string b256 = h;
  int64_t sum = 256;
  for (size_t i = 0; i < 512; ++i) sum += (i >= 148 && i < 156) ? 0 : static_cast<uint8_t>(h[i]);
  b256[148] = '\x80';
  for (int i = 0; i < 7; ++i) b256[155 - i] = static_cast<char>((sum >> (8 * i)) & 0xFF);
  EXPECT_TRUE(refused_as_tar(b256));
  // A GNU sparse header ('S') needs its sparse fields to parse too.
  std::string sparse = with(156, "S");
  EXPECT_TRUE(refused_as_tar(sparse));
  Put(sparse, 386, "9");
  Checksum(sparse);
  EXPECT_FALSE(refused_as_tar(sparse));
}

}  // namespace
}  // namespace ckpt::torch
