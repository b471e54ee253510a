#include "runtime/shape.h"

#include <sstream>

#include "runtime/error.h"

namespace meshrt {

Shape::Shape(std::initializer_list<int64_t> dims)
    : Shape(std::span<const int64_t>(dims.begin(), dims.size())) {}

Shape::Shape(std::span<const int64_t> dims) {
  MESHRT_CHECK(dims.size() <= static_cast<size_t>(kMaxDims),
               "shape has " << dims.size() << " dims; meshrt tensors have at most " << kMaxDims);
  ndim_ = static_cast<int>(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) d_[i] = dims[i];
}

int Shape::wrap_dim(int d) const {
  int w = d < 0 ? d + ndim_ : d;
  MESHRT_CHECK(w >= 0 && w < ndim_,
               "dim " << d << " out of range for a " << ndim_ << "-d shape " << str());
  return w;
}

int64_t Shape::at(int d) const { return d_[static_cast<size_t>(wrap_dim(d))]; }

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim_; ++i) {
    int64_t v = d_[static_cast<size_t>(i)];
    MESHRT_CHECK(v >= 0, "negative extent " << v << " in shape " << str());
    int64_t r;
    MESHRT_CHECK(!__builtin_mul_overflow(n, v, &r),
                 "element count of shape " << str() << " overflows int64");
    n = r;
  }
  return n;
}

void Shape::push_back(int64_t v) {
  MESHRT_CHECK(ndim_ < kMaxDims, "cannot add a dim to " << str() << ": max " << kMaxDims);
  d_[static_cast<size_t>(ndim_++)] = v;
}

std::string Shape::str() const {
  std::ostringstream os;
  os << "[";
  for (int i = 0; i < ndim_; ++i) os << (i ? ", " : "") << d_[static_cast<size_t>(i)];
  os << "]";
  return os.str();
}

bool Shape::operator==(const Shape& o) const {
  if (ndim_ != o.ndim_) return false;
  for (int i = 0; i < ndim_; ++i)
    if (d_[static_cast<size_t>(i)] != o.d_[static_cast<size_t>(i)]) return false;
  return true;
}

Shape contiguous_strides(const Shape& s) {
  Shape st = s;
  int64_t acc = 1;
  for (int i = s.ndim() - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= s[i] > 0 ? s[i] : 1;
  }
  return st;
}

}  // namespace meshrt
