// How a launch's messages name the settings its user gives: a process launch's environment
// variables and the command line's flags by default; the C API names its functions' arguments
// and config fields instead (LaunchNames::c_api()), as its callers set no variables or flags.
#pragma once

#include <string>

namespace meshrt {

struct LaunchNames {
  std::string world_size = "WORLD_SIZE";             // the number of ranks
  std::string rank = "RANK";                         // this process's rank
  std::string rendezvous_dir = "MESHRT_RENDEZVOUS";  // the file rendezvous's directory
  std::string master_addr = "MASTER_ADDR";           // the TCP rendezvous's host (rank 0's)
  std::string master_port = "MASTER_PORT";           // and its port
  std::string backend = "--backend";                 // the collective backend asked for
  // How to run <n> CPU ranks as threads of one process ("<n>" is replaced by the count).
  std::string cpu_threads = "--devices cpu:<n>";
  std::string cuda_devices = "e.g. --devices cuda:0-7";  // how to ask for CUDA devices

  // The C API's words: meshrt_comm_init_file / _tcp's arguments, meshrt_comm_config's fields.
  static LaunchNames c_api() {
    LaunchNames n;
    n.world_size = "nranks";
    n.rank = "rank";
    n.rendezvous_dir = "dir";
    n.master_addr = "host";
    n.master_port = "port";
    n.backend = "meshrt_comm_config.backend";
    n.cpu_threads = "meshrt_comm_init_all or meshrt_comm_init_rank (<n> ranks as threads)";
    n.cuda_devices = "set meshrt_comm_config.device_type = MESHRT_DEVICE_CUDA";
    return n;
  }
  std::string threads(int n) const {
    std::string s = cpu_threads;
    const size_t at = s.find("<n>");
    if (at != std::string::npos) s.replace(at, 3, std::to_string(n));
    return s;
  }
};

}  // namespace meshrt
