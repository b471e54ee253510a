// CRC-32C (Castagnoli), the checksum of checkpoint files: crc32c(crc32c(0, a), b) == crc32c(0, ab).
#pragma once

#include <cstddef>
#include <cstdint>

namespace meshrt {

uint32_t crc32c(uint32_t crc, const void* data, size_t n);

}  // namespace meshrt
