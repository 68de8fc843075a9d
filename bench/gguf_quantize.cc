// Tensor-data helper of bench/gguf_write.py (the Python script writes the GGUF header and
// calls this for the bulk conversion, which pure Python cannot do at 1B weights).
//
//   gguf_quantize OUT_FILE < jobs
//
// Each line of jobs: SRC_PATH SRC_OFFSET SRC_DTYPE ROWS COLS PERM_HEADS OUT_TYPE DST_OFFSET
//   SRC_DTYPE: F32 | BF16 | F16 (row-major [ROWS, COLS] at byte SRC_OFFSET of SRC_PATH)
//   PERM_HEADS: 0, or n_head for llama.cpp's q/k row permutation (convert_hf_to_gguf's
//     LlamaModel.permute: within each head of ROWS/n_head rows, output row 2*i+j is input
//     row j*(head_dim/2)+i, turning the HF "rotate half" layout into interleaved pairs)
//   OUT_TYPE: F32 | F16 | Q8_0, written with pwrite at byte DST_OFFSET of OUT_FILE (which
//     must already exist with its final size).
// Q8_0 follows ggml's quantize_row_q8_0_ref: per block of 32, d = max|x| / 127,
// q = roundf(x * (1/d)), d stored as fp16 (round to nearest even), 34 bytes per block.
// The source is memory-mapped and converted row by row into an 8 MiB buffer, so memory
// stays small whatever the model size.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "gguf_quantize: %s\n", what.c_str());
  std::exit(1);
}

float F16ToF32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000 | (mant << 13);
  } else if (exp == 0) {
    const float v = std::ldexp(float(mant), -24);
    std::memcpy(&bits, &v, 4);
    bits |= sign;
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, like numpy's astype(float16) and ggml's GGML_FP32_TO_FP16.
uint16_t F32ToF16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = (x >> 16) & 0x8000;
  uint32_t ax = x & 0x7fffffff;
  if (ax >= 0x7f800000) return sign | 0x7c00 | (ax > 0x7f800000 ? 0x200 : 0);  // inf, nan
  if (ax >= 0x477ff000) return sign | 0x7c00;  // rounds to >= 65520: overflow
  if (ax < 0x38800000) {                       // below 2^-14: a subnormal half (or zero)
    float v;
    std::memcpy(&v, &ax, 4);
    return sign | uint16_t(std::nearbyint(v * 16777216.0f));  // units of 2^-24
  }
  ax += 0xc8000fffu + ((ax >> 13) & 1);  // rebias the exponent by -112, round half to even
  return sign | uint16_t(ax >> 13);
}

struct Mapped {
  const uint8_t* data = nullptr;
  size_t size = 0;
};

Mapped Map(const std::string& path) {
  static std::map<std::string, Mapped> cache;
  if (auto it = cache.find(path); it != cache.end()) return it->second;
  const int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) Die("cannot open " + path);
  struct stat st;
  fstat(fd, &st);
  void* p = mmap(nullptr, st.st_size, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) Die("cannot map " + path);
  madvise(p, st.st_size, MADV_SEQUENTIAL);
  Mapped m{static_cast<const uint8_t*>(p), size_t(st.st_size)};
  cache[path] = m;
  return m;
}

void ReadRow(const uint8_t* src, const std::string& dtype, int64_t cols, float* out) {
  if (dtype == "F32") {
    std::memcpy(out, src, cols * 4);
  } else if (dtype == "BF16") {
    for (int64_t c = 0; c < cols; ++c) {
      uint16_t v;
      std::memcpy(&v, src + 2 * c, 2);
      const uint32_t bits = uint32_t(v) << 16;
      std::memcpy(out + c, &bits, 4);
    }
  } else if (dtype == "F16") {
    for (int64_t c = 0; c < cols; ++c) {
      uint16_t v;
      std::memcpy(&v, src + 2 * c, 2);
      out[c] = F16ToF32(v);
    }
  } else {
    Die("unsupported source dtype " + dtype);
  }
}

size_t RowBytes(const std::string& type, int64_t cols) {
  if (type == "F32") return cols * 4;
  if (type == "F16") return cols * 2;
  if (type == "Q8_0") return cols / 32 * 34;
  Die("unsupported output type " + type);
}

void WriteRow(const float* x, const std::string& type, int64_t cols, uint8_t* out) {
  if (type == "F32") {
    std::memcpy(out, x, cols * 4);
  } else if (type == "F16") {
    for (int64_t c = 0; c < cols; ++c) {
      const uint16_t h = F32ToF16(x[c]);
      std::memcpy(out + 2 * c, &h, 2);
    }
  } else {  // Q8_0
    for (int64_t b = 0; b < cols / 32; ++b) {
      const float* xb = x + 32 * b;
      uint8_t* ob = out + 34 * b;
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(xb[j]));
      const float d = amax / 127.0f;
      const float id = d != 0 ? 1.0f / d : 0.0f;
      const uint16_t dh = F32ToF16(d);
      std::memcpy(ob, &dh, 2);
      for (int j = 0; j < 32; ++j) ob[2 + j] = uint8_t(int8_t(std::roundf(xb[j] * id)));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) Die("usage: gguf_quantize OUT_FILE < jobs");
  const int out_fd = open(argv[1], O_WRONLY);
  if (out_fd < 0) Die(std::string("cannot open ") + argv[1]);
  std::string line;
  std::vector<float> row;
  std::vector<uint8_t> buf;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    std::istringstream in(line);
    std::string path, dtype, out_type;
    int64_t src_offset, rows, cols, perm_heads, dst_offset;
    if (!(in >> path >> src_offset >> dtype >> rows >> cols >> perm_heads >> out_type >>
          dst_offset)) {
      Die("bad job line: " + line);
    }
    if (out_type == "Q8_0" && cols % 32 != 0) Die("Q8_0 needs a multiple of 32 columns");
    const Mapped src = Map(path);
    const size_t in_row = cols * (dtype == "F32" ? 4 : 2);
    if (size_t(src_offset) + rows * in_row > src.size) Die("tensor past end of " + path);
    const int64_t head_rows = perm_heads > 0 ? rows / perm_heads : rows;
    if (perm_heads > 0 && (rows % perm_heads != 0 || head_rows % 2 != 0)) {
      Die("rows not divisible for the rope permutation");
    }
    const size_t out_row = RowBytes(out_type, cols);
    const int64_t rows_per_chunk = std::max<int64_t>(1, (8 << 20) / out_row);
    row.resize(cols);
    buf.resize(rows_per_chunk * out_row);
    for (int64_t r0 = 0; r0 < rows; r0 += rows_per_chunk) {
      const int64_t n = std::min(rows_per_chunk, rows - r0);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t r = r0 + i;
        int64_t s = r;
        if (perm_heads > 0) {
          const int64_t h = r / head_rows, within = r % head_rows, half = head_rows / 2;
          s = h * head_rows + (within % 2) * half + within / 2;
        }
        ReadRow(src.data + src_offset + s * in_row, dtype, cols, row.data());
        WriteRow(row.data(), out_type, cols, buf.data() + i * out_row);
      }
      const size_t bytes = n * out_row;
      size_t done = 0;
      while (done < bytes) {
        const ssize_t w =
            pwrite(out_fd, buf.data() + done, bytes - done, dst_offset + r0 * out_row + done);
        if (w <= 0) Die("write failed");
        done += w;
      }
    }
  }
  if (close(out_fd) != 0) Die("close failed");
  return 0;
}
