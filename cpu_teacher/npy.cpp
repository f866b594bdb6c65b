// .npy reading and writing (format versions 1.0 to 3.0 read, 1.0 written).
#include "kdflow/cpu_teacher/npy.hpp"

#include "kdflow/core/atomic_file.hpp"
#include "kdflow/core/error.hpp"
#include "kdflow/core/input_file.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>

#include <fmt/format.h>

namespace kdflow::teacher {

NpyArray read_npy(const std::string& path) {
  check_input_file(path, ".npy file");
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw InputError(fmt::format("{}: cannot read the .npy file", path));
  // What a header may claim is bounded by what the file holds: nothing is allocated past it.
  const auto file_bytes = static_cast<std::uint64_t>(std::max<std::streamoff>(0, in.tellg()));
  in.seekg(0);
  char magic[8] = {};
  in.read(magic, 8);
  if (!in || std::memcmp(magic, "\x93NUMPY", 6) != 0)
    throw InputError(fmt::format("{}: not a .npy file (bad magic)", path));
  std::uint32_t header_len = 0;
  if (magic[6] == 1) {
    std::uint16_t h = 0;
    in.read(reinterpret_cast<char*>(&h), 2);
    header_len = h;
  } else {
    in.read(reinterpret_cast<char*>(&header_len), 4);
  }
  if (header_len > file_bytes)
    throw InputError(
        fmt::format("{}: .npy header of {} bytes in a file of {}", path, header_len, file_bytes));
  std::string header(header_len, '\0');
  in.read(header.data(), header_len);
  if (!in) throw InputError(fmt::format("{}: truncated .npy header", path));
  // The header is a Python dict literal: {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3),
  // }
  const auto value_after = [&](const std::string& key) -> std::string {
    const auto k = header.find("'" + key + "'");
    if (k == std::string::npos)
      throw InputError(fmt::format("{}: .npy header has no {}", path, key));
    const auto colon = header.find(':', k);
    return colon == std::string::npos ? std::string() : header.substr(colon + 1);
  };
  std::string descr = value_after("descr");
  const auto q0 = descr.find('\''), q1 = descr.find('\'', q0 + 1);
  if (q0 == std::string::npos || q1 == std::string::npos)
    throw InputError(fmt::format("{}: .npy header has a bad descr", path));
  descr = descr.substr(q0 + 1, q1 - q0 - 1);
  if (descr != "<f4" && descr != "<f8")
    throw InputError(
        fmt::format("{}: element type '{}' is not float32 ('<f4') or float64", path, descr));
  const std::string order = value_after("fortran_order");
  if (const auto start = order.find_first_not_of(' ');
      start != std::string::npos && order.compare(start, 4, "True") == 0)
    throw InputError(
        fmt::format("{}: Fortran-ordered arrays are not supported (save with C order)", path));
  const std::string shape = value_after("shape");
  const auto open = shape.find('('), close = shape.find(')');
  if (open == std::string::npos || close == std::string::npos)
    throw InputError(fmt::format("{}: .npy header has a bad shape", path));
  NpyArray a;
  // The elements the data after the header can hold: a shape that needs more is refused before
  // anything is allocated (each dimension checked by division, so no product overflows).
  const std::uint64_t element = descr == "<f4" ? 4 : 8;
  const std::uint64_t header_end =
      static_cast<std::uint64_t>(std::max<std::streamoff>(0, in.tellg()));
  const std::uint64_t room = (file_bytes - std::min(file_bytes, header_end)) / element;
  constexpr std::int64_t kMaxDim = std::int64_t{1} << 48;
  std::int64_t dim = -1;
  for (const char ch : shape.substr(open + 1, close - open - 1)) {
    if (ch >= '0' && ch <= '9') {
      dim = (dim < 0 ? 0 : dim) * 10 + (ch - '0');
      if (dim > kMaxDim)
        throw InputError(fmt::format("{}: .npy shape has a dimension over {}", path, kMaxDim));
    } else if (dim >= 0) {
      a.shape.push_back(dim);
      dim = -1;
    }
  }
  if (dim >= 0) a.shape.push_back(dim);
  std::uint64_t n = 1;
  bool empty = false;
  for (const auto d : a.shape) empty = empty || d == 0;
  for (const auto d : a.shape) {
    if (empty) {
      n = 0;
      break;
    }
    if (static_cast<std::uint64_t>(d) > room / n)
      throw InputError(fmt::format("{}: truncated: shape {} needs more data than the file's {} "
                                   "bytes",
                                   path, format_shape(a.shape), file_bytes));
    n *= static_cast<std::uint64_t>(d);
  }
  a.data.resize(n);
  if (descr == "<f4") {
    in.read(reinterpret_cast<char*>(a.data.data()), static_cast<std::streamsize>(n * 4));
  } else {
    std::vector<double> d(n);
    in.read(reinterpret_cast<char*>(d.data()), static_cast<std::streamsize>(n * 8));
    for (std::size_t k = 0; k < n; ++k) a.data[k] = static_cast<float>(d[k]);
  }
  if (!in)
    throw InputError(
        fmt::format("{}: truncated: shape {} needs more data", path, format_shape(a.shape)));
  return a;
}

void write_npy(const std::string& path, const Shape& shape, const float* data) {
  std::string dims;
  for (const auto d : shape) dims += std::to_string(d) + ",";
  if (shape.size() > 1) dims.pop_back();
  std::string header =
      fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}), }}", dims);
  const std::size_t total = 10 + header.size() + 1;
  header += std::string((64 - total % 64) % 64, ' ') + "\n";
  // Whole or not at all (a full disk leaves no partial file): written beside it, then renamed.
  std::string bytes = "\x93NUMPY\x01\x00";
  bytes.resize(8);
  const auto len = static_cast<std::uint16_t>(header.size());
  bytes.append(reinterpret_cast<const char*>(&len), 2);
  bytes += header;
  bytes.append(reinterpret_cast<const char*>(data), static_cast<std::size_t>(numel(shape)) * 4);
  write_file_atomic(path, bytes);
}

} // namespace kdflow::teacher
