// .npy reading and writing: see npy.h.
#include "tools/generate/npy.h"

#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dsv4::npy {

int64_t Array::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::Status WriteF32(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  std::string dims = absl::StrJoin(shape, ", ");
  if (shape.size() == 1) dims += ",";
  std::string header = absl::StrCat("{'descr': '<f4', 'fortran_order': False, 'shape': (", dims, "), }");
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream out(path, std::ios::binary);
  if (!out) return absl::InvalidArgumentError(absl::StrCat("cannot open ", path, " for writing"));
  const uint16_t hlen = static_cast<uint16_t>(header.size());
  out.write("\x93NUMPY\x01\x00", 8);
  out.write(reinterpret_cast<const char*>(&hlen), 2);
  out << header;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  out.write(reinterpret_cast<const char*>(data), n * 4);
  if (!out) return absl::DataLossError(absl::StrCat("write to ", path, " failed"));
  return absl::OkStatus();
}

absl::StatusOr<Array> Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string bytes = ss.str();
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0)
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a .npy file"));
  size_t hlen, off;
  if (bytes[6] == 1) {
    hlen = static_cast<uint8_t>(bytes[8]) | (static_cast<uint8_t>(bytes[9]) << 8);
    off = 10;
  } else {
    uint32_t h;
    std::memcpy(&h, bytes.data() + 8, 4);
    hlen = h;
    off = 12;
  }
  if (bytes.size() < off + hlen) return absl::InvalidArgumentError(absl::StrCat(path, ": truncated header"));
  const std::string header = bytes.substr(off, hlen);
  std::smatch m;
  Array a;
  if (!std::regex_search(header, m, std::regex("'descr':\\s*'([^']+)'")))
    return absl::InvalidArgumentError(absl::StrCat(path, ": no descr"));
  a.descr = m[1];
  int width = 0;
  if (a.descr == "<f4" || a.descr == "<i4") width = 4;
  else if (a.descr == "<i2") width = 2;
  else if (a.descr == "<i8") width = 8;
  else return absl::InvalidArgumentError(absl::StrCat(path, ": unsupported descr ", a.descr));
  if (header.find("'fortran_order': True") != std::string::npos)
    return absl::InvalidArgumentError(absl::StrCat(path, ": fortran order unsupported"));
  if (!std::regex_search(header, m, std::regex("'shape':\\s*\\(([^)]*)\\)")))
    return absl::InvalidArgumentError(absl::StrCat(path, ": no shape"));
  const std::string dims = m[1];
  const std::regex digits("\\d+");
  for (std::sregex_iterator it(dims.begin(), dims.end(), digits), end; it != end; ++it)
    a.shape.push_back(std::stoll(it->str()));
  const size_t nbytes = static_cast<size_t>(a.numel()) * width;
  if (bytes.size() != off + hlen + nbytes)
    return absl::InvalidArgumentError(absl::StrCat(path, ": expected ", nbytes, " data bytes, found ", bytes.size() - off - hlen));
  a.data.assign(bytes.begin() + off + hlen, bytes.end());
  return a;
}

}  // namespace dsv4::npy
