// Device: where a tensor lives and a rank runs (cpu or cuda:N); device-spec parsing.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "meshrt/export.h"

namespace meshrt {

enum class DeviceType : uint8_t { CPU = 0, CUDA = 1 };

struct MESHRT_API Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  static Device cpu(int i = 0) { return {DeviceType::CPU, i}; }
  static Device cuda(int i) { return {DeviceType::CUDA, i}; }
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool operator==(const Device&) const = default;
  std::string str() const;  // "cpu:0", "cuda:3"
};

// The most ranks one process runs as threads (a device spec's devices, meshrt_comm_init_all's n,
// meshrt_comm_init_rank's nranks).
constexpr int kMaxRanksPerProcess = 1024;

// The most processes one world may have (RANK / WORLD_SIZE, MPI, meshrt_comm_init_file / _tcp):
// rendezvous tables are sized by the world, so a larger one is refused before they are made.
constexpr int kMaxProcessRanks = 1 << 20;

// Parses a rank list: "cpu" (1 rank), "cpu:4" (4 host ranks), "cuda:0", "cuda:0-7", "cuda:0,2,5",
// "cuda:all" (every visible GPU; needs a working CUDA runtime). Each entry is one rank's device.
// Throws meshrt::Error saying what is accepted.
MESHRT_API std::vector<Device> parse_devices(std::string_view spec);

// Whether CUDA devices can be used now; when not, why (not built / no driver / no device).
MESHRT_API bool cuda_available(std::string* why = nullptr);
// Usable CUDA devices (0 in a build without CUDA or without a usable driver).
MESHRT_API int cuda_device_count();
// What the device family's libraries report ("CUDA runtime 13.0, driver ..., cuda:0 NAME
// (sm_90) ..."); "" for CUDA in a build without it.
MESHRT_API std::string device_versions(DeviceType type);

}  // namespace meshrt
